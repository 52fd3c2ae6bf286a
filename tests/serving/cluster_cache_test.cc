// Cache-aware placement on a real `pdserve up` cluster (2 prefill + 2 decode workers, push and
// pull, or 4 aggregated workers; KV events on by default): a repeated ~375-token prompt reports
// at least 60 % of its tokens cached on its second send, for each of 8 distinct prompts; every
// turn after the first of a multi-turn conversation reports cached tokens; after a randomized
// multi-turn workload, the router's KV index (/debug/kv_index, and its /metrics) equals each
// worker's engine key set (Worker.Info with include_cached_keys) within 1 s of quiescence; and
// decode-local prefill takes the short uncached parts off the prefill workers; and P/D under KV
// pressure serves more requests at once than the decode cache holds, each with its own tokens.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <httplib.h>

#include <filesystem>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <sstream>
#include <thread>

#include "kvevents/wire.h"
#include "proto/pdserve.grpc.pb.h"
#include "proto/worker.grpc.pb.h"
#include "tests/serving/generation_stub.h"
#include "tests/serving/cluster_process.h"
#include "tests/serving/metrics_text.h"

namespace pdserve {
namespace {

using namespace std::chrono_literals;
using testing::Cluster;

struct Served {
  std::vector<int> output;
  int cached_tokens = 0, transferred_blocks = 0;
  bool decode_local_prefill = false;
  std::string prefill_worker, decode_worker, error;
};

Served generate(v1::Generation::Stub& stub, const std::vector<int>& prompt, int max_tokens) {
  v1::GenerateRequest req;
  for (int t : prompt) req.mutable_token_ids()->add_ids(t);
  req.mutable_sampling()->set_temperature(0);
  req.mutable_sampling()->set_max_tokens(max_tokens);
  req.mutable_sampling()->set_ignore_eos(true);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + 60s);
  auto reader = stub.Generate(&ctx, req);
  Served out;
  v1::GenerateResponse r;
  while (reader->Read(&r)) {
    out.output.insert(out.output.end(), r.token_ids().begin(), r.token_ids().end());
    if (r.finished()) {
      out.cached_tokens = r.cached_tokens();
      out.transferred_blocks = r.timings().transferred_blocks();
      out.decode_local_prefill = r.timings().decode_local_prefill();
      out.prefill_worker = r.prefill_worker();
      out.decode_worker = r.decode_worker();
    }
  }
  const grpc::Status s = reader->Finish();
  if (!s.ok()) out.error = s.error_message();
  return out;
}

std::vector<int> random_tokens(std::mt19937& rng, int n) {
  std::vector<int> t;
  for (int i = 0; i < n; ++i) t.push_back(3 + int(rng() % 509));  // stories260K: 512 ids.
  return t;
}

// Push and pull on 2 prefill + 2 decode workers (prompts prefill on the prefill workers), and 4
// aggregated workers.
class ClusterCache : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    ready_file_ = std::filesystem::temp_directory_path() / ("pdserve_cache_" + std::to_string(getpid()) + ".json");
    std::vector<std::string> args = {"--ready-file", ready_file_.string()};
    if (GetParam() == "aggregated")
      args.insert(args.end(), {"--aggregated", "4"});
    else
      args.insert(args.end(), {"--prefill", "2", "--decode", "2", "--kv-mode", GetParam()});
    cluster_ = std::make_unique<Cluster>(args);
    ASSERT_TRUE(cluster_->wait_ready(120s)) << cluster_->log();
    std::ifstream in(ready_file_);
    const nlohmann::json j = nlohmann::json::parse(in);
    for (const auto& w : j["workers"]) workers_.push_back(w["grpc"].get<std::string>());
    ASSERT_EQ(workers_.size(), 4u);
    stub_ = testing::connected_generation_stub(cluster_->grpc());
    ASSERT_TRUE(stub_ != nullptr);
    // The router follows every worker's events before the test starts.
    const auto deadline = std::chrono::steady_clock::now() + 20s;
    while (std::chrono::steady_clock::now() < deadline && !all_exact()) std::this_thread::sleep_for(50ms);
    ASSERT_TRUE(all_exact()) << cluster_->log();
  }
  void TearDown() override { std::filesystem::remove(ready_file_); }

  // The router's index of `worker`: its state and keys (hex).
  std::pair<std::string, std::set<std::string>> router_index(const std::string& worker) {
    httplib::Client http("127.0.0.1", cluster_->http_port());
    auto res = http.Get("/debug/kv_index?worker=" + worker);
    if (!res || res->status != 200) return {"", {}};
    const nlohmann::json j = nlohmann::json::parse(res->body);
    std::set<std::string> keys;
    for (const auto& k : j["keys"]) keys.insert(k.get<std::string>());
    return {j["state"].is_string() ? j["state"].get<std::string>() : "", keys};
  }
  // The router's /debug/kv_index answer for `worker`, less its keys.
  std::string debug_index(const std::string& worker) {
    httplib::Client http("127.0.0.1", cluster_->http_port());
    auto res = http.Get("/debug/kv_index?worker=" + worker);
    if (!res) return "no answer";
    nlohmann::json j = nlohmann::json::parse(res->body);
    j["num_keys"] = j["keys"].size();
    j.erase("keys");
    return j.dump();
  }
  std::set<std::string> engine_keys(const std::string& worker) {
    auto stub = worker::Worker::NewStub(grpc::CreateChannel(worker, grpc::InsecureChannelCredentials()));
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + 5s);
    worker::InfoRequest req;
    req.set_include_cached_keys(true);
    worker::WorkerInfo info;
    EXPECT_TRUE(stub->Info(&ctx, req, &info).ok());
    std::set<std::string> keys;
    for (const std::string& k : info.cached_keys()) keys.insert(kvevents::key_from_bytes(k)->hex());
    return keys;
  }
  bool all_exact() {
    for (const std::string& w : workers_)
      if (router_index(w).first != "exact") return false;
    return true;
  }
  bool index_equals_engines() {
    for (const std::string& w : workers_) {
      auto [state, keys] = router_index(w);
      if (state != "exact" || keys != engine_keys(w)) return false;
    }
    return true;
  }

  std::filesystem::path ready_file_;
  std::unique_ptr<Cluster> cluster_;
  std::vector<std::string> workers_;
  std::unique_ptr<v1::Generation::Stub> stub_;
};

