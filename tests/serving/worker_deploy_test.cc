// What a deployment relies on from a worker process: its probes (start-up, readiness with the
// reason), the RDMA self-check (--require-rdma on a machine whose UCX offers only tcp stays
// not ready, saying so), the SIGTERM drain (streams in flight finish, whole and equal to the
// in-process result, before the worker exits 0), and KV-compatibility labels (the router never
// pairs prefill and decode workers of different --kv-compat generations).
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <httplib.h>

#include <algorithm>
#include <chrono>
#include <set>
#include <thread>

#include "engine/engine.h"
#include "engine/model_loader.h"
#include "proto/pdserve.grpc.pb.h"
#include "proto/worker.grpc.pb.h"
#include "tests/engine/test_model.h"
#include "tests/serving/cluster_process.h"

namespace pdserve {
namespace {

using namespace std::chrono_literals;
using testing::Process;

const std::string kDir = PDSERVE_BINARY_DIR;
constexpr const char* kPrompt = "Once upon a time";

std::string worker_bin(const std::string& role) {
  return role == "prefill" ? kDir + "/prefill_worker/pdserve-prefill" : kDir + "/decode_worker/pdserve-decode";
}

std::unique_ptr<Process> start_worker(const std::string& role, std::vector<std::string> extra) {
  std::vector<std::string> args = {worker_bin(role), "--role", role, "--model", testing::stories_bin(), "--probe-port",
                                   "0"};
  if (std::find(extra.begin(), extra.end(), "--port") == extra.end()) args.insert(args.end(), {"--port", "0"});
  args.insert(args.end(), extra.begin(), extra.end());
  return std::make_unique<Process>(args);
}

std::unique_ptr<Process> start_router() {
  auto router = std::make_unique<Process>(std::vector<std::string>{
      kDir + "/router/pdserve-router", "--model", testing::stories_bin(), "--port", "0", "--http-port", "0",
      "--kv-mode", "push", "--heartbeat-interval-ms", "250", "--local-prefill-tokens", "0"});
  return router;
}

struct Probe {
  int status = -1;
  std::string body;
};
Probe probe(int port, const std::string& path) {
  httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(5, 0);
  auto r = c.Get(path.c_str());
  return r ? Probe{r->status, r->body} : Probe{};
}
// Waits up to `timeout` for `path` to answer `status`; the last answer.
Probe wait_probe(int port, const std::string& path, int status, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  Probe p;
  while (std::chrono::steady_clock::now() < deadline) {
    p = probe(port, path);
    if (p.status == status) return p;
    std::this_thread::sleep_for(50ms);
  }
  return p;
}

std::vector<int> reference_tokens(int max_tokens, bool ignore_eos) {
  auto loaded = engine::load_model({testing::stories_bin(), ""});
  EXPECT_TRUE(loaded.ok());
  auto eng = engine::Engine::create(std::move(*loaded), {});
  EXPECT_TRUE(eng.ok());
  auto prompt = (*eng)->tokenizer().encode(kPrompt, true);
  engine::SamplingParams greedy;
  greedy.max_tokens = max_tokens;
  greedy.ignore_eos = ignore_eos;
  auto out = (*eng)->generate(*prompt, greedy);
  EXPECT_TRUE(out.ok());
  return out->token_ids;
}

TEST(WorkerDeploy, RdmaRequiredButOnlyTcpStaysNotReadyWithTheReason) {
  setenv("UCX_TLS", "tcp", 1);  // Inherited by the workers: UCX offers tcp only.
  auto required = start_worker("prefill", {"--require-rdma"});
  auto plain = start_worker("decode", {});
  unsetenv("UCX_TLS");
  ASSERT_TRUE(required->wait_ready(60s)) << required->log();
  ASSERT_TRUE(plain->wait_ready(60s)) << plain->log();
  ASSERT_GT(required->probe_port(), 0);

  EXPECT_EQ(probe(required->probe_port(), "/livez").status, 200);
  EXPECT_EQ(probe(required->probe_port(), "/startupz").status, 200);
  // Readiness never comes, and says why: the transports UCX offers.
  const Probe ready = probe(required->probe_port(), "/readyz");
  EXPECT_EQ(ready.status, 503);
  EXPECT_NE(ready.body.find("RDMA required"), std::string::npos) << ready.body;
  EXPECT_NE(ready.body.find("tcp/"), std::string::npos) << ready.body;
  const Probe metrics = probe(required->probe_port(), "/metrics");
  EXPECT_NE(metrics.body.find("pdserve:worker_rdma_required{role=\"prefill\"} 1\n"), std::string::npos) << metrics.body;
  EXPECT_NE(metrics.body.find("pdserve:worker_rdma_available{role=\"prefill\"} 0\n"), std::string::npos) << metrics.body;
  EXPECT_NE(metrics.body.find("pdserve:worker_ready{role=\"prefill\"} 0\n"), std::string::npos) << metrics.body;
  // The start-up log names the transports and the memlock limit, whatever the log level.
  EXPECT_NE(required->log().find("UCX transports: tcp/"), std::string::npos) << required->log();
  EXPECT_NE(required->log().find("RLIMIT_MEMLOCK: "), std::string::npos) << required->log();
  EXPECT_NE(required->log().find("--require-rdma: UCX offers no RDMA transport"), std::string::npos)
      << required->log();

  // The same UCX without the requirement: ready (no router to register with).
  const Probe plain_ready = wait_probe(plain->probe_port(), "/readyz", 200, 10s);
  EXPECT_EQ(plain_ready.status, 200) << plain_ready.body;
}

TEST(WorkerDeploy, AggregatedWorkersRefuseTheKvTransferFlags) {
  const testing::CommandOutput out = testing::run_command(worker_bin("decode") + " --role aggregated --model " +
                                        testing::stories_bin() + " --require-rdma 2>&1");
  EXPECT_EQ(out.exit_code, 2) << out.out;
  EXPECT_NE(out.out.find("apply to the prefill and decode roles"), std::string::npos) << out.out;
  // The peer tier serves and reads host tiers between P/D workers: refused on an aggregated
  // worker and on one without a host tier.
  for (const std::string& args : {std::string(" --role aggregated --host-kv-bytes 67108864"), std::string("")}) {
    const testing::CommandOutput peer = testing::run_command(worker_bin("decode") + args + " --model " +
                                                             testing::stories_bin() + " --kv-peer-tier 2>&1");
    EXPECT_EQ(peer.exit_code, 2) << peer.out;
    EXPECT_NE(peer.out.find("--kv-peer-tier applies to prefill and decode workers with a host KV tier"),
              std::string::npos)
        << peer.out;
  }
}

// No step of a prefill worker is a decode step: --decode-graphs could change nothing there, so it
// is refused.
TEST(WorkerDeploy, PrefillWorkersRefuseDecodeGraphs) {
  const testing::CommandOutput out = testing::run_command(worker_bin("prefill") + " --device emulated --model " +
                                                          testing::stories_bin() + " --decode-graphs 2>&1");
  EXPECT_EQ(out.exit_code, 2) << out.out;
  EXPECT_NE(out.out.find("--decode-graphs records decode steps, which a prefill worker runs none of"),
            std::string::npos)
      << out.out;
}

// A prefill worker's steps wait for each layer's KV to be handed on, and an aborted request's
// blocks go back to its caller: --async-scheduling is refused there.
TEST(WorkerDeploy, PrefillWorkersRefuseAsyncScheduling) {
  const testing::CommandOutput out = testing::run_command(worker_bin("prefill") + " --device emulated --model " +
                                                          testing::stories_bin() + " --async-scheduling 2>&1");
  EXPECT_EQ(out.exit_code, 2) << out.out;
  EXPECT_NE(out.out.find("--async-scheduling overlaps decode steps"), std::string::npos) << out.out;
}

// Streams read on their own threads: tokens seen so far, and how the stream ended.
struct Stream {
  std::vector<int> tokens;
  std::atomic<int> seen{0};
  grpc::Status status;
  std::thread reader;
};

void start_stream(Stream& s, v1::Generation::Stub& stub, int max_tokens) {
  s.reader = std::thread([&s, &stub, max_tokens] {
    v1::GenerateRequest req;
    req.set_text(kPrompt);
    req.mutable_sampling()->set_max_tokens(max_tokens);
    req.mutable_sampling()->set_ignore_eos(true);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + 90s);
    auto reader = stub.Generate(&ctx, req);
    v1::GenerateResponse r;
    while (reader->Read(&r)) {
      s.tokens.insert(s.tokens.end(), r.token_ids().begin(), r.token_ids().end());
      s.seen = int(s.tokens.size());
    }
    s.status = reader->Finish();
  });
}

// Whether every stream saw its first tokens within 60 s.
template <size_t N>
bool wait_begun(const Stream (&streams)[N]) {
  const auto deadline = std::chrono::steady_clock::now() + 60s;
  auto begun = [&] {
    for (const Stream& s : streams)
      if (s.seen == 0) return false;
    return true;
  };
  while (!begun() && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(10ms);
  return begun();
}

// A router with a CPU prefill worker and an emulated-GPU decode worker (a few tokens a second,
// so streams last), both registered, the decode worker ready and the router healthy.
struct SlowDecodeCluster {
  std::unique_ptr<Process> router, prefill, decode;
};
void start_slow_decode_cluster(SlowDecodeCluster& c, const std::vector<std::string>& decode_flags) {
  c.router = start_router();
  ASSERT_TRUE(c.router->wait_ready(30s)) << c.router->log();
  c.prefill = start_worker("prefill", {"--router", c.router->grpc()});
  std::vector<std::string> flags = {"--router", c.router->grpc(), "--device", "emulated"};
  flags.insert(flags.end(), decode_flags.begin(), decode_flags.end());
  setenv("PDSERVE_LOG_LEVEL", "info", 1);  // The drain's outcome is logged at info.
  c.decode = start_worker("decode", flags);
  unsetenv("PDSERVE_LOG_LEVEL");
  ASSERT_TRUE(c.prefill->wait_ready(60s)) << c.prefill->log();
  ASSERT_TRUE(c.decode->wait_ready(120s)) << c.decode->log();
  // Ready only once registered with the router.
  const Probe ready = wait_probe(c.decode->probe_port(), "/readyz", 200, 30s);
  ASSERT_EQ(ready.status, 200) << ready.body;
  httplib::Client http("127.0.0.1", c.router->http_port());
  for (int i = 0; i < 200; ++i) {
    auto h = http.Get("/health");
    if (h && h->status == 200) break;
    std::this_thread::sleep_for(50ms);
  }
}

// The decode worker runs the GPU backend's code on the CPU emulation of the GPU (a few tokens a
// second), so the streams last well past the old 2 s grace and the drain is what lets them end.
TEST(WorkerDeploy, SigtermDuringAStreamFinishesTheStreamBeforeExit) {
  constexpr int kMaxTokens = 24;
  constexpr int kStreams = 3;
  const std::vector<int> want = reference_tokens(kMaxTokens, /*ignore_eos=*/true);
  SlowDecodeCluster c;
  ASSERT_NO_FATAL_FAILURE(start_slow_decode_cluster(c, {"--drain-timeout-s", "60"}));
  Process* decode = c.decode.get();
  auto stub = v1::Generation::NewStub(grpc::CreateChannel(c.router->grpc(), grpc::InsecureChannelCredentials()));
  Stream streams[kStreams];
  for (Stream& s : streams) start_stream(s, *stub, kMaxTokens);
  // Every stream has begun (its first tokens arrived) when the decode worker is told to stop.
  ASSERT_TRUE(wait_begun(streams));
  ::kill(decode->pid(), SIGTERM);
  int seen_at_term = kMaxTokens;
  for (const Stream& s : streams) seen_at_term = std::min(seen_at_term, s.seen.load());
  EXPECT_LT(seen_at_term, kMaxTokens) << "the streams ended before SIGTERM: the test proves nothing";
  // Draining: not ready (no new work), yet alive and serving what it has.
  const Probe draining = wait_probe(decode->probe_port(), "/readyz", 503, 10s);
  EXPECT_EQ(draining.status, 503);
  EXPECT_NE(draining.body.find("draining"), std::string::npos) << draining.body;

  for (Stream& s : streams) {
    s.reader.join();
    EXPECT_TRUE(s.status.ok()) << s.status.error_message() << decode->log();
    EXPECT_EQ(s.tokens, want);
  }
  EXPECT_EQ(decode->wait_exit(60s), 0) << decode->log();
  EXPECT_NE(decode->log().find("drained"), std::string::npos) << decode->log();
  EXPECT_EQ(decode->log().find("drain timeout"), std::string::npos) << decode->log();
}

// The same for the router: SIGTERM stops new requests (UNAVAILABLE, so a client tries another
// replica) while the streams in flight finish whole, then it exits 0.
TEST(WorkerDeploy, SigtermToTheRouterFinishesItsStreamsAndRefusesNewOnes) {
  constexpr int kMaxTokens = 16;
  constexpr int kStreams = 2;
  const std::vector<int> want = reference_tokens(kMaxTokens, /*ignore_eos=*/true);
  SlowDecodeCluster c;
  ASSERT_NO_FATAL_FAILURE(start_slow_decode_cluster(c, {}));
  Process* router = c.router.get();
  auto stub = v1::Generation::NewStub(grpc::CreateChannel(router->grpc(), grpc::InsecureChannelCredentials()));
  Stream streams[kStreams];
  for (Stream& s : streams) start_stream(s, *stub, kMaxTokens);
  ASSERT_TRUE(wait_begun(streams));
  ::kill(router->pid(), SIGTERM);
  // A request arriving during the drain is refused, and says why.
  grpc::Status refused;
  for (int i = 0; i < 100; ++i) {
    v1::GenerateRequest req;
    req.set_text(kPrompt);
    req.mutable_sampling()->set_max_tokens(1);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + 10s);
    auto reader = stub->Generate(&ctx, req);
    v1::GenerateResponse r;
    while (reader->Read(&r)) {
    }
    refused = reader->Finish();
    if (!refused.ok()) break;
    std::this_thread::sleep_for(20ms);  // The signal may not have been taken yet.
  }
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::UNAVAILABLE) << refused.error_message();
  EXPECT_NE(refused.error_message().find("draining"), std::string::npos) << refused.error_message();
  for (Stream& s : streams) {
    s.reader.join();
    EXPECT_TRUE(s.status.ok()) << s.status.error_message() << router->log();
    EXPECT_EQ(s.tokens, want);
  }
  EXPECT_EQ(router->wait_exit(60s), 0) << router->log();
  EXPECT_NE(router->log().find("router: drained"), std::string::npos) << router->log();
}

