#include "worker/probe_server.h"

#include <httplib.h>

#include <chrono>

#include "absl/strings/str_cat.h"

namespace pdserve::worker {
namespace {

void answer(httplib::Response& res, const ProbeAnswer& a) {
  res.status = a.ok ? 200 : 503;
  res.set_content(a.reason + "\n", "text/plain");
}

}  // namespace

ProbeServer::ProbeServer() : server_(std::make_unique<httplib::Server>()) {}

StatusOr<std::unique_ptr<ProbeServer>> ProbeServer::start(const std::string& host, int port,
                                                          const WorkerHealth& health) {
  std::unique_ptr<ProbeServer> s(new ProbeServer());
  httplib::Server& http = *s->server_;
  // Probes are tiny and few: two threads, so one slow scrape never delays a probe.
  http.new_task_queue = [] { return new httplib::ThreadPool(2); };
  // A keep-alive scraper would hold one of the two threads between scrapes; kubelet probes must
  // not wait behind it.
  http.set_keep_alive_max_count(1);
  http.Get("/livez", [&health](const httplib::Request&, httplib::Response& res) { answer(res, health.live()); });
  http.Get("/startupz", [&health](const httplib::Request&, httplib::Response& res) { answer(res, health.startup()); });
  http.Get("/readyz", [&health](const httplib::Request&, httplib::Response& res) { answer(res, health.ready()); });
  http.Get("/metrics", [&health](const httplib::Request&, httplib::Response& res) {
    res.set_content(health.metrics_text(), "text/plain; version=0.0.4");
  });
  const int bound = port == 0 ? http.bind_to_any_port(host) : (http.bind_to_port(host, port) ? port : -1);
  if (bound <= 0) return absl::UnavailableError(absl::StrCat("probe server: cannot listen on ", host, ":", port));
  s->port_ = bound;
  s->thread_ = std::thread([server = s->server_.get()] { server->listen_after_bind(); });
  // httplib's stop() does nothing before the listen loop runs, so a server destroyed before then
  // would join a thread that never ends (a worker failing to load its model right after).
  for (int i = 0; i < 5000 && !http.is_running(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  return s;
}

ProbeServer::~ProbeServer() {
  server_->stop();
  if (thread_.joinable()) thread_.join();
}

}  // namespace pdserve::worker
