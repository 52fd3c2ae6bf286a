#include "router/http_server.h"

#include <httplib.h>
#include <sys/socket.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <random>

#include "common/logging.h"
#include "common/tcp_state.h"
#include "common/tls.h"
#include "router/bounded_task_queue.h"
#include "router/openai_api.h"

namespace pdserve::router {
namespace {

using nlohmann::json;

// As the kernel allows (net.core.somaxconn caps it).
constexpr int kListenBacklog = 4096;

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

void send_error(httplib::Response& res, const Status& s) {
  HttpError e = http_error(s);
  res.status = e.status;
  res.set_content(e.body.dump(), "application/json");
}

// An HTTPS server for `tls` (checked by load_tls), else a plain one.
std::unique_ptr<httplib::Server> make_server(const TlsConfig* tls) {
  if (tls == nullptr) return std::make_unique<httplib::Server>();
  return std::make_unique<httplib::SSLServer>([tls](SSL_CTX& ctx) {
    const Status s = configure_ssl_server(ctx, *tls);
    if (!s.ok()) PD_LOG_ERROR("HTTPS: {}", std::string(s.message()));
    return s.ok();
  });
}

}  // namespace

HttpServer::HttpServer(Router& router, HttpServerOptions options)
    : router_(router), api_keys_(options.api_keys), server_(make_server(options.tls)), id_salt_(std::random_device{}()) {
  server_->set_payload_max_length(options.max_body_bytes);
  server_->new_task_queue = [options] { return new BoundedTaskQueue(options.threads, options.max_queued); };
  server_->set_keep_alive_timeout(options.keep_alive_timeout_s);
  server_->set_keep_alive_max_count(size_t(options.keep_alive_max_requests));
  // Debian's cpp-httplib is built with a listen backlog of 5: a burst of clients overflows it and
  // their SYNs are retried a second later. The hook sees the listening socket before bind();
  // bind() raises its backlog once httplib has called listen().
  server_->set_socket_options([this](int sock) {
    httplib::default_socket_options(sock);
    listen_socket_ = sock;
  });
  // API keys: checked before routing, so no handler runs for a request without one.
  server_->set_pre_routing_handler([options](const httplib::Request& req, httplib::Response& res) {
    if (options.api_keys == nullptr || !options.api_keys->required() || req.path == "/health" ||
        (req.path == "/metrics" && !options.metrics_need_key))
      return httplib::Server::HandlerResponse::Unhandled;
    if (options.api_keys->allows(req.get_header_value("Authorization"))) return httplib::Server::HandlerResponse::Unhandled;
    res.status = 401;
    res.set_header("WWW-Authenticate", "Bearer");
    const bool given = req.has_header("Authorization");
    json body = {{"error",
                  {{"message", given ? "Incorrect API key provided." : "You didn't provide an API key: send Authorization: Bearer KEY."},
                   {"type", "invalid_request_error"}, {"param", nullptr}, {"code", "invalid_api_key"}}}};
    res.set_content(body.dump(), "application/json");
    return httplib::Server::HandlerResponse::Handled;
  });
  server_->Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    const bool ok = router_.ready();
    res.status = ok ? 200 : 503;
    res.set_content(ok ? "ok\n" : "no workers\n", "text/plain");
  });
  server_->Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(router_.metrics_text(), "text/plain; version=0.0.4");
  });
  server_->Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
    const v1::ModelInfo m = router_.model_info();
    json model = {{"id", m.name()}, {"object", "model"}, {"created", 0}, {"owned_by", "pdserve"}, {"max_model_len", m.max_context()}};
    res.set_content(json{{"object", "list"}, {"data", json::array({model})}}.dump(), "application/json");
  });
  server_->Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
    handle_generate(req, /*chat=*/false, res);
  });
  server_->Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) {
    handle_generate(req, /*chat=*/true, res);
  });
  server_->set_error_handler([](const httplib::Request&, httplib::Response& res) {
    if (!res.body.empty()) return;
    // 413 (body too large), 404 (no such path), ...: OpenAI-style bodies for those too.
    json body = {{"error", {{"message", "HTTP " + std::to_string(res.status)}, {"type", "invalid_request_error"}, {"param", nullptr}, {"code", nullptr}}}};
    res.set_content(body.dump(), "application/json");
  });
}

HttpServer::~HttpServer() { stop(); }

StatusOr<int> HttpServer::bind(const std::string& host, int port) {
  if (!server_->is_valid()) return absl::InvalidArgumentError("HTTPS: the certificate and key cannot be used");
  const int bound = port == 0 ? server_->bind_to_any_port(host) : (server_->bind_to_port(host, port) ? port : -1);
  if (bound <= 0) return absl::UnavailableError(absl::StrCat("HTTP: cannot bind ", host, ":", port));
  if (listen_socket_ >= 0 && ::listen(listen_socket_, kListenBacklog) != 0)
    PD_LOG_WARN("HTTP: cannot raise the listen backlog to {}: {}", kListenBacklog, std::strerror(errno));
  return bound;
}

void HttpServer::start() {
  thread_ = std::thread([this] { server_->listen_after_bind(); });
}

void HttpServer::stop() {
  server_->stop();
  if (thread_.joinable()) thread_.join();
}

