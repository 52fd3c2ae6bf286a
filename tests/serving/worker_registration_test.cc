// Workers that register themselves: a router started with no workers gets a prefill and a
// decode worker through Registry.Register (workers started with --router), serves a request
// through them with the in-process greedy result, drops the decode worker after it is killed
// with SIGKILL once its heartbeats stop for the timeout, takes a new one, and drops a worker
// that stops cleanly (it deregisters) at once. With TLS: a router and workers in mutual TLS serve
// gRPC and HTTPS clients; workers without a certificate of the CA cannot register, plaintext
// clients are refused, and partial TLS flags are a startup error.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <httplib.h>

#include <chrono>
#include <fstream>
#include <iterator>
#include <thread>

#include "engine/engine.h"
#include "engine/model_loader.h"
#include "proto/pdserve.grpc.pb.h"
#include "proto/worker.grpc.pb.h"
#include "tests/engine/test_model.h"
#include "tests/serving/cluster_process.h"
#include "tests/serving/test_pki.h"

namespace pdserve {
namespace {

using namespace std::chrono_literals;
using testing::Process;

const std::string kDir = PDSERVE_BINARY_DIR;
constexpr const char* kPrompt = "Once upon a time";
constexpr int kMaxTokens = 40;

std::string worker_bin(const std::string& role) {
  return role == "prefill" ? kDir + "/prefill_worker/pdserve-prefill" : kDir + "/decode_worker/pdserve-decode";
}

std::unique_ptr<Process> start_worker(const std::string& role, const std::string& router,
                                      const std::vector<std::string>& more = {}) {
  std::vector<std::string> args = {worker_bin(role), "--role", role, "--model", testing::stories_bin(),
                                   "--tp", "2", "--port", "0", "--router", router};
  args.insert(args.end(), more.begin(), more.end());
  return std::make_unique<Process>(args);
}

// Waits until `done(metrics)` holds for the router's /metrics, up to `timeout`; the last body.
template <typename Http, typename Pred>
std::pair<bool, std::string> wait_metrics(Http& http, std::chrono::milliseconds timeout, Pred done) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::string body;
  while (true) {
    if (auto m = http.Get("/metrics"); m && m->status == 200) {
      body = m->body;
      if (done(body)) return {true, body};
    }
    if (std::chrono::steady_clock::now() > deadline) return {false, body};
    std::this_thread::sleep_for(50ms);
  }
}

std::string up_line(const std::string& address, const std::string& role) {
  return "pdserve:worker_up{worker=\"" + address + "\",role=\"" + role + "\"} 1\n";
}
bool lists(const std::string& metrics, const std::string& address) {
  return metrics.find("{worker=\"" + address + "\"") != std::string::npos;
}

int health(httplib::Client& http) {
  auto h = http.Get("/health");
  return h ? h->status : -1;
}

TEST(WorkerRegistration, RegisteredWorkersServeAndAKilledOneIsDroppedAfterTheTimeout) {
  // The router logs registrations at info level (its children inherit the environment).
  setenv("PDSERVE_LOG_LEVEL", "info", 1);
  Process router({kDir + "/router/pdserve-router", "--model", testing::stories_bin(), "--port", "0", "--http-port",
                  "0", "--kv-mode", "push", "--heartbeat-interval-ms", "250", "--heartbeat-timeout-ms", "3000",
                  "--local-prefill-tokens", "0"});
  unsetenv("PDSERVE_LOG_LEVEL");
  ASSERT_TRUE(router.wait_ready(30s)) << router.log();
  httplib::Client http("127.0.0.1", router.http_port());
  http.set_read_timeout(10, 0);
  EXPECT_EQ(health(http), 503);  // Nobody registered yet.

  // The reference while the workers start.
  auto prefill = start_worker("prefill", router.grpc());
  auto decode = start_worker("decode", router.grpc());
  auto loaded = engine::load_model({testing::stories_bin(), ""});
  ASSERT_TRUE(loaded.ok()) << loaded.status().message();
  auto eng = engine::Engine::create(std::move(*loaded), {});
  ASSERT_TRUE(eng.ok());
  auto prompt = (*eng)->tokenizer().encode(kPrompt, true);
  ASSERT_TRUE(prompt.ok());
  engine::SamplingParams greedy;
  greedy.max_tokens = kMaxTokens;
  auto want = (*eng)->generate(*prompt, greedy);
  ASSERT_TRUE(want.ok());
  eng->reset();

  ASSERT_TRUE(prefill->wait_ready(60s)) << prefill->log();
  ASSERT_TRUE(decode->wait_ready(60s)) << decode->log();
  auto [registered, metrics] = wait_metrics(http, 30s, [&](const std::string& m) {
    return m.find(up_line(prefill->grpc(), "prefill")) != std::string::npos &&
           m.find(up_line(decode->grpc(), "decode")) != std::string::npos;
  });
  ASSERT_TRUE(registered) << metrics << router.log();
  EXPECT_EQ(health(http), 200);

  // A request through the registered workers: the in-process greedy result.
  auto channel = grpc::CreateChannel(router.grpc(), grpc::InsecureChannelCredentials());
  auto stub = v1::Generation::NewStub(channel);
  v1::GenerateRequest req;
  req.set_text(kPrompt);
  req.mutable_sampling()->set_max_tokens(kMaxTokens);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + 60s);
  auto reader = stub->Generate(&ctx, req);
  v1::GenerateResponse r, last;
  std::vector<int> tokens;
  std::string text;
  while (reader->Read(&r)) {
    tokens.insert(tokens.end(), r.token_ids().begin(), r.token_ids().end());
    text += r.text();
    if (r.finished()) last = r;
  }
  const grpc::Status s = reader->Finish();
  ASSERT_TRUE(s.ok()) << s.error_message() << router.log();
  EXPECT_EQ(tokens, want->token_ids);
  EXPECT_EQ(text, want->text);
  EXPECT_EQ(last.prefill_worker(), prefill->grpc());
  EXPECT_EQ(last.decode_worker(), decode->grpc());