TEST_P(ClusterCache, RepeatedPromptsAndLaterTurnsHitTheCache) {
  std::mt19937 rng(20261202);
  constexpr int kPrompts = 8, kLen = 375;
  std::vector<std::vector<int>> prompts;
  for (int i = 0; i < kPrompts; ++i) {
    std::vector<int> p = {1};  // BOS.
    const std::vector<int> rest = random_tokens(rng, kLen - 1);
    p.insert(p.end(), rest.begin(), rest.end());
    prompts.push_back(p);
  }
  const auto start = std::chrono::steady_clock::now();
  auto since = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(); };
  std::vector<Served> first;
  for (const auto& p : prompts) {
    first.push_back(generate(*stub_, p, 4));
    ASSERT_EQ(first.back().error, "") << cluster_->log();
  }
  // The blocks' events reach the router after the answers do (more so on a loaded machine):
  // cache-aware placement of the second sends needs them, so wait until the router's index of
  // every worker is its engine's keys.
  for (const auto deadline = std::chrono::steady_clock::now() + 20s;
       std::chrono::steady_clock::now() < deadline && !index_equals_engines();)
    std::this_thread::sleep_for(50ms);
  ASSERT_TRUE(index_equals_engines()) << cluster_->log();
  std::set<std::string> prefill_used;
  int hits = 0;
  for (int i = 0; i < kPrompts; ++i) {
    const Served again = generate(*stub_, prompts[size_t(i)], 4);
    ASSERT_EQ(again.error, "") << cluster_->log();
    EXPECT_EQ(again.output, first[size_t(i)].output) << "prompt " << i;
    EXPECT_GE(again.cached_tokens, kLen * 6 / 10) << "prompt " << i << " first on " << first[size_t(i)].prefill_worker
                                                  << ", again on " << again.prefill_worker << " at " << since()
                                                  << " s: " << debug_index(first[size_t(i)].prefill_worker);
    hits += again.cached_tokens >= kLen * 6 / 10;
    prefill_used.insert(first[size_t(i)].prefill_worker);
  }
  std::cerr << "second sends with >= 60 % cached: " << hits << " of " << kPrompts << "; first sends used "
            << prefill_used.size() << " prefill workers\n";

  // Multi-turn: each turn's prompt is the last one, its answer and a new user message.
  for (int c = 0; c < 3; ++c) {
    std::vector<int> prompt = {1};
    const std::vector<int> opening = random_tokens(rng, 120);
    prompt.insert(prompt.end(), opening.begin(), opening.end());
    for (int turn = 1; turn <= 3; ++turn) {
      const Served s = generate(*stub_, prompt, 8);
      ASSERT_EQ(s.error, "") << cluster_->log();
      if (turn >= 2) {
        EXPECT_GT(s.cached_tokens, 0) << "conversation " << c << " turn " << turn;
      }
      std::cerr << "conversation " << c << " turn " << turn << ": " << s.cached_tokens << " of " << prompt.size()
                << " cached on " << s.prefill_worker << "\n";
      prompt.insert(prompt.end(), s.output.begin(), s.output.end());
      const std::vector<int> user = random_tokens(rng, 40);
      prompt.insert(prompt.end(), user.begin(), user.end());
    }
  }
}

