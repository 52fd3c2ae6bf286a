// A worker's registration with a router (`--router HOST:PORT`): on its own thread it calls
// Registry.Register with what the worker serves, then Registry.Heartbeat every interval (the
// router's advice unless set); it registers again when the router no longer knows it (the router
// restarted, or dropped it after missed heartbeats) and keeps retrying while the router is
// unreachable. stop() deregisters, so a worker leaving cleanly is dropped at once. The worker
// serves whether or not it is registered.
#pragma once

#include <grpcpp/security/credentials.h>

#include <atomic>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "common/clock.h"
#include "proto/worker.grpc.pb.h"

namespace pdserve::worker {

struct RegistrationOptions {
  std::string router;                  // The router's gRPC HOST:PORT.
  Duration heartbeat_interval{0};      // 0: what the router asks for.
  Duration retry_interval = std::chrono::seconds(1);  // Between failed Register calls.
  Duration rpc_timeout = std::chrono::seconds(2);
  std::string cluster_token;  // Sent with every Registry call when set (--cluster-token-file).
  // How to dial the router: plaintext, or mutual TLS (--tls-ca; common/tls.h).
  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::InsecureChannelCredentials();
  // With TLS: the name the router's certificate is checked against, instead of the host of
  // `router` (which RouterSet resolved to an address, e.g. a router pod's IP).
  std::string tls_server_name;
};

class RouterRegistration {
 public:
  // `describe` fills a RegisterRequest (address, role, model, KV) each time one is sent.
  RouterRegistration(RegistrationOptions options, std::function<RegisterRequest()> describe);
  ~RouterRegistration();
  RouterRegistration(const RouterRegistration&) = delete;
  RouterRegistration& operator=(const RouterRegistration&) = delete;

  void start();
  // Stops heartbeating and deregisters (best effort, bounded by rpc_timeout).
  void stop();
  // Whether the router has this worker registered (its last Register or Heartbeat said so).
  bool registered() const { return registered_.load(); }

 private:
  void run();
  void add_token(grpc::ClientContext& ctx) const;

  const RegistrationOptions options_;
  const std::function<RegisterRequest()> describe_;
  std::unique_ptr<Registry::Stub> stub_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  std::atomic<bool> registered_{false};
  std::thread thread_;
};

}  // namespace pdserve::worker
