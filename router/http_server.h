// The router's HTTP front end (cpp-httplib): the OpenAI-compatible /v1/completions,
// /v1/chat/completions (with SSE streaming) and /v1/models, /health for load balancers, and
// Prometheus /metrics. Every request is served by the same Router as the gRPC API.
#pragma once

#include <memory>
#include <string>
#include <thread>

#include "common/status.h"
#include "router/router.h"

namespace httplib {
class Server;
struct Request;
struct Response;
}  // namespace httplib

namespace pdserve::router {

class HttpServer {
 public:
  explicit HttpServer(Router& router, size_t max_body_bytes = 16 << 20);
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

  Router& router_;
  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
};

}  // namespace pdserve::router
