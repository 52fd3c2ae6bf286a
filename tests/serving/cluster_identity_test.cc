// Output identity of the prefix cache on real `pdserve up` clusters: 200 seeded multi-turn
// conversations (4 turns; groups share a system prompt; each turn resends the previous prompt,
// the output verbatim and a new user message; half greedy, half sampled with per-request seeds)
// give the same tokens on every topology with the cache on as the in-process engine with the
// cache off — aggregated; push and pull at TP pairs (1,1), (1,2), (2,1); with decode-local
// prefill; with every worker's device cache at a quarter of the working set and a host tier (also
// in pull-host, the decode side reading every prompt from the prefill worker's host tier); and
// a cluster with the cache off, which ties the two ends together. Every arm with
// the cache on must also have reused blocks (cached tokens > 0, and on the decode side for P/D),
// so the identity is not that of a cache that never hit. And an aggregated worker with a host and
// a filesystem tier serves earlier prompts from them, also after a restart.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <httplib.h>

#include <atomic>
#include <filesystem>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "engine/engine.h"
#include "proto/pdserve.grpc.pb.h"
#include "tests/serving/generation_stub.h"
#include "tests/serving/cluster_process.h"
#include "tests/serving/metrics_text.h"

namespace pdserve {
namespace {

using namespace std::chrono_literals;
using testing::Cluster;

constexpr int kConversations = 200, kTurns = 4;

// One conversation's scripted inputs: its system prompt's group, each turn's user message and
// output length, and its sampling (greedy, or sampled with a seed per turn).
struct Script {
  int group = 0;
  std::vector<std::vector<int>> users;
  std::vector<int> max_tokens;
  bool sampled = false;
};

struct Conversations {
  std::vector<std::vector<int>> systems;
  std::vector<Script> scripts;
};

Conversations make_conversations() {
  std::mt19937 rng(20261203);
  Conversations cs;
  for (int g = 0; g < 4; ++g) {
    std::vector<int> s = {1};
    for (int i = int(20 + rng() % 40); i > 0; --i) s.push_back(int(3 + rng() % 500));
    cs.systems.push_back(s);
  }
  for (int c = 0; c < kConversations; ++c) {
    Script s;
    s.group = c % 4;
    s.sampled = c % 2 == 1;
    for (int t = 0; t < kTurns; ++t) {
      std::vector<int> u;
      for (int i = int(3 + rng() % 20); i > 0; --i) u.push_back(int(3 + rng() % 500));
      s.users.push_back(u);
      s.max_tokens.push_back(int(4 + (c * 7 + t * 3) % 20));
    }
    cs.scripts.push_back(s);
  }
  return cs;
}

uint64_t seed_of(int c, int t) { return uint64_t(c * 100 + t); }

// What one request gave: its tokens and how many prompt tokens the cache held (on the worker
// that computed the prompt, and on the decode side of a P/D placement).
struct Answer {
  std::vector<int> tokens;
  int cached_tokens = 0, decode_cached_tokens = 0;
  std::string error;
};

// Runs the conversations turn by turn: `turn` answers every conversation's prompt of one turn.
using TurnFn = std::function<std::vector<Answer>(int turn, const std::vector<std::vector<int>>& prompts)>;

struct Outcome {
  std::vector<std::vector<std::vector<int>>> outputs;  // [conversation][turn].
  int64_t cached_tokens = 0, decode_cached_tokens = 0;
};

Outcome run_conversations(const Conversations& cs, const TurnFn& turn_fn) {
  Outcome out;
  out.outputs.resize(cs.scripts.size());
  std::vector<std::vector<int>> prompts;
  for (const Script& s : cs.scripts) prompts.push_back(cs.systems[size_t(s.group)]);
  for (int t = 0; t < kTurns; ++t) {
    for (size_t c = 0; c < prompts.size(); ++c) {
      const auto& u = cs.scripts[c].users[size_t(t)];
      prompts[c].insert(prompts[c].end(), u.begin(), u.end());
    }
    const std::vector<Answer> answers = turn_fn(t, prompts);
    for (size_t c = 0; c < prompts.size(); ++c) {
      EXPECT_EQ(answers[c].error, "") << "conversation " << c << " turn " << t;
      out.outputs[c].push_back(answers[c].tokens);
      out.cached_tokens += answers[c].cached_tokens;
      out.decode_cached_tokens += answers[c].decode_cached_tokens;
      prompts[c].insert(prompts[c].end(), answers[c].tokens.begin(), answers[c].tokens.end());
    }
  }
  return out;
}

// The reference: the in-process engine with the cache off.
Outcome reference(const Conversations& cs) {
  auto model = engine::load_model({testing::stories_bin()});
  EXPECT_TRUE(model.ok()) << model.status();
  engine::EngineOptions options;
  options.prefix_cache.enabled = false;
  auto e = engine::Engine::create(std::move(*model), options);
  EXPECT_TRUE(e.ok()) << e.status();
  return run_conversations(cs, [&](int t, const std::vector<std::vector<int>>& prompts) {
    std::vector<Answer> answers(prompts.size());
    for (size_t c = 0; c < prompts.size(); ++c) {
      const Script& s = cs.scripts[c];
      engine::SamplingParams p;
      p.max_tokens = s.max_tokens[size_t(t)];
      p.ignore_eos = true;
      if (s.sampled) {
        p.temperature = 0.9f;
        p.top_p = 0.9f;
        p.seed = seed_of(int(c), t);
      }
      EXPECT_TRUE((*e)->add_request({std::to_string(c), prompts[c], p}, [&answers, c](const engine::TokenEvent& ev) {
                       if (ev.token >= 0) answers[c].tokens.push_back(ev.token);
                     }).ok());
    }
    EXPECT_TRUE((*e)->run_until_idle().ok());
    return answers;
  });
}

const Outcome& cached_reference() {
  static const Outcome r = reference(make_conversations());
  return r;
}

// Sends `req` and reads its whole stream.
Answer ask(v1::Generation::Stub& stub, const v1::GenerateRequest& req) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + 60s);
  auto reader = stub.Generate(&ctx, req);
  Answer a;
  v1::GenerateResponse r;
  while (reader->Read(&r)) {
    a.tokens.insert(a.tokens.end(), r.token_ids().begin(), r.token_ids().end());
    if (r.finished()) {
      a.cached_tokens = r.cached_tokens();
      a.decode_cached_tokens = r.timings().decode_cached_tokens();
    }
  }
  const grpc::Status st = reader->Finish();
  if (!st.ok()) a.error = st.error_message();
  return a;
}