  // SIGKILL: no goodbye, so the decode worker goes only when its heartbeats are 3 s late.
  const std::string dead = decode->grpc();
  const auto killed = std::chrono::steady_clock::now();
  ::kill(decode->pid(), SIGKILL);
  EXPECT_EQ(decode->wait_exit(10s), 128 + SIGKILL);
  auto [dropped, after] = wait_metrics(http, 15s, [&](const std::string& m) { return !lists(m, dead); });
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - killed).count();
  ASSERT_TRUE(dropped) << after << router.log();
  EXPECT_GE(waited, 2.5) << "dropped before the heartbeat timeout";
  EXPECT_TRUE(lists(after, prefill->grpc())) << after;
  EXPECT_EQ(health(http), 503);
  EXPECT_NE(router.log().find("dropped: no heartbeat"), std::string::npos) << router.log();

  // A new decode worker registers and the cluster serves again.
  auto decode2 = start_worker("decode", router.grpc());
  ASSERT_TRUE(decode2->wait_ready(60s)) << decode2->log();
  auto [back, again] = wait_metrics(http, 30s, [&](const std::string& m) {
    return m.find(up_line(decode2->grpc(), "decode")) != std::string::npos;
  });
  ASSERT_TRUE(back) << again << router.log();
  EXPECT_EQ(health(http), 200);

  // A worker that stops cleanly deregisters: gone as soon as it has exited.
  EXPECT_EQ(prefill->stop(15s), 0) << prefill->log();
  auto m = http.Get("/metrics");
  ASSERT_TRUE(m);
  EXPECT_FALSE(lists(m->body, prefill->grpc())) << m->body;
  EXPECT_NE(router.log().find("worker " + prefill->grpc() + " deregistered"), std::string::npos) << router.log();
  EXPECT_NE(router.log().find("worker " + decode2->grpc() + " (decode, decode@" + decode2->grpc() + ") registered"),
            std::string::npos)
      << router.log();
}

