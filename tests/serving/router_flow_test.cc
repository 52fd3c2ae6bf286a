// The router's request flows against fake workers (in-process gRPC services on loopback that
// script their answers): aggregated streaming, push ordering (the decode stream opens before
// the prefill reply), pull hand-over, prefill retry, overload, Abort, timeout, validation, and
// a non-streaming HTTP client that hangs up.
#include <arpa/inet.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <thread>

#include "engine/model_loader.h"
#include "router/http_server.h"
#include "router/router.h"
#include "tests/engine/test_model.h"

namespace pdserve::router {
namespace {

using namespace std::chrono_literals;

// Whether `flag` became true within `timeout`.
bool wait_for(const std::atomic<bool>& flag, std::chrono::milliseconds timeout) {
  const auto end = std::chrono::steady_clock::now() + timeout;
  while (!flag && std::chrono::steady_clock::now() < end) std::this_thread::sleep_for(1ms);
  return flag;
}

class FakeWorker final : public worker::Worker::Service {
 public:
  explicit FakeWorker(worker::Role role) : role_(role) {
    grpc::ServerBuilder b;
    int port = 0;
    b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    b.RegisterService(this);
    server_ = b.BuildAndStart();
    address = "127.0.0.1:" + std::to_string(port);
  }
  ~FakeWorker() override { server_->Shutdown(std::chrono::system_clock::now() + 1s); }

  std::string address;
  std::vector<int> tokens = {10, 11, 12};
  std::atomic<bool> fail_prefill{false};
  std::atomic<bool> fail_generate{false};  // Generate fails UNAVAILABLE (the worker died).
  // The first this-many Prefill / Generate calls fail UNAVAILABLE blaming the KV peer, as a
  // worker whose transfer partner died answers (kvtransfer/fault.h).
  std::atomic<int> blame_peer{0};
  std::atomic<bool> hang{false};  // Generate waits until cancelled.
  std::atomic<bool> generate_started{false};
  std::atomic<bool> prefill_done{false};
  FakeWorker* peer_decode = nullptr;  // Prefill (push): waits until this decode stream is open.
  FakeWorker* peer_prefill = nullptr;  // Decode (push): waits until the prefill has run.

  std::vector<std::string> calls() {
    std::lock_guard l(mu_);
    return calls_;
  }
  worker::WorkerGenerateRequest last_generate() {
    std::lock_guard l(mu_);
    return last_generate_;
  }

