// What UCX offers this process: the transport resources (transport/device pairs) of a ucp
// context created the way kvtransfer's transport creates one (RMA, this process's UCX_*
// environment), and whether any of them is RDMA. Workers log them at start and, with
// --require-rdma, refuse to become ready without RDMA, so a misconfigured fabric (no RDMA
// device in the pod, a UCX built without verbs, UCX_TLS narrowed to tcp) is a clear not-ready
// reason instead of a silent 200-500x slower TCP path.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace pdserve::kvtransfer {

struct UcxResource {
  std::string transport;  // UCX's name: "tcp", "rc_mlx5", "posix", "cuda_ipc", ...
  std::string device;     // "eth0", "mlx5_0:1", "memory", ...
  bool operator==(const UcxResource&) const = default;
};

// The resources listed by ucp_context_print_info's text ("#  resource 1 : md 1 dev 1 flags --
// tcp/eth0"); other lines are ignored.
std::vector<UcxResource> parse_ucx_resources(std::string_view context_info);

// RDMA transports: InfiniBand/RoCE reliable and dynamic connections (rc, dc: verbs and mlx5),
// mlx5's gga and AWS EFA's srd. UD (datagrams, no RDMA read or write), shared memory, cma, tcp,
// self and GPU IPC are not.
bool is_rdma_transport(std::string_view transport);

// "transport/device" for each resource, comma-separated (for logs and not-ready reasons).
std::string describe_ucx_resources(const std::vector<UcxResource>& resources);

// Creates a ucp context from the environment and lists its resources.
StatusOr<std::vector<UcxResource>> query_ucx_resources();

}  // namespace pdserve::kvtransfer