// The exit code of `args` run to completion (the flag checks come before the model loads).
int exit_code(const std::vector<std::string>& args) {
  Process p(args);
  return p.wait_exit(30s);
}

TEST(WorkerRegistration, PartialTlsFlagsAreAStartupError) {
  testing::TestPki pki;
  ASSERT_TRUE(pki.ok()) << "the openssl CLI made no certificates (scripts/setup.sh installs it)";
  const std::string router = kDir + "/router/pdserve-router";
  const std::string model = testing::stories_bin();
  EXPECT_EQ(exit_code({router, "--model", model, "--tls-cert", pki.cert()}), 2);
  EXPECT_EQ(exit_code({router, "--model", model, "--tls-key", pki.key()}), 2);
  EXPECT_EQ(exit_code({router, "--model", model, "--tls-ca", pki.ca()}), 2);
  EXPECT_EQ(exit_code({router, "--model", model, "--tls-cert", pki.cert(), "--tls-key", pki.rogue_key()}), 2);
  EXPECT_EQ(exit_code({router, "--model", model, "--tls-cert", pki.file("missing"), "--tls-key", pki.key()}), 2);
  EXPECT_EQ(exit_code({router, "--model", model, "--tls-cert", pki.cert(), "--tls-key", pki.key(), "--tls-worker-name",
                       "w"}),
            2);
  for (const std::string role : {"prefill", "decode"}) {
    const std::string bin = worker_bin(role);
    EXPECT_EQ(exit_code({bin, "--model", model, "--tls-cert", pki.cert(), "--tls-key", pki.key()}), 2) << role;
    EXPECT_EQ(exit_code({bin, "--model", model, "--tls-ca", pki.ca()}), 2) << role;
    EXPECT_EQ(exit_code({bin, "--model", model, "--tls-key", pki.key(), "--tls-ca", pki.ca()}), 2) << role;
  }
  const testing::CommandOutput up =
      testing::pdserve({"up", "--model", model, "--prefill", "1", "--decode", "1", "--tls-key", pki.key()});
  EXPECT_EQ(up.exit_code, 2);
  EXPECT_EQ(testing::pdserve({"check", "--router", "127.0.0.1:1", "--tls-ca", pki.file("missing")}).exit_code, 2);
}