TEST_P(ClusterCache, RouterIndexEqualsEveryEnginesKeysAfterAMultiTurnWorkload) {
  // Four concurrent clients, each with conversations of random turns over shared system prompts.
  std::vector<std::vector<int>> systems;
  std::mt19937 seed_rng(77);
  for (int i = 0; i < 2; ++i) {
    std::vector<int> s = {1};
    const std::vector<int> body = random_tokens(seed_rng, 40 + int(seed_rng() % 60));
    s.insert(s.end(), body.begin(), body.end());
    systems.push_back(s);
  }
  std::mutex mu;
  std::vector<std::string> errors;
  std::vector<std::thread> clients;
  for (int c = 0; c < 4; ++c)
    clients.emplace_back([&, c] {
      std::mt19937 rng(1000 + c);
      for (int conv = 0; conv < 2; ++conv) {
        std::vector<int> prompt = systems[rng() % systems.size()];
        const int turns = 2 + int(rng() % 3);
        for (int t = 0; t < turns && prompt.size() < 400; ++t) {
          const std::vector<int> user = random_tokens(rng, 10 + int(rng() % 40));
          prompt.insert(prompt.end(), user.begin(), user.end());
          const Served s = generate(*stub_, prompt, 1 + int(rng() % 12));
          if (!s.error.empty()) {
            std::lock_guard lock(mu);
            errors.push_back(s.error);
            return;
          }
          prompt.insert(prompt.end(), s.output.begin(), s.output.end());
        }
      }
    });
  for (auto& t : clients) t.join();
  ASSERT_TRUE(errors.empty()) << errors.front();
  const auto quiet = std::chrono::steady_clock::now();
  bool equal = false;
  while (!(equal = index_equals_engines()) && std::chrono::steady_clock::now() < quiet + 1s)
    std::this_thread::sleep_for(20ms);
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - quiet).count();
  size_t total = 0;
  for (const std::string& w : workers_) {
    const auto [state, keys] = router_index(w);
    const std::set<std::string> engine = engine_keys(w);
    total += engine.size();
    EXPECT_EQ(state, "exact") << w;
    EXPECT_EQ(keys, engine) << w << ": router " << keys.size() << " keys, engine " << engine.size();
  }
  EXPECT_TRUE(equal) << "not equal within 1 s of quiescence";
  EXPECT_GT(total, 0u);
  // The router's /metrics says the same: every worker exact, holding its engine's key count.
  httplib::Client http("127.0.0.1", cluster_->http_port());
  auto metrics = http.Get("/metrics");
  ASSERT_TRUE(metrics);
  for (const std::string& w : workers_) {
    const std::string exact = "pdserve:kv_index_state{worker=\"" + w + "\",state=\"exact\"} 1\n";
    EXPECT_NE(metrics->body.find(exact), std::string::npos) << exact;
    const std::string blocks =
        "pdserve:kv_index_blocks{worker=\"" + w + "\"} " + std::to_string(engine_keys(w).size()) + "\n";
    EXPECT_NE(metrics->body.find(blocks), std::string::npos) << blocks;
  }
  std::cerr << "index equal to the engines' " << total << " keys " << took << " s after quiescence\n";
}