Answer generate(v1::Generation::Stub& stub, const std::vector<int>& prompt, const Script& s, int c, int t) {
  v1::GenerateRequest req;
  for (int tok : prompt) req.mutable_token_ids()->add_ids(tok);
  v1::SamplingParams* p = req.mutable_sampling();
  p->set_max_tokens(s.max_tokens[size_t(t)]);
  p->set_ignore_eos(true);
  if (s.sampled) {
    p->set_temperature(0.9f);
    p->set_top_p(0.9f);
    p->set_seed(int64_t(seed_of(c, t)));
  } else {
    p->set_temperature(0);
  }
  return ask(stub, req);
}

// One counter of the router's /metrics (0 when absent).
double metric(int http_port, const std::string& name) {
  const std::optional<std::string> text = testing::router_metrics_text(http_port);
  return text ? testing::metric_value(*text, name) : -1;
}

struct Arm {
  std::string name;
  std::vector<std::string> up_args;
  bool cache_on = true;
  bool pd = true;
  bool decode_local = false;  // Some placements prefill on the decode worker, some do not.
  bool host_tier = false;     // Workers have a host tier, which must have served hits.
  bool via_host = false;      // pull-host: every prompt the decode side read came from a host-tier copy.
};

class ClusterCacheIdentity : public ::testing::TestWithParam<Arm> {};

