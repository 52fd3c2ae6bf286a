// RouterSet: a worker's registrations with every router behind one `--router HOST:PORT`. In
// Kubernetes the routers sit behind a headless Service whose name resolves to each router
// pod's address, and each router keeps its own registry, so a worker registers with all of
// them: the name is resolved again every resolve_interval, a new address gets its own
// RouterRegistration and a vanished one is stopped (deregistered). A numeric HOST is one router.
#pragma once

#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/status.h"
#include "worker/registration.h"

namespace pdserve::worker {

// The HOST:PORT addresses `host_port`'s host resolves to (IPv6 in brackets), sorted, unique.
using RouterResolver = std::function<StatusOr<std::vector<std::string>>(const std::string& host_port)>;

// The system resolver (getaddrinfo, TCP addresses of either family).
StatusOr<std::vector<std::string>> resolve_host_port(const std::string& host_port);

class RouterSet {
 public:
  // `options.router` is the HOST:PORT to resolve; each registration gets a copy of `options`
  // with its own address. `describe` fills every RegisterRequest.
  RouterSet(RegistrationOptions options, std::function<RegisterRequest()> describe,
            RouterResolver resolve = resolve_host_port, Duration resolve_interval = std::chrono::seconds(5));
  ~RouterSet();
  RouterSet(const RouterSet&) = delete;
  RouterSet& operator=(const RouterSet&) = delete;

  void start();
  // Stops every registration (each deregisters).
  void stop();
  // Whether some router has this worker registered.
  bool registered() const;
  // The router addresses registered with now (resolved), sorted.
  std::vector<std::string> routers() const;

 private:
  void run();
  // Starts registrations for new addresses and stops those no longer resolved.
  void apply(const std::vector<std::string>& addresses);

  const RegistrationOptions options_;
  const std::function<RegisterRequest()> describe_;
  const RouterResolver resolve_;
  const Duration resolve_interval_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  std::map<std::string, std::unique_ptr<RouterRegistration>> registrations_;
  std::thread thread_;
};

}  // namespace pdserve::worker
