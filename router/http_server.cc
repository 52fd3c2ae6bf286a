#include "router/http_server.h"

#include <httplib.h>
#include <sys/socket.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <numeric>
#include <random>

#include <absl/strings/str_join.h>

#include "common/logging.h"
#include "common/tcp_state.h"
#include "common/tls.h"
#include "router/bounded_task_queue.h"
#include "router/kv_routing.h"
#include "router/openai_request.h"
#include "router/openai_response.h"
#include "router/parallel_samples.h"

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
  // The router's KV index for one worker (debugging, the index exactness tests): its state and
  // its device-tier keys, sorted, as hex.
  server_->Get("/debug/kv_index", [this](const httplib::Request& req, httplib::Response& res) {
    const std::string address = req.get_param_value("worker");
    const KvRouting* kv = router_.kv_routing();
    const std::optional<KvRouting::WorkerView> v = kv ? kv->view(address) : std::nullopt;
    if (!v) {
      res.status = 404;
      json body = {{"error", {{"message", "no KV index for worker '" + address + "' (give ?worker=HOST:PORT)"},
                              {"type", "invalid_request_error"}, {"param", "worker"}, {"code", nullptr}}}};
      res.set_content(body.dump(), "application/json");
      return;
    }
    json keys = json::array();
    for (const engine::BlockKey& k : v->keys) keys.push_back(k.hex());
    const KvIndexStats st = kv->stats();
    json stats = {{"gaps", st.gaps},       {"epochs", st.epochs},     {"drifts", st.drifts},
                  {"snapshots", st.snapshots}, {"rejected", st.rejected}, {"replays_failed", st.replays_failed}};
    json body = {{"worker", address}, {"worker_id", v->worker_id},
                 {"state", v->state ? json(to_string(*v->state)) : json(nullptr)}, {"keys", std::move(keys)},
                 {"index_stats", std::move(stats)}};
    res.set_content(body.dump(), "application/json");
  });
  server_->Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
    handle_generate(req, /*chat=*/false, res);
  });
  server_->Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) {
    handle_generate(req, /*chat=*/true, res);
  });
  server_->Post("/v1/tokenize", [this](const httplib::Request& req, httplib::Response& res) { handle_tokenize(req, res); });
  server_->Post("/v1/detokenize", [this](const httplib::Request& req, httplib::Response& res) {
    handle_detokenize(req, res);
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
  if (!req->ignored_fields.empty())
    PD_LOG_WARN("{}: the following fields were present in the request but ignored: {}", http_request.path,
                absl::StrJoin(req->ignored_fields, ", "));
  apply_openai_defaults(router_.model_info().sampling_defaults(), req->request.mutable_sampling());
  // Bias on an id outside the vocabulary: the client's mistake (400), found before any work.
  const int vocab = router_.model().config.vocab_size;
  for (const auto& [token, bias] : req->request.sampling().logit_bias())
    if (token >= vocab)
      return send_error(res, absl::InvalidArgumentError(
                                 absl::StrCat("'logit_bias': token id ", token, " is outside the vocabulary [0, ", vocab, ")")));
  // The client's namespace for request ids (the pre-routing check already let it in).
  const std::string client =
      api_keys_ != nullptr ? api_keys_->client_of(http_request.get_header_value("Authorization")).value_or("") : "";
  if (chat && !req->max_tokens_given) {
    // OpenAI's chat default: as much as the context leaves.
    v1::GenerateRequest probe = req->request;
    probe.mutable_sampling()->set_max_tokens(1);
    probe.mutable_sampling()->set_min_tokens(0);
    auto p = router_.validate(probe);
    if (!p.ok()) return send_error(res, p.status());
    req->request.mutable_sampling()->set_max_tokens(std::max<int>(1, router_.model_info().max_context() - int(p->size())));
  }
  // Every prompt is checked here, so that a bad request gets its HTTP status even when it asked
  // for a stream. Then one router request per sample of each prompt: choice index = prompt * n +
  // sample (vLLM's order); best_of runs best_of samples per prompt and keeps the n best.
  const engine::Tokenizer& tokenizer = *router_.model().tokenizer;
  const int samples = req->stream ? req->n : req->best_of;
  auto children = std::make_shared<std::vector<v1::GenerateRequest>>();
  auto echo_texts = std::make_shared<std::vector<std::string>>();
  for (int p = 0; p < req->num_prompts(); ++p) {
    const v1::GenerateRequest prompt = req->prompt_request(p);
    auto ids = router_.validate(prompt);
    if (!ids.ok()) return send_error(res, ids.status());
    echo_texts->push_back(prompt.prompt_case() == v1::GenerateRequest::kText ? prompt.text() : tokenizer.decode(*ids));
    if (req->num_prompts() == 1 && samples == 1) {
      children->push_back(prompt);  // A plain request keeps its id.
      break;
    }
    for (v1::GenerateRequest& r : sample_requests(prompt, samples)) {
      // Ids unique across the batch: "<id>-<flat index>".
      if (!req->request.request_id().empty()) r.set_request_id(absl::StrCat(req->request.request_id(), "-", children->size()));
      children->push_back(std::move(r));
    }
  }
  GenerateFn generate = [this, client](const v1::GenerateRequest& r, const PromptAffinity& affinity,
                                       const std::function<bool()>& gone, const SampleEmit& emit) {
    return router_.generate(r, gone, emit, client, affinity);
  };
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
    std::vector<ChoiceOutput> outputs(children->size());
    Status s = run_parallel(*children, {}, samples, generate, client_gone, [&](const v1::GenerateResponse& r) {
      outputs[size_t(r.index())].add(r);  // run_parallel emits one at a time.
      return true;
    });
    if (!s.ok()) return send_error(res, s);
    std::vector<ChoiceOutput> choices;
    int prompt_tokens = 0, cached_tokens = 0;
    for (int p = 0; p < req->num_prompts(); ++p) {
      std::vector<ChoiceOutput> group(outputs.begin() + p * samples, outputs.begin() + (p + 1) * samples);
      prompt_tokens += int(group[0].prompt_ids.size());  // Once per prompt.
      cached_tokens += group[0].cached_tokens;
      std::vector<int> order(size_t(req->n));
      std::iota(order.begin(), order.end(), 0);
      if (samples > req->n) order = best_samples(group, req->n);
      for (int rank = 0; rank < req->n; ++rank) {
        ChoiceOutput c = std::move(group[size_t(order[size_t(rank)])]);
        c.index = p * req->n + rank;
        c.prompt_text = (*echo_texts)[size_t(p)];
        choices.push_back(std::move(c));
      }
    }
    res.set_content(completion_body(*req, id, created, model, choices, tokenizer, prompt_tokens, cached_tokens)
                        .dump(-1, ' ', false, json::error_handler_t::replace),
                    "application/json");
    return;
  }
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider("text/event-stream", [this, req, id, created, model, children, echo_texts, samples,
                                                         generate](size_t, httplib::DataSink& sink) {
    const engine::Tokenizer& tokenizer = *router_.model().tokenizer;
    std::vector<StreamChoice> states(children->size());
    // Written here, read by the router's watchdog thread through client_gone.
    std::atomic<bool> gone{false};
    int prompt_tokens = 0, completion_tokens = 0, cached_tokens = 0;
    auto write = [&](const std::string& s) {
      if (gone || !sink.is_writable() || !sink.write(s.data(), s.size())) gone = true;
      return !gone.load();
    };
    Status s = run_parallel(
        *children, {}, samples, generate, [&] { return gone.load(); },
        [&](const v1::GenerateResponse& r) {
          const bool prompt_first = r.index() % req->n == 0;  // Prompt tokens once per prompt.
          if (prompt_first) prompt_tokens += r.prompt_token_ids_size();
          if (prompt_first && r.finished()) cached_tokens += r.cached_tokens();
          completion_tokens += r.token_ids_size();
          auto chunk = chunk_body(*req, id, created, model, r, (*echo_texts)[size_t(r.index() / req->n)], tokenizer,
                                  &states[size_t(r.index())]);
          if (!chunk) return !gone.load();
          return write(sse(*chunk));
        });
    if (!s.ok()) write(sse(http_error(s).body));
    if (s.ok() && req->include_usage) write(sse(usage_chunk(*req, id, created, model, prompt_tokens, completion_tokens, cached_tokens)));
    write("data: [DONE]\n\n");
    sink.done();
    return true;
  });
}