TEST_P(ClusterCacheIdentity, TwoHundredConversationsGiveTheCacheOffTokens) {
  const Arm& arm = GetParam();
  const Conversations cs = make_conversations();
  const Outcome& want = cached_reference();
  Cluster cluster(arm.up_args);
  ASSERT_TRUE(cluster.wait_ready(120s)) << cluster.log();
  auto stub = testing::connected_generation_stub(cluster.grpc());
  ASSERT_TRUE(stub != nullptr);
  const Outcome got = run_conversations(cs, [&](int t, const std::vector<std::vector<int>>& prompts) {
    // 16 clients at once, as concurrent chats do: placements and batches interleave.
    std::vector<Answer> answers(prompts.size());
    std::atomic<size_t> next{0};
    std::vector<std::thread> clients;
    for (int i = 0; i < 16; ++i)
      clients.emplace_back([&] {
        for (size_t c; (c = next++) < prompts.size();)
          answers[c] = generate(*stub, prompts[c], cs.scripts[c], int(c), t);
      });
    for (auto& th : clients) th.join();
    return answers;
  });
  int mismatches = 0;
  for (size_t c = 0; c < want.outputs.size(); ++c)
    for (size_t t = 0; t < want.outputs[c].size(); ++t)
      if (got.outputs[c][t] != want.outputs[c][t] && ++mismatches <= 5)
        ADD_FAILURE() << arm.name << ": conversation " << c << " turn " << t << " differs from the cache-off engine";
  EXPECT_EQ(mismatches, 0) << arm.name;
  const double local = metric(cluster.http_port(), "pdserve:decode_local_prefills_total");
  std::cerr << arm.name << ": " << got.cached_tokens << " cached prompt tokens, " << got.decode_cached_tokens
            << " on the decode side, " << local << " decode-local prefills\n";
  if (arm.cache_on) {
    EXPECT_GT(got.cached_tokens, 0) << arm.name;
    if (arm.pd) EXPECT_GT(got.decode_cached_tokens, 0) << arm.name << ": the decode side never reused its blocks";
  } else {
    EXPECT_EQ(got.cached_tokens, 0) << arm.name;
    EXPECT_EQ(got.decode_cached_tokens, 0) << arm.name;
  }
  if (arm.host_tier) {
    // The router polls the workers' Info: their counters reach it within a poll or two.
    double host_hits = 0;
    for (auto deadline = std::chrono::steady_clock::now() + 10s;
         host_hits == 0 && std::chrono::steady_clock::now() < deadline; std::this_thread::sleep_for(100ms)) {
      const std::optional<std::string> text = testing::router_metrics_text(cluster.http_port());
      if (text) host_hits = testing::metric_sum(*text, "pdserve:worker_kv_tier_hit_tokens_total", "tier=\"host\"");
    }
    std::cerr << arm.name << ": " << host_hits << " prompt tokens served by the workers' host tiers\n";
    EXPECT_GT(host_hits, 0) << arm.name << ": the host tier never served a hit";
  }
  if (arm.via_host) {
    const std::optional<std::string> text = testing::router_metrics_text(cluster.http_port());
    ASSERT_TRUE(text);
    const double copied = testing::metric_sum(*text, "pdserve:worker_host_copies_total", "outcome=\"copied\"");
    const double fallbacks = testing::metric_sum(*text, "pdserve:worker_host_copies_total", "outcome=\"fallback\"");
    std::cerr << arm.name << ": " << copied << " prompts copied to the prefill worker's host tier, " << fallbacks
              << " read from its device\n";
    EXPECT_GT(copied, 0) << arm.name;
    EXPECT_EQ(fallbacks, 0) << arm.name << ": the 64 MiB host tier had room for every prompt";
  }
  if (arm.decode_local) {
    EXPECT_GT(local, 0) << arm.name;
    EXPECT_LT(local, kConversations * kTurns) << arm.name << ": every placement was local";
  } else {
    EXPECT_EQ(local, 0) << arm.name;
  }
}