INSTANTIATE_TEST_SUITE_P(Modes, ClusterCache, ::testing::Values("push", "pull", "aggregated"));

// The router's /metrics counter `name` (-1 without an answer).
double router_metric(int http_port, const std::string& name) {
  const std::optional<std::string> text = testing::router_metrics_text(http_port);
  return text ? testing::metric_value(*text, name) : -1;
}

// The sum of the router's /metrics samples of `name` over the label sets that contain `labels`.
double router_metric_sum(int http_port, const std::string& name, const std::string& labels = "") {
  const std::optional<std::string> text = testing::router_metrics_text(http_port);
  return text ? testing::metric_sum(*text, name, labels) : -1;
}

// Decode-local prefill on a 1 + 1 push cluster at 64 tokens: a cold 100-token prompt goes to
// the prefill worker (its KV moves); its follow-up turn, whose part the decode worker lacks is
// the new message and the output's last partial block, is prefilled by the decode worker
// itself from its cache — no prefill worker, no blocks moved; and a cold short prompt too.
TEST(DecodeLocalPrefill, ShortUncachedPartsArePrefilledOnTheDecodeWorker) {
  Cluster cluster({"--prefill", "1", "--decode", "1", "--local-prefill-tokens", "64"});
  ASSERT_TRUE(cluster.wait_ready(120s)) << cluster.log();
  auto stub = testing::connected_generation_stub(cluster.grpc());
  ASSERT_TRUE(stub != nullptr);
  std::mt19937 rng(5);
  std::vector<int> prompt = {1};
  const std::vector<int> body = random_tokens(rng, 99);
  prompt.insert(prompt.end(), body.begin(), body.end());

  const Served first = generate(*stub, prompt, 8);
  ASSERT_EQ(first.error, "") << cluster.log();
  EXPECT_NE(first.prefill_worker, first.decode_worker) << "100 uncached tokens > 64: a prefill worker's";
  EXPECT_EQ(first.transferred_blocks, 7);  // ceil(100 / 16).
  EXPECT_FALSE(first.decode_local_prefill);
  EXPECT_EQ(router_metric(cluster.http_port(), "pdserve:decode_local_prefills_total"), 0);

  std::vector<int> turn2 = prompt;
  turn2.insert(turn2.end(), first.output.begin(), first.output.end());
  const std::vector<int> user = random_tokens(rng, 30);
  turn2.insert(turn2.end(), user.begin(), user.end());
  // The decode worker holds the prompt's 6 full blocks (its reservation hit nothing, all 7 moved
  // in) and the block the output completed: 138 tokens less 112 cached is under 64.
  Served second;
  for (int attempt = 0; attempt < 50; ++attempt) {  // Until the decode worker's KV events reached the router.
    second = generate(*stub, turn2, 8);
    ASSERT_EQ(second.error, "") << cluster.log();
    if (second.prefill_worker == second.decode_worker) break;
    std::this_thread::sleep_for(20ms);
  }
  EXPECT_EQ(second.prefill_worker, first.decode_worker) << "the decode worker prefilled it";
  EXPECT_EQ(second.decode_worker, first.decode_worker);
  EXPECT_GE(second.cached_tokens, 96);
  EXPECT_EQ(second.transferred_blocks, 0);
  EXPECT_TRUE(second.decode_local_prefill);
  EXPECT_GE(router_metric(cluster.http_port(), "pdserve:decode_local_prefills_total"), 1);

  const std::vector<int> cold = {1, 50, 60, 70, 80, 90};
  const Served short_cold = generate(*stub, cold, 4);
  ASSERT_EQ(short_cold.error, "");
  EXPECT_EQ(short_cold.prefill_worker, short_cold.decode_worker) << "6 uncached tokens <= 64";
  EXPECT_EQ(short_cold.transferred_blocks, 0);
  EXPECT_TRUE(short_cold.decode_local_prefill);
  // Only the first request's 7 blocks moved: the router's bytes are what the prefill worker put
  // and the decode worker received (their counters reach the router with the next Info poll,
  // every 200 ms).
  const double routed = router_metric_sum(cluster.http_port(), "pdserve:kv_transfer_bytes_total");
  double put = 0, received = 0;
  for (int poll = 0; poll < 50 && (put != routed || received != routed); ++poll, std::this_thread::sleep_for(100ms)) {
    put = router_metric_sum(cluster.http_port(), "pdserve:worker_kv_transfer_bytes_total", "role=\"prefill\"");
    received = router_metric_sum(cluster.http_port(), "pdserve:worker_kv_transfer_bytes_total", "role=\"decode\"");
  }
  EXPECT_GT(routed, 0);
  EXPECT_EQ(routed, put);
  EXPECT_EQ(routed, received);
}