// Waits until the router's /metrics lists `address` up in `role`.
bool wait_up(int router_http, const std::string& address, const std::string& role) {
  httplib::Client http("127.0.0.1", router_http);
  const std::string line = "pdserve:worker_up{worker=\"" + address + "\",role=\"" + role + "\"} 1\n";
  const auto deadline = std::chrono::steady_clock::now() + 30s;
  while (std::chrono::steady_clock::now() < deadline) {
    if (auto m = http.Get("/metrics"); m && m->body.find(line) != std::string::npos) return true;
    std::this_thread::sleep_for(50ms);
  }
  return false;
}

TEST(WorkerDeploy, RouterPairsOnlyWorkersOfTheSameKvCompatLabel) {
  auto router = start_router();
  ASSERT_TRUE(router->wait_ready(30s)) << router->log();
  auto prefill = start_worker("prefill", {"--router", router->grpc(), "--kv-compat", "gen-2"});
  auto old_decode = start_worker("decode", {"--router", router->grpc(), "--kv-compat", "gen-1"});
  ASSERT_TRUE(prefill->wait_ready(60s)) << prefill->log();
  ASSERT_TRUE(old_decode->wait_ready(60s)) << old_decode->log();
  ASSERT_EQ(wait_probe(prefill->probe_port(), "/readyz", 200, 30s).status, 200);
  ASSERT_EQ(wait_probe(old_decode->probe_port(), "/readyz", 200, 30s).status, 200);

  auto stub = v1::Generation::NewStub(grpc::CreateChannel(router->grpc(), grpc::InsecureChannelCredentials()));
  auto generate = [&](std::string* decode_worker) {
    v1::GenerateRequest req;
    req.set_text(kPrompt);
    req.mutable_sampling()->set_max_tokens(8);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + 30s);
    auto reader = stub->Generate(&ctx, req);
    v1::GenerateResponse r;
    while (reader->Read(&r))
      if (r.finished() && decode_worker) *decode_worker = r.decode_worker();
    return reader->Finish();
  };
  // Both are up at the router, but of different generations.
  ASSERT_TRUE(wait_up(router->http_port(), prefill->grpc(), "prefill"));
  ASSERT_TRUE(wait_up(router->http_port(), old_decode->grpc(), "decode"));
  const grpc::Status refused = generate(nullptr);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::UNAVAILABLE) << refused.error_message();
  EXPECT_NE(refused.error_message().find("KV-compatible"), std::string::npos) << refused.error_message();

  auto new_decode = start_worker("decode", {"--router", router->grpc(), "--kv-compat", "gen-2"});
  ASSERT_TRUE(new_decode->wait_ready(60s)) << new_decode->log();
  ASSERT_EQ(wait_probe(new_decode->probe_port(), "/readyz", 200, 30s).status, 200);
  ASSERT_TRUE(wait_up(router->http_port(), new_decode->grpc(), "decode"));
  for (int i = 0; i < 4; ++i) {
    std::string used;
    const grpc::Status s = generate(&used);
    ASSERT_TRUE(s.ok()) << s.error_message() << router->log();
    EXPECT_EQ(used, new_decode->grpc()) << "paired across generations";
  }
}

