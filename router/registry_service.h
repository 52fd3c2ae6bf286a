// The gRPC Registry service (proto/worker.proto) a router serves for workers started with
// --router: Register checks the worker against what this router serves (its model, and a role
// the mode uses) and lists it in the WorkerRegistry; Heartbeat renews it; Deregister unlists it.
#pragma once

#include <string>
#include <vector>

#include "proto/worker.grpc.pb.h"
#include "router/kv_mode.h"
#include "router/worker_registry.h"

namespace pdserve::router {

class RegistryService final : public worker::Registry::Service {
 public:
  // `model_names`: the served model's name and accepted aliases; `kv_mode`: "push", "pull" (prefill
  // and decode workers) or "aggregated". `cluster_tokens` (--cluster-token-file; several while one
  // is rotated): when not empty, every Registry call needs one of them in the
  // x-pdserve-cluster-token metadata, else UNAUTHENTICATED. `require_client_certificate` (mutual
  // TLS, --tls-ca): every Registry call must come over a connection whose client presented a
  // certificate the CA signed, else UNAUTHENTICATED; the port also serves clients, who need none,
  // so it is checked here rather than in the TLS handshake.
  RegistryService(WorkerRegistry& registry, std::vector<std::string> model_names, KvMode kv_mode,
                  std::vector<std::string> cluster_tokens = {}, bool require_client_certificate = false);

  grpc::Status Register(grpc::ServerContext* ctx, const worker::RegisterRequest* request,
                        worker::RegisterResponse* response) override;
  grpc::Status Heartbeat(grpc::ServerContext* ctx, const worker::HeartbeatRequest* request,
                         worker::HeartbeatResponse* response) override;
  grpc::Status Deregister(grpc::ServerContext* ctx, const worker::DeregisterRequest* request,
                          worker::DeregisterResponse* response) override;

 private:
  WorkerRegistry& registry_;
  const std::vector<std::string> model_names_;
  // OK when the call carries an accepted cluster token (or none is required) over a connection
  // with a verified client certificate (when one is required).
  grpc::Status authorize(grpc::ServerContext* ctx) const;

  const KvMode kv_mode_;
  const std::vector<std::string> cluster_tokens_;
  const bool require_client_certificate_;
};

}  // namespace pdserve::router
