#include "router/registry_service.h"

#include <algorithm>
#include <chrono>

#include "common/secrets.h"
#include "router/router.h"

namespace pdserve::router {

RegistryService::RegistryService(WorkerRegistry& registry, std::vector<std::string> model_names, KvMode kv_mode,
                                 std::vector<std::string> cluster_tokens, bool require_client_certificate)
    : registry_(registry), model_names_(std::move(model_names)), kv_mode_(kv_mode),
      cluster_tokens_(std::move(cluster_tokens)), require_client_certificate_(require_client_certificate) {}

grpc::Status RegistryService::authorize(grpc::ServerContext* ctx) const {
  // The TLS handshake verified a certificate the client presented; a peer is authenticated when
  // it presented one.
  if (require_client_certificate_ && !ctx->auth_context()->IsPeerAuthenticated())
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                        "this router needs workers to present a certificate signed by its --tls-ca (start the worker "
                        "with --tls-cert, --tls-key and --tls-ca)");
  if (cluster_tokens_.empty()) return grpc::Status::OK;
  const auto& md = ctx->client_metadata();
  const auto it = md.find(kClusterTokenMetadata);
  if (it != md.end()) {
    const std::string_view token(it->second.data(), it->second.size());
    bool ok = false;
    for (const std::string& t : cluster_tokens_) ok |= secret_equal(token, t);
    if (ok) return grpc::Status::OK;
  }
  return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                      it == md.end() ? "this router needs the cluster token to register (start the worker with "
                                       "--cluster-token-file)"
                                     : "the cluster token is not this router's");
}

grpc::Status RegistryService::Register(grpc::ServerContext* ctx, const worker::RegisterRequest* request,
                                       worker::RegisterResponse* response) {
  if (grpc::Status auth = authorize(ctx); !auth.ok()) return auth;
  const bool aggregated = kv_mode_ == KvMode::kAggregated;
  const worker::Role role = request->role();
  if (aggregated ? role != worker::ROLE_AGGREGATED : role != worker::ROLE_PREFILL && role != worker::ROLE_DECODE)
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        "this router (mode " + std::string(kv_mode_name(kv_mode_)) + ") does not use " + role_name(role) + " workers");
  if (!request->model().empty() &&
      std::find(model_names_.begin(), model_names_.end(), request->model()) == model_names_.end())
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        "this router serves " + (model_names_.empty() ? std::string("?") : model_names_.front()) +
                            ", not " + request->model());
  if (kv_mode_ == KvMode::kPullHost && role == worker::ROLE_PREFILL && request->host_kv_blocks() <= 0)
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        "this router (mode pull-host) needs prefill workers with a host KV tier (--host-kv-bytes)");
  const Status s = registry_.register_worker({request->address(), role}, request->worker_id());
  if (!s.ok()) return to_grpc(s);
  const RegistryOptions& o = registry_.options();
  response->set_heartbeat_interval_ms(std::chrono::duration_cast<std::chrono::milliseconds>(o.heartbeat_interval).count());
  response->set_expiry_ms(std::chrono::duration_cast<std::chrono::milliseconds>(o.heartbeat_timeout).count());
  return grpc::Status::OK;
}

grpc::Status RegistryService::Heartbeat(grpc::ServerContext* ctx, const worker::HeartbeatRequest* request,
                                        worker::HeartbeatResponse* response) {
  if (grpc::Status auth = authorize(ctx); !auth.ok()) return auth;
  response->set_known(registry_.heartbeat(request->address()));
  return grpc::Status::OK;
}

grpc::Status RegistryService::Deregister(grpc::ServerContext* ctx, const worker::DeregisterRequest* request,
                                         worker::DeregisterResponse* response) {
  if (grpc::Status auth = authorize(ctx); !auth.ok()) return auth;
  response->set_found(registry_.deregister(request->address()));
  return grpc::Status::OK;
}

}  // namespace pdserve::router