Arm pd(const std::string& mode, int ptp, int dtp, int local_tokens = 0, bool cache_on = true) {
  Arm a;
  a.name = (mode == "pull-host" ? "pull_host" : mode) + "_" + std::to_string(ptp) + "_" + std::to_string(dtp) + (local_tokens ? "_local" : "") +
           (cache_on ? "" : "_cache_off");
  a.up_args = {"--prefill", "1", "--prefill-tp", std::to_string(ptp), "--decode", "1", "--decode-tp",
               std::to_string(dtp), "--kv-mode", mode, "--local-prefill-tokens", std::to_string(local_tokens),
               "--prefix-caching", cache_on ? "on" : "off"};
  a.cache_on = cache_on;
  a.decode_local = local_tokens > 0;
  a.via_host = mode == "pull-host";
  return a;
}

Arm aggregated() {
  Arm a;
  a.name = "aggregated";
  a.up_args = {"--aggregated", "1"};
  a.pd = false;
  return a;
}

// Tiered arms: every worker's device cache at about a quarter of the conversations' working
// set (~1,300 blocks of 20,480 bytes), so cached blocks are evicted and requests may be
// preempted, with a host tier that holds the working set (docs/kv_offload.md).
Arm quarter_with_host(Arm a) {
  a.name += "_quarter_host";
  a.host_tier = true;
  for (const char* flag : {"--kv-cache-bytes", "6758400", "--host-kv-bytes", "67108864"}) a.up_args.push_back(flag);
  return a;
}

// Decode-local arms: the system prompts are soon cached everywhere, so a placement's uncached
// part is its user message (3-22 tokens) and a partial block; at 20 tokens some go to the decode
// worker and some to the prefill worker (with the decode side reusing its blocks).
INSTANTIATE_TEST_SUITE_P(Topologies, ClusterCacheIdentity,
                         ::testing::Values(aggregated(), pd("push", 1, 1), pd("push", 1, 2), pd("push", 2, 1),
                                           pd("pull", 1, 1), pd("pull", 1, 2), pd("pull", 2, 1),
                                           pd("push", 1, 2, 20), pd("pull", 2, 1, 20),
                                           pd("push", 1, 1, 0, false), quarter_with_host(aggregated()),
                                           quarter_with_host(pd("push", 1, 1)), quarter_with_host(pd("pull", 1, 2)),
                                           quarter_with_host(pd("pull-host", 2, 1))),
                         [](const ::testing::TestParamInfo<Arm>& info) { return info.param.name; });