  grpc::Status Info(grpc::ServerContext*, const worker::InfoRequest*, worker::WorkerInfo* r) override {
    r->set_worker_id(address);
    r->set_role(role_);
    r->set_tp(1);
    r->set_num_blocks(100);
    r->set_free_blocks(100);
    r->set_block_size(16);
    r->set_kv_endpoint("endpoint");
    return grpc::Status::OK;
  }
  grpc::Status Reserve(grpc::ServerContext*, const worker::ReserveRequest* req, worker::ReserveResponse* r) override {
    record("Reserve:" + req->request_id());
    if (req->producer_tp() != 1 || req->kv_producer() != "endpoint" || req->prompt_len() <= 0)
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "Reserve without its producer");
    r->add_block_ids(1);
    r->add_block_ids(2);
    r->set_kv_target("target");
    return grpc::Status::OK;
  }
  grpc::Status Prefill(grpc::ServerContext* ctx, const worker::PrefillRequest* req, worker::PrefillResponse* r) override {
    record("Prefill:" + req->request_id() + ":" + req->kv_mode() + ":" + req->kv_target());
    if (fail_prefill) return grpc::Status(grpc::StatusCode::UNAVAILABLE, "prefill rank died");
    if (blame_peer.fetch_sub(1) > 0) return peer_lost(ctx);
    if (peer_decode) {
      peer_decode->prefill_done = true;
      if (!wait_for(peer_decode->generate_started, 3s))
        return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "the router waited for the prefill reply");
    }
    prefill_done = true;
    r->set_first_token(tokens[0]);
    r->set_kv_source("source");
    r->set_prefill_s(0.25);
    r->set_kv_transfer_s(0.125);
    return grpc::Status::OK;
  }
  grpc::Status Generate(grpc::ServerContext* ctx, const worker::WorkerGenerateRequest* req,
                        grpc::ServerWriter<worker::WorkerEvent>* w) override {
    record("Generate:" + req->request_id() + ":" + req->kv_mode());
    {
      std::lock_guard l(mu_);
      last_generate_ = *req;
    }
    generate_started = true;
    if (fail_generate) return grpc::Status(grpc::StatusCode::UNAVAILABLE, "decode worker died");
    if (blame_peer.fetch_sub(1) > 0) return peer_lost(ctx);
    if (hang) {
      while (!ctx->IsCancelled()) std::this_thread::sleep_for(2ms);
      return grpc::Status(grpc::StatusCode::CANCELLED, "cancelled");
    }
    if (peer_prefill && !wait_for(prefill_done, 3s))
      return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "no KV arrived");
    for (size_t i = 0; i + 1 < tokens.size(); ++i) {
      worker::WorkerEvent e;
      e.add_token_ids(tokens[i]);
      e.set_text("t" + std::to_string(tokens[i]));
      if (!w->Write(e)) return grpc::Status::OK;
    }
    worker::WorkerEvent last;
    last.add_token_ids(tokens.back());
    last.set_text("t" + std::to_string(tokens.back()));
    last.set_finished(true);
    last.set_finish_reason("length");
    last.set_prefill_s(0.5);
    last.set_kv_transfer_s(0.0625);
    w->Write(last);
    return grpc::Status::OK;
  }
  grpc::Status Abort(grpc::ServerContext*, const worker::WorkerAbortRequest* req, worker::WorkerAbortResponse*) override {
    record("Abort:" + req->request_id());
    return grpc::Status::OK;
  }

 private:
  static grpc::Status peer_lost(grpc::ServerContext* ctx) {
    ctx->AddTrailingMetadata("pdserve-fault", "peer");
    return grpc::Status(grpc::StatusCode::UNAVAILABLE, "peer rank 0/1 lost");
  }
  void record(const std::string& s) {
    std::lock_guard l(mu_);
    calls_.push_back(s);
  }
  worker::Role role_;
  std::unique_ptr<grpc::Server> server_;
  std::mutex mu_;
  std::vector<std::string> calls_;
  worker::WorkerGenerateRequest last_generate_;
};

ServedModel stories_model() {
  auto m = engine::load_model({testing::stories_bin(), ""});
  EXPECT_TRUE(m.ok()) << m.status();
  ServedModel s;
  s.name = m->name;
  s.config = m->config;
  s.tokenizer = std::move(m->tokenizer);
  return s;
}

struct Result {
  Status status;
  std::vector<v1::GenerateResponse> responses;
  std::vector<int> tokens() const {
    std::vector<int> t;
    for (const auto& r : responses) t.insert(t.end(), r.token_ids().begin(), r.token_ids().end());
    return t;
  }
};

class RouterFlow : public ::testing::Test {
 protected:
  void start(std::vector<std::pair<FakeWorker*, worker::Role>> workers, RouterOptions options, const Clock& clock = RealClock::instance()) {
    std::vector<WorkerRegistry::Endpoint> eps;
    for (auto& [w, role] : workers) eps.push_back({w->address, role});
    registry_ = std::make_unique<WorkerRegistry>(eps, RegistryOptions{}, clock);
    registry_->poll_once();
    router_ = std::make_unique<Router>(options, stories_model(), *registry_, metrics_, clock);
  }
  Result run(v1::GenerateRequest req) {
    Result r;
    r.status = router_->generate(req, nullptr, [&](const v1::GenerateResponse& x) {
      r.responses.push_back(x);
      return true;
    });
    return r;
  }
  static v1::GenerateRequest request(const std::string& text = "Once upon", int max_tokens = 3) {
    v1::GenerateRequest r;
    r.set_text(text);
    r.mutable_sampling()->set_max_tokens(max_tokens);
    return r;
  }
  RouterMetrics metrics_;
  std::unique_ptr<WorkerRegistry> registry_;
  std::unique_ptr<Router> router_;
};