// As in a pod: workers bound on the wildcard address, advertising another (here loopback, the
// pod IP in Kubernetes) with fixed kvtransfer ports. The descriptors carry the advertised host and
// the fixed ports, and KV moves through them: greedy through the router equals in process, also
// right after the decode worker restarted on the same ports.
TEST(WorkerDeploy, WildcardBoundWorkersAdvertiseTheirAddressAndFixedKvPortsAndRestartOnThem) {
  auto router = start_router();
  ASSERT_TRUE(router->wait_ready(30s)) << router->log();
  // Four distinct pairs (each draw only checks that its own pair is free now).
  int p_port, d_port, p_kv, d_kv;
  do {
    p_port = testing::free_port_pair(), d_port = testing::free_port_pair();
    p_kv = testing::free_port_pair(), d_kv = testing::free_port_pair();
  } while (std::set<int>{p_port, d_port, p_kv, d_kv}.size() < 4);
  auto flags = [&](int port, int kv) {
    return std::vector<std::string>{"--host", "0.0.0.0", "--port", std::to_string(port), "--advertise",
                                    "127.0.0.1:" + std::to_string(port), "--kv-port", std::to_string(kv), "--tp", "2",
                                    "--router", router->grpc()};
  };
  auto prefill = start_worker("prefill", flags(p_port, p_kv));
  auto decode = start_worker("decode", flags(d_port, d_kv));
  ASSERT_TRUE(prefill->wait_ready(60s)) << prefill->log();
  ASSERT_TRUE(decode->wait_ready(60s)) << decode->log();
  const std::string advertised = "127.0.0.1:" + std::to_string(d_port);
  ASSERT_TRUE(wait_up(router->http_port(), "127.0.0.1:" + std::to_string(p_port), "prefill")) << router->log();
  ASSERT_TRUE(wait_up(router->http_port(), advertised, "decode")) << router->log();

  // The decode worker's kvtransfer group: rank r at the advertised host, port kv + r.
  auto worker = worker::Worker::NewStub(grpc::CreateChannel(advertised, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + 10s);
  worker::InfoRequest none;
  worker::WorkerInfo info;
  ASSERT_TRUE(worker->Info(&ctx, none, &info).ok());
  worker::KvGroup group;
  ASSERT_TRUE(group.ParseFromString(info.kv_endpoint()));
  ASSERT_EQ(group.rank_endpoints_size(), 2);
  EXPECT_EQ(group.rank_endpoints(0), "tcp://127.0.0.1:" + std::to_string(d_kv));
  EXPECT_EQ(group.rank_endpoints(1), "tcp://127.0.0.1:" + std::to_string(d_kv + 1));

  const std::vector<int> want = reference_tokens(32, /*ignore_eos=*/false);
  auto stub = v1::Generation::NewStub(grpc::CreateChannel(router->grpc(), grpc::InsecureChannelCredentials()));
  v1::GenerateRequest req;
  req.set_text(kPrompt);
  req.mutable_sampling()->set_max_tokens(32);
  grpc::ClientContext gctx;
  gctx.set_deadline(std::chrono::system_clock::now() + 60s);
  auto reader = stub->Generate(&gctx, req);
  v1::GenerateResponse r;
  std::vector<int> tokens;
  while (reader->Read(&r)) tokens.insert(tokens.end(), r.token_ids().begin(), r.token_ids().end());
  const grpc::Status s = reader->Finish();
  ASSERT_TRUE(s.ok()) << s.error_message() << prefill->log() << decode->log();
  EXPECT_EQ(tokens, want);

  // The decode worker dies and comes back on the same ports (a container restart in its pod).
  // The prefill worker's cached connection to that kvtransfer endpoint belongs to the dead
  // process: the new one's incarnation, in its Reserve answer, makes the prefill side drop it
  // and handshake again, so the first request is served at once, without a migration.
  decode->kill9();
  auto restarted = start_worker("decode", flags(d_port, d_kv));
  ASSERT_TRUE(restarted->wait_ready(60s)) << restarted->log();
  ASSERT_TRUE(wait_up(router->http_port(), advertised, "decode")) << router->log();
  grpc::ClientContext again;
  again.set_deadline(std::chrono::system_clock::now() + 60s);
  auto second = stub->Generate(&again, req);
  tokens.clear();
  int migrations = -1;
  while (second->Read(&r)) {
    tokens.insert(tokens.end(), r.token_ids().begin(), r.token_ids().end());
    if (r.finished()) migrations = r.migrations();
  }
  const grpc::Status s2 = second->Finish();
  ASSERT_TRUE(s2.ok()) << s2.error_message() << prefill->log() << restarted->log();
  EXPECT_EQ(tokens, want);
  EXPECT_EQ(migrations, 0) << router->log() << prefill->log();
}

}  // namespace
}  // namespace pdserve