TEST(DecodeLocalPrefill, IsRefusedWhereNoDecodeWorkerChoosesIt) {
  const std::string model = testing::stories_bin();
  const testing::CommandOutput up = testing::run_command(
      "timeout 60 " + testing::kBin + " up --model '" + model + "' --aggregated 1 --local-prefill-tokens 8 2>&1");
  EXPECT_EQ(up.exit_code, 2);
  EXPECT_NE(up.out.find("--local-prefill-tokens applies to P/D"), std::string::npos) << up.out;
  const testing::CommandOutput router =
      testing::run_command("timeout 60 " + std::string(PDSERVE_BINARY_DIR) + "/router/pdserve-router --model '" +
                           model + "' --kv-mode aggregated --local-prefill-tokens 8 2>&1");
  EXPECT_EQ(router.exit_code, 2);
  EXPECT_NE(router.out.find("needs --kv-mode push or pull"), std::string::npos) << router.out;
}

// P/D under KV pressure, push and pull on 1 prefill + 1 decode worker whose device caches hold
// about two of these requests (host tiers beside them): 12 requests at once all complete, each
// with the tokens it gets alone on the same cluster, while the decode worker preempts (its
// sequences grow block by block) and new prompts wait for room — in pull on the decode worker,
// for the blocks the transferred prompt needs, in push in the router, around Reserve.
class ClusterPressure : public ::testing::TestWithParam<std::string> {};

TEST_P(ClusterPressure, MoreRequestsThanTheDecodeCacheHoldsAllCompleteWithTheirOwnTokens) {
  Cluster cluster({"--prefill", "1", "--decode", "1", "--kv-mode", GetParam(), "--kv-cache-bytes", "1500000",
                   "--host-kv-bytes", "67108864", "--kv-events", "off"});
  ASSERT_TRUE(cluster.wait_ready(120s)) << cluster.log();
  auto stub = testing::connected_generation_stub(cluster.grpc());
  ASSERT_TRUE(stub != nullptr);
  std::mt19937 rng(23);
  std::vector<std::vector<int>> prompts;
  for (int i = 0; i < 12; ++i) {
    std::vector<int> p = {1};
    for (int t : random_tokens(rng, 100 + int(rng() % 40))) p.push_back(t);
    prompts.push_back(p);
  }
  const int kMaxTokens = 200;  // With the prompt, 19 to 21 of the 73 blocks each.
  std::vector<Served> together(prompts.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < prompts.size(); ++i)
    threads.emplace_back([&, i] { together[i] = generate(*stub, prompts[i], kMaxTokens); });
  for (auto& t : threads) t.join();
  // The workers' counters reach the router with its health polls.
  double preemptions = 0;
  for (auto deadline = std::chrono::steady_clock::now() + 10s;
       preemptions <= 0 && std::chrono::steady_clock::now() < deadline; std::this_thread::sleep_for(100ms))
    preemptions = router_metric_sum(cluster.http_port(), "pdserve:worker_preemptions_total");
  for (size_t i = 0; i < prompts.size(); ++i) {
    ASSERT_TRUE(together[i].error.empty()) << i << ": " << together[i].error;
    const Served alone = generate(*stub, prompts[i], kMaxTokens);
    ASSERT_TRUE(alone.error.empty()) << alone.error;
    EXPECT_EQ(together[i].output, alone.output) << i;
    EXPECT_EQ(int(together[i].output.size()), kMaxTokens) << i;
  }
  std::cerr << GetParam() << ": " << preemptions << " preemptions\n";
  EXPECT_GT(preemptions, 0) << "the decode cache was never short";
}

INSTANTIATE_TEST_SUITE_P(Modes, ClusterPressure, ::testing::Values("push", "pull", "pull-host"));

