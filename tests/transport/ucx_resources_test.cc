// The RDMA self-check's parts: UCX's resource listing parsed from ucp_context_print_info's text
// (a capture of UCX 1.13 on a machine with mlx5 devices, and this machine's live context), and
// which transports count as RDMA.
#include <gtest/gtest.h>

#include <cstdlib>

#include "kvtransfer/ucx/ucx_resources.h"

namespace pdserve::kvtransfer {
namespace {

constexpr const char* kWithMlx5 = R"(#
# UCP context
#
#     component 0  :  self
#     component 1  :  tcp
#     component 4  :  ib
#
#            md 0  :  component 0  self
#            md 1  :  component 1  tcp
#            md 2  :  component 4  mlx5_0
#
#      resource 0  :  md 0  dev 0  flags -- self/memory0
#      resource 1  :  md 1  dev 1  flags -- tcp/eth0
#      resource 2  :  md 2  dev 2  flags -- rc_mlx5/mlx5_0:1
#      resource 3  :  md 2  dev 2  flags -- dc_mlx5/mlx5_0:1
#      resource 4  :  md 2  dev 2  flags -- ud_verbs/mlx5_0:1
#
)";

TEST(UcxResources, ParsesTheResourceLines) {
  const std::vector<UcxResource> r = parse_ucx_resources(kWithMlx5);
  const std::vector<UcxResource> want = {{"self", "memory0"},
                                         {"tcp", "eth0"},
                                         {"rc_mlx5", "mlx5_0:1"},
                                         {"dc_mlx5", "mlx5_0:1"},
                                         {"ud_verbs", "mlx5_0:1"}};
  EXPECT_EQ(r, want);
  EXPECT_EQ(describe_ucx_resources(r), "self/memory0, tcp/eth0, rc_mlx5/mlx5_0:1, dc_mlx5/mlx5_0:1, ud_verbs/mlx5_0:1");
  EXPECT_TRUE(parse_ucx_resources("# UCP context\n#   md 0 : component 0 self\n").empty());
  EXPECT_TRUE(parse_ucx_resources("#  resource 0 : md 0 dev 0 flags -- noslash\n").empty());
  EXPECT_EQ(describe_ucx_resources({}), "none");
}

TEST(UcxResources, RdmaTransportsTable) {
  for (const char* t : {"rc_mlx5", "rc_verbs", "dc_mlx5", "srd", "gga_mlx5"})
    EXPECT_TRUE(is_rdma_transport(t)) << t;
  for (const char* t : {"ud_verbs", "ud_mlx5", "tcp", "self", "posix", "sysv", "cma", "knem", "xpmem", "cuda_ipc", "cuda_copy", "rocm_ipc",
                        "rocm_copy", "gdr_copy", ""})
    EXPECT_FALSE(is_rdma_transport(t)) << t;
}

// This machine's UCX (no RDMA device) over tcp only: tcp is listed, nothing counts as RDMA.
TEST(UcxResources, LiveContextOverTcpHasNoRdma) {
  setenv("UCX_TLS", "tcp", 1);
  StatusOr<std::vector<UcxResource>> r = query_ucx_resources();
  unsetenv("UCX_TLS");
  ASSERT_TRUE(r.ok()) << r.status().message();
  ASSERT_FALSE(r->empty());
  for (const UcxResource& res : *r) {
    EXPECT_EQ(res.transport, "tcp") << describe_ucx_resources(*r);
    EXPECT_FALSE(is_rdma_transport(res.transport));
  }
}

}  // namespace
}  // namespace pdserve::kvtransfer
