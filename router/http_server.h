// The router's HTTP front end (cpp-httplib): the OpenAI-compatible /v1/completions,
// /v1/chat/completions (with SSE streaming; n samples and batched prompts as concurrent router
// requests, router/parallel_samples.h), /v1/models, vLLM's /v1/tokenize and /v1/detokenize, /health for load balancers, and
// Prometheus /metrics. Every request is served by the same Router as the gRPC API. Connections
// are served by a bounded pool (bounded_task_queue.h): beyond it, 429 like a full admission queue.
// Over HTTPS when the router has --tls-cert (clients are not asked for certificates).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include "common/status.h"
#include "router/api_keys.h"
#include "router/router.h"

namespace httplib {
class Server;
struct Request;
struct Response;
}  // namespace httplib

namespace pdserve {
struct TlsConfig;
}  // namespace pdserve

namespace pdserve::router {

struct HttpServerOptions {
  size_t max_body_bytes = 16 << 20;
  // Connections served at once; the router gives --max-running + --max-waiting + a few for
  // /health and /metrics, so every request its admission could take has a thread.
  size_t threads = 8;
  // Connections waiting for a thread; beyond, generation requests get 429 at once.
  size_t max_queued = 0;
  // An idle keep-alive connection holds a thread: it is closed after this long, or after this
  // many requests.
  int keep_alive_timeout_s = 2;
  int keep_alive_max_requests = 100;
  // Client keys (must outlive the server); none: open. /health is always open, /metrics unless
  // metrics_need_key.
  const ApiKeys* api_keys = nullptr;
  bool metrics_need_key = false;
  // Serve HTTPS with this certificate and key (must outlive the constructor); null: plain HTTP.
  const TlsConfig* tls = nullptr;
};

class HttpServer {
 public:
  HttpServer(Router& router, HttpServerOptions options);
  ~HttpServer();

  // Binds host:port (port 0: any free one) and returns the bound port.
  StatusOr<int> bind(const std::string& host, int port);
  // Serves on a background thread until stop().
  void start();
  // Stops serving and joins the thread.
  void stop();

 private:
  // Serves /v1/completions (chat = false) and /v1/chat/completions.
  void handle_generate(const httplib::Request& http_request, bool chat, httplib::Response& res);
  // vLLM's /v1/tokenize and /v1/detokenize.
  void handle_tokenize(const httplib::Request& http_request, httplib::Response& res);
  void handle_detokenize(const httplib::Request& http_request, httplib::Response& res);
  // NotFound (as Router::validate words it) unless `name` is empty or names the served model.
  Status check_model(const std::string& name) const;

  Router& router_;
  const ApiKeys* api_keys_;  // May be null: no keys.
  std::unique_ptr<httplib::Server> server_;
  std::atomic<uint64_t> next_id_{0};  // Response ids: a process-random prefix and this count.
  const uint64_t id_salt_;
  int listen_socket_ = -1;  // Seen by the socket-options hook, for the listen backlog.
  std::thread thread_;
};

}  // namespace pdserve::router