TEST_F(RouterFlow, AggregatedStreamsTokensThenTheFinalMessage) {
  FakeWorker w(worker::ROLE_AGGREGATED);
  RouterOptions o;
  o.kv_mode = "aggregated";
  start({{&w, worker::ROLE_AGGREGATED}}, o);
  Result r = run(request());
  ASSERT_TRUE(r.status.ok()) << r.status;
  EXPECT_EQ(r.tokens(), (std::vector<int>{10, 11, 12}));
  ASSERT_GE(r.responses.size(), 2u);
  EXPECT_GT(r.responses.front().prompt_token_ids_size(), 1);
  const v1::GenerateResponse& last = r.responses.back();
  EXPECT_TRUE(last.finished());
  EXPECT_EQ(last.finish_reason(), "length");
  EXPECT_FALSE(last.request_id().empty());
  EXPECT_EQ(last.decode_worker(), w.address);
  EXPECT_DOUBLE_EQ(last.timings().prefill_s(), 0.5);
  EXPECT_GT(last.timings().total_s(), 0);
  EXPECT_LE(last.timings().first_token_s(), last.timings().total_s());
  EXPECT_NE(router_->metrics_text().find("pdserve:e2e_request_latency_seconds_count 1"), std::string::npos);
}

TEST_F(RouterFlow, PushOpensTheDecodeStreamBeforeThePrefillReply) {
  FakeWorker p(worker::ROLE_PREFILL), d(worker::ROLE_DECODE);
  p.peer_decode = &d;
  d.peer_prefill = &p;
  start({{&p, worker::ROLE_PREFILL}, {&d, worker::ROLE_DECODE}}, RouterOptions{});
  v1::GenerateRequest req = request();
  req.set_request_id("push-1");
  Result r = run(req);
  ASSERT_TRUE(r.status.ok()) << r.status;
  EXPECT_EQ(r.tokens(), (std::vector<int>{10, 11, 12}));
  EXPECT_EQ(d.calls().front(), "Reserve:push-1");
  EXPECT_EQ(p.calls(), (std::vector<std::string>{"Prefill:push-1:push:target"}));
  EXPECT_EQ(d.last_generate().reserved_blocks_size(), 2);
  const v1::GenerateResponse& last = r.responses.back();
  EXPECT_EQ(last.request_id(), "push-1");
  EXPECT_EQ(last.prefill_worker(), p.address);
  EXPECT_EQ(last.decode_worker(), d.address);
  EXPECT_DOUBLE_EQ(last.timings().prefill_s(), 0.25);
  EXPECT_DOUBLE_EQ(last.timings().kv_transfer_s(), 0.125);
  EXPECT_NE(router_->metrics_text().find("pdserve:kv_transfer_seconds_count{prefill=\"" + p.address), std::string::npos);
}

TEST_F(RouterFlow, PullHandsTheSourceAndFirstTokenToDecode) {
  FakeWorker p(worker::ROLE_PREFILL), d(worker::ROLE_DECODE);
  RouterOptions o;
  o.kv_mode = "pull";
  start({{&p, worker::ROLE_PREFILL}, {&d, worker::ROLE_DECODE}}, o);
  Result r = run(request());
  ASSERT_TRUE(r.status.ok()) << r.status;
  EXPECT_EQ(d.last_generate().kv_mode(), "pull");
  EXPECT_EQ(d.last_generate().kv_source(), "source");
  EXPECT_EQ(d.last_generate().first_token(), 10);
  EXPECT_DOUBLE_EQ(r.responses.back().timings().kv_transfer_s(), 0.0625);
}

TEST_F(RouterFlow, AFailedPrefillIsRetriedOnAnotherPrefillWorker) {
  FakeWorker bad(worker::ROLE_PREFILL), good(worker::ROLE_PREFILL), d(worker::ROLE_DECODE);
  bad.fail_prefill = true;
  RouterOptions o;
  o.kv_mode = "pull";
  start({{&bad, worker::ROLE_PREFILL}, {&good, worker::ROLE_PREFILL}, {&d, worker::ROLE_DECODE}}, o);
  Result r = run(request());
  ASSERT_TRUE(r.status.ok()) << r.status;
  EXPECT_EQ(r.responses.back().prefill_worker(), good.address);
  EXPECT_EQ(bad.calls().size(), 1u);
  EXPECT_EQ(r.tokens(), (std::vector<int>{10, 11, 12}));
}