void HttpServer::handle_generate(const httplib::Request& http_request, bool chat, httplib::Response& res) {
  if (BoundedTaskQueue::in_overflow()) {
    res.set_header("Connection", "close");
    return send_error(res, absl::ResourceExhaustedError(
                               "overloaded: every HTTP connection slot is busy (--max-running + --max-waiting)"));
  }
  auto parsed = parse_openai_request(http_request.body, chat, router_.model().chat_template);
  if (!parsed.ok()) return send_error(res, parsed.status());
  auto req = std::make_shared<OpenAiRequest>(std::move(*parsed));
  apply_openai_defaults(router_.model_info().sampling_defaults(), req->request.mutable_sampling());
  // The client's namespace for request ids (the pre-routing check already let it in).
  const std::string client =
      api_keys_ != nullptr ? api_keys_->client_of(http_request.get_header_value("Authorization")).value_or("") : "";
  if (chat && !req->max_tokens_given) {
    // OpenAI's chat default: as much as the context leaves.
    v1::GenerateRequest probe = req->request;
    probe.mutable_sampling()->set_max_tokens(1);
    auto p = router_.validate(probe);
    if (!p.ok()) return send_error(res, p.status());
    req->request.mutable_sampling()->set_max_tokens(std::max<int>(1, router_.model_info().max_context() - int(p->size())));
  }
  // Checked here so that a bad request gets its HTTP status even when it asked for a stream.
  if (auto prompt = router_.validate(req->request); !prompt.ok()) return send_error(res, prompt.status());
  const std::string model = router_.model_info().name();
  const int64_t created = unix_now();
  // Unique within the process (a count) and across router processes (a random salt).
  char suffix[40];
  std::snprintf(suffix, sizeof suffix, "%08x%012llx", unsigned(id_salt_ & 0xffffffffu),
                static_cast<unsigned long long>(next_id_++));
  const std::string id = (chat ? "chatcmpl-" : "cmpl-") + std::string(suffix);

  if (!req->stream) {
    // Nothing is written until the end, so a gone client shows only in its connection's state,
    // which the kernel tells by the address pair (cpp-httplib 0.11 gives a handler neither the
    // socket nor is_connection_closed()); the router's watchdog polls this and aborts the
    // request on every worker it touched. A client that half-closes after its request looks
    // gone too (HTTP clients keep their side open while they wait for the answer).
    // Gone only once it was seen established: a connection sock_diag cannot see at all looks
    // "not found" from the start, and must not cancel the request.
    auto seen_established = std::make_shared<bool>(false);
    std::function<bool()> client_gone = [&http_request, seen_established] {
      auto state = tcp_connection_state(http_request.local_addr, http_request.local_port, http_request.remote_addr,
                                        http_request.remote_port);
      if (!state.ok()) {
        static std::once_flag warned;
        std::call_once(warned, [&] {
          PD_LOG_WARN("cannot see HTTP clients hang up ({}): a non-streaming request whose client left runs on",
                      state.status().ToString());
        });
        return false;
      }
      if (*state == TcpConnectionState::kEstablished) *seen_established = true;
      return *seen_established && *state != TcpConnectionState::kEstablished;
    };
    std::string text, finish;
    int prompt_tokens = 0, completion_tokens = 0;
    Status s = router_.generate(req->request, client_gone, [&](const v1::GenerateResponse& r) {
      text += r.text();
      completion_tokens += r.token_ids_size();
      prompt_tokens += r.prompt_token_ids_size();
      if (r.finished()) finish = r.finish_reason();
      return true;
    }, client);
    if (!s.ok()) return send_error(res, s);
    res.set_content(completion_body(*req, id, created, model, text, finish, prompt_tokens, completion_tokens).dump(-1, ' ', false, json::error_handler_t::replace),
                    "application/json");
    return;
  }
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider("text/event-stream", [this, req, id, created, model, client](size_t, httplib::DataSink& sink) {
    bool first = true;
    // Written here, read by the router's watchdog thread through client_gone.
    std::atomic<bool> gone{false};
    int prompt_tokens = 0, completion_tokens = 0;
    auto write = [&](const std::string& s) {
      if (gone || !sink.is_writable() || !sink.write(s.data(), s.size())) gone = true;
      return !gone.load();
    };
    Status s = router_.generate(
        req->request, [&] { return gone.load(); },
        [&](const v1::GenerateResponse& r) {
          prompt_tokens += r.prompt_token_ids_size();
          completion_tokens += r.token_ids_size();
          std::optional<std::string> finish;
          if (r.finished()) finish = r.finish_reason();
          if (r.text().empty() && !finish && !(first && req->chat)) return !gone;
          const bool ok = write(sse(chunk_body(*req, id, created, model, r.text(), finish, first)));
          first = false;
          return ok;
        },
        client);
    if (!s.ok()) write(sse(http_error(s).body));
    if (s.ok() && req->include_usage) {
      json u = chunk_body(*req, id, created, model, "", std::nullopt, false);
      u["choices"] = json::array();
      u["usage"] = usage_body(prompt_tokens, completion_tokens);
      write(sse(u));
    }
    write("data: [DONE]\n\n");
    sink.done();
    return true;
  });
}

}  // namespace pdserve::router