// The tiers on a real aggregated worker (`pdserve up`): a device cache of about two requests,
// a 64 MiB host tier and a filesystem tier. Ten distinct ~375-token prompts, then the first five
// again: each reports >= 256 cached tokens and the same tokens; after a restart of the whole
// cluster on the same directory (nothing in the new worker's memory), again.
TEST(ClusterTiers, AnAggregatedWorkerServesEarlierPromptsAcrossARestart) {
  const std::string dir = ::testing::TempDir() + "/pdserve-cluster-tiers-" + std::to_string(::getpid());
  std::filesystem::remove_all(dir);
  const std::vector<std::string> args = {"--aggregated", "1", "--kv-cache-bytes", "1500000", "--host-kv-bytes",
                                         "67108864", "--kv-offload-dir", dir, "--kv-load-timeout-ms", "600000",
                                         "--kv-events", "off"};
  auto prompt_of = [](int salt) {
    std::vector<int> p = {1};
    for (int i = 1; i < 375; ++i) p.push_back(3 + (i * 37 + salt * 101 + (i * salt) % 7) % 500);
    return p;
  };
  auto greedy = [](v1::Generation::Stub& stub, const std::vector<int>& prompt) {
    v1::GenerateRequest req;
    for (int tok : prompt) req.mutable_token_ids()->add_ids(tok);
    req.mutable_sampling()->set_max_tokens(8);
    req.mutable_sampling()->set_ignore_eos(true);
    req.mutable_sampling()->set_temperature(0);
    return ask(stub, req);
  };
  std::vector<std::vector<int>> first;
  for (int round = 0; round < 2; ++round) {
    Cluster cluster(args);
    ASSERT_TRUE(cluster.wait_ready(120s)) << cluster.log();
    auto stub = testing::connected_generation_stub(cluster.grpc());
    ASSERT_TRUE(stub != nullptr);
    if (round == 0) {
      for (int i = 0; i < 10; ++i) {
        const Answer a = greedy(*stub, prompt_of(i));
        ASSERT_TRUE(a.error.empty()) << a.error;
        first.push_back(a.tokens);
      }
    }
    for (int i = 0; i < 5; ++i) {
      const Answer a = greedy(*stub, prompt_of(i));
      ASSERT_TRUE(a.error.empty()) << a.error;
      EXPECT_EQ(a.tokens, first[size_t(i)]) << "round " << round << " prompt " << i;
      EXPECT_GE(a.cached_tokens, 256) << "round " << round << " prompt " << i;
    }
    if (round == 0) {
      // The files are written behind the requests, on the tier's writer thread: wait until each
      // of the ten prompts' whole chunk (its first 16 blocks, the 256 tokens round 1 expects)
      // is on disk before stopping the cluster, so that a writer slowed by a loaded machine is
      // not cut off by the stop's grace period (a miss in round 1 would follow). A store
      // dropped on a full queue shows in the message.
      double stored = 0, dropped = 0;
      for (auto deadline = std::chrono::steady_clock::now() + 60s;
           stored < 10 * 16 && std::chrono::steady_clock::now() < deadline; std::this_thread::sleep_for(100ms)) {
        if (const auto text = testing::router_metrics_text(cluster.http_port())) {
          stored = testing::metric_sum(*text, "pdserve:worker_kv_tier_stored_blocks_total", "tier=\"disk\"");
          dropped = testing::metric_sum(*text, "pdserve:worker_kv_tier_dropped_blocks_total", "tier=\"disk\"");
        }
      }
      ASSERT_GE(stored, 10 * 16) << "blocks on disk before the restart; dropped: " << dropped;
    }
    if (round == 1) {
      // After the restart the device and host tiers start empty: the hits came from the files,
      // and the router's metrics say so (within a health poll or two: a poll may have caught the
      // worker between two of the five requests, so wait for all five).
      double disk_hits = 0, disk_loaded = 0, load_seconds = 0, load_timeouts = -1, pending_loads = 0;
      for (auto deadline = std::chrono::steady_clock::now() + 10s;
           (disk_hits < 5 * 256 || disk_loaded < 5 * 16 || pending_loads < 5) &&
           std::chrono::steady_clock::now() < deadline;
           std::this_thread::sleep_for(100ms)) {
        if (const auto text = testing::router_metrics_text(cluster.http_port())) {
          disk_hits = testing::metric_sum(*text, "pdserve:worker_kv_tier_hit_tokens_total", "tier=\"disk\"");
          disk_loaded = testing::metric_sum(*text, "pdserve:worker_kv_tier_loaded_blocks_total", "tier=\"disk\"");
          load_seconds = testing::metric_sum(*text, "pdserve:worker_kv_tier_load_seconds_total", "tier=\"disk\"");
          load_timeouts = testing::metric_sum(*text, "pdserve:worker_kv_tier_load_timeouts_total", "tier=\"disk\"");
          pending_loads = testing::metric_sum(*text, "pdserve:worker_kv_tier_pending_loads_total", "tier=\"disk\"");
        }
      }
      EXPECT_GE(disk_hits, 5 * 256);
      EXPECT_GE(disk_loaded, 5 * 16);
      EXPECT_GT(load_seconds, 0);
      EXPECT_EQ(load_timeouts, 0);  // Ten minutes (--kv-load-timeout-ms, forwarded by up) is plenty.
      EXPECT_GE(pending_loads, 5);  // Each waited for its files off the scheduler's thread.
    }
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace pdserve