TEST_F(RouterFlow, PushPrefillFailureAbortsTheDecodeSideAndRetries) {
  FakeWorker bad(worker::ROLE_PREFILL), good(worker::ROLE_PREFILL), d(worker::ROLE_DECODE);
  bad.fail_prefill = true;
  d.peer_prefill = &good;
  good.peer_decode = &d;
  start({{&bad, worker::ROLE_PREFILL}, {&good, worker::ROLE_PREFILL}, {&d, worker::ROLE_DECODE}}, RouterOptions{});
  v1::GenerateRequest req = request();
  req.set_request_id("r");
  Result r = run(req);
  ASSERT_TRUE(r.status.ok()) << r.status;
  const auto calls = d.calls();
  EXPECT_NE(std::find(calls.begin(), calls.end(), "Abort:r"), calls.end());
  EXPECT_NE(std::find(calls.begin(), calls.end(), "Reserve:r/retry1"), calls.end());
  EXPECT_EQ(r.responses.back().prefill_worker(), good.address);
}

// A decode worker that dies during a push fails its stream, and the prefill worker's transfer
// to it fails too, saying the peer was lost: the decode worker is the one marked down, and the
// request runs again on the same (only) prefill worker and the other decode worker.
TEST_F(RouterFlow, PushFailureOfTheDecodeSideIsNotBlamedOnThePrefillWorker) {
  FakeWorker p(worker::ROLE_PREFILL), dead(worker::ROLE_DECODE), alive(worker::ROLE_DECODE);
  p.blame_peer = 1;
  dead.fail_generate = true;
  start({{&p, worker::ROLE_PREFILL}, {&dead, worker::ROLE_DECODE}, {&alive, worker::ROLE_DECODE}}, RouterOptions{});
  v1::GenerateRequest req = request();
  req.set_request_id("r");
  Result r = run(req);
  ASSERT_TRUE(r.status.ok()) << r.status;
  EXPECT_EQ(r.responses.back().prefill_worker(), p.address);
  EXPECT_EQ(r.responses.back().decode_worker(), alive.address);
  EXPECT_EQ(r.tokens(), (std::vector<int>{10, 11, 12}));
  // Out of placement: a second request goes to the live decode worker at once.
  Result again = run(request());
  ASSERT_TRUE(again.status.ok()) << again.status;
  EXPECT_EQ(again.responses.back().decode_worker(), alive.address);
  const auto calls = dead.calls();
  EXPECT_EQ(std::count_if(calls.begin(), calls.end(), [](const std::string& c) { return c.rfind("Reserve:", 0) == 0; }), 1);
}

// Pull: the decode side cannot read the held KV because the prefill worker's side failed; the
// prefill worker is marked down and the (only) decode worker serves the retry.
TEST_F(RouterFlow, PullReadFailureIsBlamedOnThePrefillWorker) {
  FakeWorker bad(worker::ROLE_PREFILL), good(worker::ROLE_PREFILL), d(worker::ROLE_DECODE);
  d.blame_peer = 1;
  RouterOptions o;
  o.kv_mode = "pull";
  start({{&bad, worker::ROLE_PREFILL}, {&good, worker::ROLE_PREFILL}, {&d, worker::ROLE_DECODE}}, o);
  Result r = run(request());
  ASSERT_TRUE(r.status.ok()) << r.status;
  EXPECT_EQ(r.responses.back().prefill_worker(), good.address);
  EXPECT_EQ(r.responses.back().decode_worker(), d.address);
  EXPECT_EQ(bad.calls().size(), 2u) << "Prefill, then the Abort of the failed attempt";
}