// pull-host when the prefill worker's host tier cannot take a prompt (2 blocks, every prompt 7
// or more): each request is read from the prefill worker's device blocks instead, counted as a
// fallback, with the tokens a plain pull cluster gives; with room, every prompt is copied.
TEST(ClusterPullHost, AFullHostTierFallsBackToDeviceReadsWithPullsTokens) {
  std::mt19937 rng(31);
  std::vector<std::vector<int>> prompts;
  for (int i = 0; i < 6; ++i) {
    std::vector<int> p = {1};
    for (int t : random_tokens(rng, 100 + int(rng() % 40))) p.push_back(t);
    prompts.push_back(p);
  }
  auto serve = [&](const std::vector<std::string>& args, double* copied, double* fallbacks) {
    Cluster cluster(args);
    EXPECT_TRUE(cluster.wait_ready(120s)) << cluster.log();
    auto stub = testing::connected_generation_stub(cluster.grpc());
    std::vector<std::vector<int>> outputs;
    if (!stub) {
      ADD_FAILURE() << "the router's channel did not connect";
      return outputs;
    }
    for (const auto& p : prompts) {
      const Served s = generate(*stub, p, 32);
      EXPECT_TRUE(s.error.empty()) << s.error;
      EXPECT_GT(s.transferred_blocks, 0) << "the prompt's KV did not move";
      outputs.push_back(s.output);
    }
    const int n = int(prompts.size());
    for (auto deadline = std::chrono::steady_clock::now() + 10s;
         *copied + *fallbacks < n && std::chrono::steady_clock::now() < deadline; std::this_thread::sleep_for(100ms)) {
      const std::optional<std::string> text = testing::router_metrics_text(cluster.http_port());
      if (!text) continue;
      *copied = testing::metric_sum(*text, "pdserve:worker_host_copies_total", "outcome=\"copied\"");
      *fallbacks = testing::metric_sum(*text, "pdserve:worker_host_copies_total", "outcome=\"fallback\"");
    }
    return outputs;
  };
  const std::vector<std::string> base = {"--prefill", "1", "--decode", "1", "--kv-events", "off"};
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> a = base;
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  };
  double copied = 0, fallbacks = 0;
  const auto pulled = serve(with({"--kv-mode", "pull"}), &copied, &fallbacks);
  EXPECT_EQ(copied + fallbacks, 0);
  const auto full = serve(with({"--kv-mode", "pull-host", "--host-kv-bytes", "40960"}), &copied, &fallbacks);
  EXPECT_EQ(copied, 0);
  EXPECT_EQ(fallbacks, double(prompts.size()));
  EXPECT_EQ(full, pulled);
  copied = fallbacks = 0;
  const auto roomy = serve(with({"--kv-mode", "pull-host", "--host-kv-bytes", "67108864"}), &copied, &fallbacks);
  EXPECT_EQ(copied, double(prompts.size()));
  EXPECT_EQ(fallbacks, 0);
  EXPECT_EQ(roomy, pulled);
}

// The peer tier's reverse reuse (docs/kv_offload.md): after a conversation's turn, the decode
// worker's host tier holds the turn's prompt and answer, of which the prefill worker computed
// only the prompt; the next turn's prefill reads the rest from the decode worker instead of
// computing it — and every turn's tokens equal those of the same cluster without the peer tier,
// in pull and in push.
class ClusterPeerTier : public ::testing::TestWithParam<std::string> {};

