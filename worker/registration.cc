#include "worker/registration.h"

#include <grpcpp/grpcpp.h>

#include "common/logging.h"
#include "common/secrets.h"

namespace pdserve::worker {
namespace {

std::chrono::system_clock::time_point deadline_in(Duration d) {
  return std::chrono::system_clock::now() + std::chrono::duration_cast<std::chrono::system_clock::duration>(d);
}

}  // namespace

RouterRegistration::RouterRegistration(RegistrationOptions options, std::function<RegisterRequest()> describe)
    : options_(std::move(options)), describe_(std::move(describe)) {
  grpc::ChannelArguments args;
  // Find a restarted router quickly instead of gRPC's default back-off of up to 2 min.
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  if (!options_.tls_server_name.empty()) args.SetSslTargetNameOverride(options_.tls_server_name);
  stub_ = Registry::NewStub(grpc::CreateCustomChannel(options_.router, options_.credentials, args));
}

RouterRegistration::~RouterRegistration() { stop(); }

void RouterRegistration::start() {
  std::lock_guard lock(mu_);
  if (thread_.joinable()) return;
  thread_ = std::thread([this] { run(); });
}

void RouterRegistration::stop() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void RouterRegistration::add_token(grpc::ClientContext& ctx) const {
  if (!options_.cluster_token.empty()) ctx.AddMetadata(kClusterTokenMetadata, options_.cluster_token);
}

void RouterRegistration::run() {
  bool registered = false;
  bool warned = false;  // One warning per outage, not one per retry.
  std::string address;
  Duration interval = options_.retry_interval;
  while (true) {
    if (!registered) {
      const RegisterRequest req = describe_();
      address = req.address();
      RegisterResponse resp;
      grpc::ClientContext ctx;
      ctx.set_deadline(deadline_in(options_.rpc_timeout));
      add_token(ctx);
      const grpc::Status s = stub_->Register(&ctx, req, &resp);
      if (s.ok()) {
        registered = true;
        registered_ = true;
        warned = false;
        interval = options_.heartbeat_interval.count() > 0 ? options_.heartbeat_interval
                   : resp.heartbeat_interval_ms() > 0       ? Duration(std::chrono::milliseconds(resp.heartbeat_interval_ms()))
                                                            : Duration(std::chrono::seconds(1));
        PD_LOG_INFO("registered {} with router {} (heartbeat every {} ms, dropped after {} ms without one)", address,
                    options_.router, std::chrono::duration_cast<std::chrono::milliseconds>(interval).count(),
                    resp.expiry_ms());
      } else {
        if (!warned) PD_LOG_WARN("cannot register with router {}: {}; retrying", options_.router, s.error_message());
        warned = true;
        interval = options_.retry_interval;
      }
    } else {
      HeartbeatRequest req;
      req.set_address(address);
      HeartbeatResponse resp;
      grpc::ClientContext ctx;
      ctx.set_deadline(deadline_in(std::min(options_.rpc_timeout, std::max<Duration>(interval, std::chrono::milliseconds(100)))));
      add_token(ctx);
      const grpc::Status s = stub_->Heartbeat(&ctx, req, &resp);
      if (s.ok() && !resp.known()) {
        PD_LOG_WARN("router {} does not know {} any more; registering again", options_.router, address);
        registered = false;
        continue;
      }
      if (!s.ok() && !warned) PD_LOG_WARN("heartbeat to router {} failed: {}", options_.router, s.error_message());
      warned = !s.ok();
    }
    registered_ = registered;
    std::unique_lock lock(mu_);
    if (cv_.wait_for(lock, interval, [this] { return stopping_; })) break;
  }
  registered_ = false;
  if (registered) {
    DeregisterRequest req;
    req.set_address(address);
    DeregisterResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(deadline_in(options_.rpc_timeout));
    add_token(ctx);
    const grpc::Status s = stub_->Deregister(&ctx, req, &resp);
    if (s.ok()) PD_LOG_INFO("deregistered {} from router {}", address, options_.router);
  }
}

}  // namespace pdserve::worker