TEST_F(RouterFlow, OverloadIsResourceExhausted) {
  FakeWorker w(worker::ROLE_AGGREGATED);
  w.hang = true;
  RouterOptions o;
  o.kv_mode = "aggregated";
  o.max_running = 1;
  o.max_waiting = 0;
  start({{&w, worker::ROLE_AGGREGATED}}, o);
  v1::GenerateRequest first = request();
  first.set_request_id("long");
  Result r1;
  std::thread t([&] { r1 = run(first); });
  ASSERT_TRUE(wait_for(w.generate_started, 5s));
  Result r2 = run(request());
  EXPECT_TRUE(absl::IsResourceExhausted(r2.status)) << r2.status;
  EXPECT_NE(r2.status.message().find("overloaded"), std::string_view::npos);
  EXPECT_TRUE(router_->abort("long"));
  t.join();
  ASSERT_TRUE(r1.status.ok()) << r1.status;
  EXPECT_EQ(r1.responses.back().finish_reason(), "abort");
  const auto calls = w.calls();
  EXPECT_NE(std::find(calls.begin(), calls.end(), "Abort:long"), calls.end());
  EXPECT_FALSE(router_->abort("long"));
}

TEST_F(RouterFlow, TimeoutIsDeadlineExceededAndAbortsTheWorker) {
  FakeClock clock;
  FakeWorker w(worker::ROLE_AGGREGATED);
  w.hang = true;
  RouterOptions o;
  o.kv_mode = "aggregated";
  o.request_timeout = 30s;
  start({{&w, worker::ROLE_AGGREGATED}}, o, clock);
  v1::GenerateRequest req = request();
  req.set_request_id("slow");
  Result r;
  std::thread t([&] { r = run(req); });
  ASSERT_TRUE(wait_for(w.generate_started, 5s));
  clock.advance(31s);
  t.join();
  EXPECT_TRUE(absl::IsDeadlineExceeded(r.status)) << r.status;
  const auto calls = w.calls();
  EXPECT_NE(std::find(calls.begin(), calls.end(), "Abort:slow"), calls.end());
}

TEST_F(RouterFlow, ClientCancellationStopsTheWorker) {
  FakeWorker w(worker::ROLE_AGGREGATED);
  w.hang = true;
  RouterOptions o;
  o.kv_mode = "aggregated";
  start({{&w, worker::ROLE_AGGREGATED}}, o);
  std::atomic<bool> gone{false};
  v1::GenerateRequest req = request();
  req.set_request_id("c");
  Status s;
  std::thread t([&] { s = router_->generate(req, [&] { return gone.load(); }, [](const v1::GenerateResponse&) { return true; }); });
  ASSERT_TRUE(wait_for(w.generate_started, 5s));
  gone = true;
  t.join();
  EXPECT_TRUE(absl::IsCancelled(s)) << s;
  const auto calls = w.calls();
  EXPECT_NE(std::find(calls.begin(), calls.end(), "Abort:c"), calls.end());
}

// Whether `worker` was sent a Worker.Abort within `timeout`.
bool aborted(FakeWorker& worker, std::chrono::milliseconds timeout) {
  const auto end = std::chrono::steady_clock::now() + timeout;
  do {
    for (const std::string& call : worker.calls())
      if (call.rfind("Abort:", 0) == 0) return true;
    std::this_thread::sleep_for(5ms);
  } while (std::chrono::steady_clock::now() < end);
  return false;
}