Status HttpServer::check_model(const std::string& name) const {
  const ServedModel& m = router_.model();
  if (name.empty() || name == m.name || std::find(m.aliases.begin(), m.aliases.end(), name) != m.aliases.end())
    return absl::OkStatus();
  return absl::NotFoundError(absl::StrCat("model '", name, "' is not served here; this router serves '", m.name, "'"));
}

void HttpServer::handle_tokenize(const httplib::Request& http_request, httplib::Response& res) {
  auto t = parse_tokenize_request(http_request.body, router_.model().chat_template);
  if (!t.ok()) return send_error(res, t.status());
  if (Status m = check_model(t->model); !m.ok()) return send_error(res, m);
  auto ids = router_.model().tokenizer->encode(t->text, t->add_special_tokens);
  if (!ids.ok()) return send_error(res, absl::InvalidArgumentError(absl::StrCat("prompt: ", ids.status().message())));
  json body = {{"count", ids->size()}, {"max_model_len", router_.model_info().max_context()}, {"tokens", *ids}};
  res.set_content(body.dump(), "application/json");
}

void HttpServer::handle_detokenize(const httplib::Request& http_request, httplib::Response& res) {
  auto d = parse_detokenize_request(http_request.body);
  if (!d.ok()) return send_error(res, d.status());
  if (Status m = check_model(d->model); !m.ok()) return send_error(res, m);
  const engine::Tokenizer& tokenizer = *router_.model().tokenizer;
  for (int t : d->tokens)
    if (t < 0 || t >= tokenizer.vocab_size())
      return send_error(res, absl::InvalidArgumentError(
                                 absl::StrCat("'tokens': ", t, " is outside the vocabulary [0, ", tokenizer.vocab_size(), ")")));
  json body = {{"prompt", tokenizer.decode(d->tokens)}};
  res.set_content(body.dump(-1, ' ', false, json::error_handler_t::replace), "application/json");
}

}  // namespace pdserve::router