TEST(WorkerRegistration, MutualTlsServesClientsAndTakesOnlyWorkersWithTheCasCertificate) {
  testing::TestPki pki;
  ASSERT_TRUE(pki.ok()) << "the openssl CLI made no certificates (scripts/setup.sh installs it)";
  const std::vector<std::string> tls = {"--tls-cert", pki.cert(), "--tls-key", pki.key(), "--tls-ca", pki.ca()};
  std::vector<std::string> args = {kDir + "/router/pdserve-router", "--model", testing::stories_bin(), "--port", "0",
                                   "--http-port", "0", "--kv-mode", "push", "--heartbeat-interval-ms", "250",
                                   "--local-prefill-tokens", "0"};
  args.insert(args.end(), tls.begin(), tls.end());
  Process router(args);
  ASSERT_TRUE(router.wait_ready(30s)) << router.log();
  httplib::SSLClient https("localhost", router.http_port());
  https.set_ca_cert_path(pki.ca().c_str());
  https.enable_server_certificate_verification(true);
  https.set_read_timeout(30, 0);

  // Workers that cannot register: one in plaintext, one whose certificate another CA signed.
  auto plain = start_worker("decode", router.grpc());
  auto rogue = start_worker("decode", router.grpc(),
                            {"--tls-cert", pki.rogue_cert(), "--tls-key", pki.rogue_key(), "--tls-ca", pki.ca()});
  // And the cluster's own, which the router then reaches over mutual TLS.
  auto prefill = start_worker("prefill", router.grpc(), tls);
  auto decode = start_worker("decode", router.grpc(), tls);
  for (Process* w : {plain.get(), rogue.get(), prefill.get(), decode.get()}) ASSERT_TRUE(w->wait_ready(60s)) << w->log();
  auto [registered, metrics] = wait_metrics(https, 30s, [&](const std::string& m) {
    return m.find(up_line(prefill->grpc(), "prefill")) != std::string::npos &&
           m.find(up_line(decode->grpc(), "decode")) != std::string::npos;
  });
  ASSERT_TRUE(registered) << metrics << router.log() << prefill->log();
  std::this_thread::sleep_for(1s);  // The other two have retried by now.
  auto m = https.Get("/metrics");
  ASSERT_TRUE(m);
  EXPECT_FALSE(lists(m->body, plain->grpc())) << m->body;
  EXPECT_FALSE(lists(m->body, rogue->grpc())) << m->body;
  EXPECT_NE(plain->log().find("cannot register"), std::string::npos) << plain->log();
  EXPECT_NE(rogue->log().find("cannot register"), std::string::npos) << rogue->log();

  // gRPC over TLS, through the registered workers (the router dials them over mutual TLS).
  grpc::SslCredentialsOptions trust;
  std::ifstream ca(pki.ca());
  trust.pem_root_certs.assign(std::istreambuf_iterator<char>(ca), {});
  auto stub = v1::Generation::NewStub(grpc::CreateChannel(router.grpc(), grpc::SslCredentials(trust)));
  v1::GenerateRequest req;
  req.set_text(kPrompt);
  req.mutable_sampling()->set_max_tokens(8);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + 60s);
  auto reader = stub->Generate(&ctx, req);
  v1::GenerateResponse r, last;
  int tokens = 0;
  while (reader->Read(&r)) {
    tokens += r.token_ids_size();
    if (r.finished()) last = r;
  }
  const grpc::Status s = reader->Finish();
  ASSERT_TRUE(s.ok()) << s.error_message() << router.log();
  EXPECT_EQ(tokens, 8);
  EXPECT_EQ(last.prefill_worker(), prefill->grpc());
  EXPECT_EQ(last.decode_worker(), decode->grpc());

  // HTTPS /v1/completions.
  auto c = https.Post("/v1/completions", R"({"model": "stories260K", "prompt": "Once upon a time", "max_tokens": 4, "temperature": 0})",
                      "application/json");
  ASSERT_TRUE(c) << httplib::to_string(c.error());
  EXPECT_EQ(c->status, 200) << c->body;
  EXPECT_NE(c->body.find("\"completion_tokens\":4"), std::string::npos) << c->body;
  // And `pdserve check` trusting the CA, over both.
  const testing::CommandOutput check = testing::pdserve(
      {"check", "--router", router.grpc(), "--http", "localhost:" + std::to_string(router.http_port()), "--tls-ca",
       pki.ca()});
  EXPECT_EQ(check.exit_code, 0) << check.out;

  // Plaintext clients are refused: gRPC and HTTP to the router, gRPC to a worker.
  auto plain_stub = v1::Generation::NewStub(grpc::CreateChannel(router.grpc(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext plain_ctx;
  plain_ctx.set_deadline(std::chrono::system_clock::now() + 5s);
  v1::ModelInfo info;
  EXPECT_EQ(plain_stub->GetModelInfo(&plain_ctx, v1::ModelInfoRequest(), &info).error_code(),
            grpc::StatusCode::UNAVAILABLE);
  httplib::Client plain_http("127.0.0.1", router.http_port());
  plain_http.set_read_timeout(5, 0);
  EXPECT_FALSE(plain_http.Get("/health"));
  // A worker takes only the CA's certificates: a TLS client without one is refused too.
  for (const auto& credentials : {grpc::InsecureChannelCredentials(), grpc::SslCredentials(trust)}) {
    auto worker = worker::Worker::NewStub(grpc::CreateChannel(decode->grpc(), credentials));
    grpc::ClientContext wctx;
    wctx.set_deadline(std::chrono::system_clock::now() + 5s);
    worker::WorkerInfo winfo;
    EXPECT_EQ(worker->Info(&wctx, worker::InfoRequest(), &winfo).error_code(), grpc::StatusCode::UNAVAILABLE);
  }
}

}  // namespace
}  // namespace pdserve