// A non-streaming HTTP request writes nothing until its end, so only the socket shows that the
// client hung up: the watchdog must still notice and free the request on both workers.
TEST_F(RouterFlow, NonStreamingHttpClientHangingUpAbortsBothWorkers) {
  FakeWorker p(worker::ROLE_PREFILL), d(worker::ROLE_DECODE);
  p.peer_decode = &d;
  d.hang = true;
  start({{&p, worker::ROLE_PREFILL}, {&d, worker::ROLE_DECODE}}, RouterOptions{});
  HttpServer http(*router_, HttpServerOptions{});
  auto port = http.bind("127.0.0.1", 0);
  ASSERT_TRUE(port.ok()) << port.status();
  http.start();

  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(uint16_t(*port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  const std::string body = R"({"prompt":"Once upon","max_tokens":400})";
  const std::string request = "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                              "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
  ASSERT_EQ(write(fd, request.data(), request.size()), ssize_t(request.size()));
  ASSERT_TRUE(wait_for(d.generate_started, 5s));
  EXPECT_FALSE(aborted(d, 100ms)) << "aborted while the client still waits";
  close(fd);
  EXPECT_TRUE(aborted(d, 5s)) << "decode worker not aborted";
  EXPECT_TRUE(aborted(p, 5s)) << "prefill worker not aborted";
  http.stop();
  EXPECT_EQ(router_->running(), 0);
}

TEST_F(RouterFlow, NoWorkerUpIsUnavailable) {
  RouterOptions o;
  o.kv_mode = "aggregated";
  start({}, o);
  EXPECT_TRUE(absl::IsUnavailable(run(request()).status));
  EXPECT_FALSE(router_->ready());
}

TEST_F(RouterFlow, ValidationStatuses) {
  FakeWorker w(worker::ROLE_AGGREGATED);
  RouterOptions o;
  o.kv_mode = "aggregated";
  start({{&w, worker::ROLE_AGGREGATED}}, o);
  struct Case {
    const char* name;
    std::function<void(v1::GenerateRequest&)> edit;
    absl::StatusCode code;
  } cases[] = {
      {"no prompt", [](v1::GenerateRequest& r) { r.clear_text(); }, absl::StatusCode::kInvalidArgument},
      {"empty ids", [](v1::GenerateRequest& r) { r.mutable_token_ids(); }, absl::StatusCode::kInvalidArgument},
      {"id out of vocab", [](v1::GenerateRequest& r) { r.mutable_token_ids()->add_ids(512); }, absl::StatusCode::kInvalidArgument},
      {"too long", [](v1::GenerateRequest& r) { for (int i = 0; i < 600; ++i) r.mutable_token_ids()->add_ids(5); },
       absl::StatusCode::kInvalidArgument},
      {"max_tokens 0", [](v1::GenerateRequest& r) { r.mutable_sampling()->set_max_tokens(0); }, absl::StatusCode::kInvalidArgument},
      {"temperature < 0", [](v1::GenerateRequest& r) { r.mutable_sampling()->set_temperature(-1); }, absl::StatusCode::kInvalidArgument},
      {"top_p 0", [](v1::GenerateRequest& r) { r.mutable_sampling()->set_top_p(0); }, absl::StatusCode::kInvalidArgument},
      {"top_p > 1", [](v1::GenerateRequest& r) { r.mutable_sampling()->set_top_p(1.5); }, absl::StatusCode::kInvalidArgument},
      {"top_k < 0", [](v1::GenerateRequest& r) { r.mutable_sampling()->set_top_k(-3); }, absl::StatusCode::kInvalidArgument},
      {"unknown model", [](v1::GenerateRequest& r) { r.set_model("gpt-9"); }, absl::StatusCode::kNotFound},
      {"17 stop strings", [](v1::GenerateRequest& r) { for (int i = 0; i < 17; ++i) r.mutable_sampling()->add_stop("s"); },
       absl::StatusCode::kInvalidArgument},
      {"a 257-byte stop string", [](v1::GenerateRequest& r) { r.mutable_sampling()->add_stop(std::string(257, 'x')); },
       absl::StatusCode::kInvalidArgument},
      {"257 stop ids", [](v1::GenerateRequest& r) { for (int i = 0; i < 257; ++i) r.mutable_sampling()->add_stop_token_ids(2); },
       absl::StatusCode::kInvalidArgument},
      {"text past context x 256 bytes", [](v1::GenerateRequest& r) { r.set_text(std::string(512 * 256 + 1, 'a')); },
       absl::StatusCode::kInvalidArgument},
      {"request id of 257 bytes", [](v1::GenerateRequest& r) { r.set_request_id(std::string(257, 'r')); },
       absl::StatusCode::kInvalidArgument},
  };
  for (const Case& c : cases) {
    v1::GenerateRequest r = request();
    c.edit(r);
    EXPECT_EQ(run(r).status.code(), c.code) << c.name;
  }
  v1::GenerateRequest named = request();
  named.set_model("stories260K");
  for (int i = 0; i < 16; ++i) named.mutable_sampling()->add_stop(std::string(256, 'z'));  // At the limits: served.
  EXPECT_TRUE(run(named).status.ok());
  EXPECT_TRUE(w.calls().size() == 1u);  // Only the valid one reached the worker.
}

}  // namespace
}  // namespace pdserve::router
