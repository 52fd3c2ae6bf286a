// ProbeServer: the worker's probe endpoints (`--probe-port`) on a small HTTP server of its own
// threads, so a kubelet's probes never queue behind requests and answer while the model is
// still loading: GET /livez, /startupz, /readyz (200, or 503 with the reason as the body) and
// /metrics (WorkerHealth's Prometheus text).
#pragma once

#include <memory>
#include <string>
#include <thread>

#include "common/status.h"
#include "worker/worker_health.h"

namespace httplib {
class Server;
}

namespace pdserve::worker {

class ProbeServer {
 public:
  // Listens on host:port (0: any free port) and serves until destroyed.
  static StatusOr<std::unique_ptr<ProbeServer>> start(const std::string& host, int port, const WorkerHealth& health);
  ~ProbeServer();
  ProbeServer(const ProbeServer&) = delete;
  ProbeServer& operator=(const ProbeServer&) = delete;

  int port() const { return port_; }

 private:
  ProbeServer();
  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
  int port_ = 0;
};

}  // namespace pdserve::worker
