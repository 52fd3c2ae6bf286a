#include "worker/router_set.h"

#include <netdb.h>
#include <sys/socket.h>

#include <algorithm>
#include <set>

#include "absl/strings/str_cat.h"
#include "common/host_port.h"
#include "common/logging.h"

namespace pdserve::worker {

StatusOr<std::vector<std::string>> resolve_host_port(const std::string& host_port) {
  StatusOr<HostPort> split = split_host_port(host_port);
  if (!split.ok()) return absl::InvalidArgumentError(absl::StrCat("router address ", split.status().message()));
  const std::string& host = split->host;
  const std::string& port = split->port;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (const int rc = getaddrinfo(host.c_str(), port.c_str(), &hints, &found); rc != 0)
    return absl::UnavailableError(absl::StrCat("cannot resolve ", host, ": ", gai_strerror(rc)));
  std::set<std::string> out;
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    char name[NI_MAXHOST];
    if (getnameinfo(a->ai_addr, a->ai_addrlen, name, sizeof name, nullptr, 0, NI_NUMERICHOST) != 0) continue;
    out.insert(absl::StrCat(bracket_host(name), ":", port));
  }
  freeaddrinfo(found);
  if (out.empty()) return absl::UnavailableError(absl::StrCat(host, " resolves to no address"));
  return std::vector<std::string>(out.begin(), out.end());
}

RouterSet::RouterSet(RegistrationOptions options, std::function<RegisterRequest()> describe, RouterResolver resolve,
                     Duration resolve_interval)
    : options_(std::move(options)),
      describe_(std::move(describe)),
      resolve_(std::move(resolve)),
      resolve_interval_(resolve_interval) {}

RouterSet::~RouterSet() { stop(); }

void RouterSet::start() {
  std::lock_guard lock(mu_);
  if (thread_.joinable() || stopping_) return;
  thread_ = std::thread([this] { run(); });
}

void RouterSet::stop() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  std::map<std::string, std::unique_ptr<RouterRegistration>> gone;
  {
    std::lock_guard lock(mu_);
    gone.swap(registrations_);
  }
  for (auto& [address, r] : gone) r->stop();
}

bool RouterSet::registered() const {
  std::lock_guard lock(mu_);
  return std::any_of(registrations_.begin(), registrations_.end(), [](const auto& r) { return r.second->registered(); });
}

std::vector<std::string> RouterSet::routers() const {
  std::lock_guard lock(mu_);
  std::vector<std::string> out;
  for (const auto& [address, r] : registrations_) out.push_back(address);
  return out;
}

void RouterSet::apply(const std::vector<std::string>& addresses) {
  std::vector<std::unique_ptr<RouterRegistration>> stale;
  {
    std::lock_guard lock(mu_);
    if (stopping_) return;
    for (auto it = registrations_.begin(); it != registrations_.end();) {
      if (std::find(addresses.begin(), addresses.end(), it->first) == addresses.end()) {
        PD_LOG_INFO("router {} no longer behind {}: leaving it", it->first, options_.router);
        stale.push_back(std::move(it->second));
        it = registrations_.erase(it);
      } else {
        ++it;
      }
    }
    for (const std::string& address : addresses) {
      if (registrations_.count(address)) continue;
      RegistrationOptions o = options_;
      o.router = address;
      auto r = std::make_unique<RouterRegistration>(o, describe_);
      r->start();
      registrations_.emplace(address, std::move(r));
    }
  }
  for (auto& r : stale) r->stop();  // Deregisters, outside the lock.
}

void RouterSet::run() {
  bool warned = false;
  while (true) {
    StatusOr<std::vector<std::string>> addresses = resolve_(options_.router);
    if (addresses.ok()) {
      apply(*addresses);
      warned = false;
    } else if (!warned) {
      // Keeps the registrations it has: a DNS hiccup is no reason to leave a router.
      PD_LOG_WARN("{}; retrying", std::string(addresses.status().message()));
      warned = true;
    }
    std::unique_lock lock(mu_);
    if (cv_.wait_for(lock, addresses.ok() ? resolve_interval_ : options_.retry_interval, [this] { return stopping_; }))
      break;
  }
}

}  // namespace pdserve::worker