TEST_P(ClusterPeerTier, ThePrefillWorkerReadsTheAnswersFromTheDecodeWorkersHostTier) {
  std::mt19937 rng(57);
  constexpr int kConversations = 3, kTurns = 3, kMaxTokens = 48;
  auto serve = [&](bool peer, std::vector<int>* cached, std::string* metrics) {
    std::vector<std::string> args = {"--prefill", "1", "--decode", "1", "--kv-mode", GetParam(), "--host-kv-bytes",
                                     "67108864", "--local-prefill-tokens", "0"};
    if (peer) args.push_back("--kv-peer-tier");
    Cluster cluster(args);
    std::vector<std::vector<int>> outputs;
    if (!cluster.wait_ready(120s)) {
      ADD_FAILURE() << cluster.log();
      return outputs;
    }
    auto stub = testing::connected_generation_stub(cluster.grpc());
    if (!stub) {
      ADD_FAILURE() << "the router's channel did not connect";
      return outputs;
    }
    std::mt19937 r(rng);  // The same conversations for both clusters.
    // The decode worker's host tier holds every finished turn's prompt and answer: the full
    // blocks of each conversation's history but its last token (whose KV is never computed).
    double decode_host_blocks = 0;
    for (int c = 0; c < kConversations; ++c) {
      std::vector<int> history = {1};
      int held = 0;  // Of this conversation's blocks, by the decode worker's host tier.
      for (int t = 0; t < kTurns; ++t) {
        for (int x : random_tokens(r, 40 + int(r() % 30))) history.push_back(x);
        // The router names the decode worker by its KV events, which come before its Info
        // reports the blocks: the next turn goes once the Info does (the turns follow each other
        // faster than any client would).
        for (auto deadline = std::chrono::steady_clock::now() + 10s; std::chrono::steady_clock::now() < deadline;
             std::this_thread::sleep_for(20ms)) {
          const std::optional<std::string> text = testing::router_metrics_text(cluster.http_port());
          if (text && testing::metric_sum(*text, "pdserve:worker_kv_tier_cached_blocks",
                                          "role=\"decode\",tier=\"host\"") >= decode_host_blocks)
            break;
        }
        const Served s = generate(*stub, history, kMaxTokens);
        EXPECT_TRUE(s.error.empty()) << s.error;
        EXPECT_FALSE(s.decode_local_prefill);
        outputs.push_back(s.output);
        cached->push_back(s.cached_tokens);
        history.insert(history.end(), s.output.begin(), s.output.end());
        decode_host_blocks += int(history.size() - 1) / 16 - held;
        held = int(history.size() - 1) / 16;
      }
    }
    // Info polls lag: read the counters once they show every later turn's read (2 blocks at least).
    for (auto deadline = std::chrono::steady_clock::now() + 10s; std::chrono::steady_clock::now() < deadline;
         std::this_thread::sleep_for(50ms)) {
      const std::optional<std::string> text = testing::router_metrics_text(cluster.http_port());
      if (text) *metrics = *text;
      if (!text) continue;
      if (!peer) break;
      const double read = testing::metric_sum(*text, "pdserve:worker_kv_tier_loaded_blocks_total",
                                              "role=\"prefill\",tier=\"peer\"");
      if (read >= 2.0 * kConversations * (kTurns - 1) &&
          testing::metric_sum(*text, "pdserve:worker_kv_tier_leased_blocks_total", "role=\"decode\",tier=\"peer\"") >= read)
        break;
    }
    return outputs;
  };
  std::vector<int> plain_cached, peer_cached;
  std::string plain_metrics, peer_metrics;
  const auto plain = serve(false, &plain_cached, &plain_metrics);
  const auto peered = serve(true, &peer_cached, &peer_metrics);
  ASSERT_EQ(plain.size(), size_t(kConversations * kTurns));
  EXPECT_EQ(peered, plain);
  // Every later turn: the prefill worker held the last prompt; with the peer tier it also read
  // the last answer's blocks (48 tokens: 3 blocks, at least 2 of them full beyond the prompt's).
  for (int c = 0; c < kConversations; ++c)
    for (int t = 1; t < kTurns; ++t) {
      const size_t i = size_t(c * kTurns + t);
      EXPECT_GE(peer_cached[i], plain_cached[i] + 32) << "conversation " << c << " turn " << t;
    }
  const double read = testing::metric_sum(peer_metrics, "pdserve:worker_kv_tier_loaded_blocks_total",
                                          "role=\"prefill\",tier=\"peer\"");
  const double leased = testing::metric_sum(peer_metrics, "pdserve:worker_kv_tier_leased_blocks_total",
                                            "role=\"decode\",tier=\"peer\"");
  EXPECT_GE(read, 2.0 * kConversations * (kTurns - 1)) << peer_metrics;
  EXPECT_GE(leased, read);
  EXPECT_EQ(testing::metric_sum(peer_metrics, "pdserve:worker_kv_tier_stale_loads_total", "tier=\"peer\""), 0);
  EXPECT_EQ(testing::metric_sum(plain_metrics, "pdserve:worker_kv_tier_leases_total", "tier=\"peer\""), 0);
}

INSTANTIATE_TEST_SUITE_P(Modes, ClusterPeerTier, ::testing::Values("pull", "push"));

}  // namespace
}  // namespace pdserve
