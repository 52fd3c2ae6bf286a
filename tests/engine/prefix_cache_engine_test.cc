// The prefix cache inside the engine on the bundled model: the hit rules (the last prompt token
// is always computed; namespaces and checkpoints never share), output identity with the cache
// off over many seeded multi-turn conversations at TP 1 and 2, greedy and sampled, and keys
// that all collide giving the same tokens with a growing collision count.
#include <gtest/gtest.h>

#include <iostream>
#include <random>

#include "engine/engine.h"
#include "tests/engine/test_model.h"

namespace pdserve::engine {
namespace {

std::unique_ptr<Engine> make_engine(int tp, EngineOptions options = {}) {
  auto model = load_model({pdserve::testing::stories_bin()});
  EXPECT_TRUE(model.ok()) << model.status();
  options.tp = tp;
  auto engine = Engine::create(std::move(*model), options);
  EXPECT_TRUE(engine.ok()) << engine.status();
  return std::move(*engine);
}

EngineOptions cache(bool on) {
  EngineOptions o;
  o.prefix_cache.enabled = on;
  return o;
}

SamplingParams greedy(int max_tokens) {
  SamplingParams p;
  p.max_tokens = max_tokens;
  return p;
}

std::vector<int> prompt_of(int n, int salt = 0) {
  std::vector<int> p = {1};
  for (int i = 1; i < n; ++i) p.push_back(3 + (i * 37 + salt * 11) % 500);
  return p;
}

GenerationResult run(Engine& e, std::vector<int> prompt, int max_tokens, std::string salt = "") {
  GenerationResult r;
  GenerationRequest req{"r", std::move(prompt), greedy(max_tokens)};
  req.cache_salt = std::move(salt);
  EXPECT_TRUE(e.add_request(std::move(req), [&](const TokenEvent& ev) {
                 if (ev.token >= 0) r.token_ids.push_back(ev.token);
                 r.cached_tokens = ev.cached_tokens;
               }).ok());
  EXPECT_TRUE(e.run_until_idle().ok());
  return r;
}

TEST(PrefixCache, HitRulesFollowWholeBlocksAndTheLastToken) {
  auto e = make_engine(1);
  const std::vector<int> p64 = prompt_of(64);  // 4 blocks of 16.
  EXPECT_EQ(run(*e, p64, 4).cached_tokens, 0);
  // Fully cached prompt of k·B tokens: k-1 blocks hit, the last block is recomputed.
  EXPECT_EQ(run(*e, p64, 4).cached_tokens, 48);
  // k·B + r tokens: k blocks.
  std::vector<int> p70 = p64;
  p70.insert(p70.end(), {5, 6, 7, 8, 9, 10});
  EXPECT_EQ(run(*e, p70, 4).cached_tokens, 64);
  // Another namespace shares nothing, then hits its own.
  EXPECT_EQ(run(*e, p70, 4, "tenant-b").cached_tokens, 0);
  EXPECT_EQ(run(*e, p70, 4, "tenant-b").cached_tokens, 64);
  // A one-token prompt never hits; the blocks a generation filled are cached too.
  EXPECT_EQ(run(*e, {1}, 4).cached_tokens, 0);
  const GenerationResult r = run(*e, prompt_of(20, 3), 40);
  std::vector<int> turn2 = prompt_of(20, 3);
  turn2.insert(turn2.end(), r.token_ids.begin(), r.token_ids.end());
  turn2.push_back(7);
  EXPECT_EQ(run(*e, turn2, 4).cached_tokens, int(turn2.size() - 1) / 16 * 16);
  EXPECT_EQ(e->cached_prefix_tokens(turn2), int(turn2.size() - 1) / 16 * 16);
  const EngineStats s = e->stats();
  EXPECT_EQ(s.free_blocks, s.num_blocks);  // Cached blocks are evictable, so free.
  EXPECT_GT(s.cached_blocks, 0);
  EXPECT_GT(s.prefix_hit_tokens, 0u);
  e->reset_prefix_cache();
  EXPECT_EQ(e->stats().cached_blocks, 0);
  EXPECT_EQ(run(*e, p64, 4).cached_tokens, 0);
}

TEST(PrefixCache, OffMeansNoHits) {
  auto e = make_engine(1, cache(false));
  const std::vector<int> p = prompt_of(64);
  run(*e, p, 4);
  EXPECT_EQ(run(*e, p, 4).cached_tokens, 0);
  EXPECT_EQ(e->stats().cached_blocks, 0);
}

TEST(PrefixCache, KeyRootsDifferByCheckpointAndSecret) {
  auto a = make_engine(1);
  EngineOptions secret;
  secret.prefix_cache.secret = "s";
  auto b = make_engine(1, secret);
  EXPECT_NE(a->kv_key_root(), b->kv_key_root());
  EXPECT_EQ(a->kv_key_root(), make_engine(2)->kv_key_root());  // TP does not change keys.
}

// Conversations as multi-turn chat sends them: each turn's prompt is the previous prompt, the
// output verbatim and a new user message; groups share a system prompt.
struct Conversation {
  std::vector<int> prompt;
  std::vector<std::vector<int>> outputs;  // Per turn.
};

std::vector<Conversation> run_conversations(Engine& e, int count, int turns, bool sampled, uint64_t* computed) {
  std::mt19937 rng(42);
  std::vector<std::vector<int>> systems;
  for (int g = 0; g < 4; ++g) {
    std::vector<int> s = {1};
    for (int i = int(20 + rng() % 40); i > 0; --i) s.push_back(int(3 + rng() % 500));
    systems.push_back(s);
  }
  std::vector<Conversation> convs(static_cast<size_t>(count));
  std::vector<std::vector<std::vector<int>>> users(static_cast<size_t>(count));
  for (int c = 0; c < count; ++c) {
    convs[size_t(c)].prompt = systems[size_t(c) % systems.size()];
    for (int t = 0; t < turns; ++t) {
      std::vector<int> u;
      for (int i = int(3 + rng() % 20); i > 0; --i) u.push_back(int(3 + rng() % 500));
      users[size_t(c)].push_back(u);
    }
  }
  const uint64_t before = e.stats().prefill_tokens;
  for (int t = 0; t < turns; ++t) {
    std::vector<std::vector<int>> out(static_cast<size_t>(count));
    for (int c = 0; c < count; ++c) {
      Conversation& conv = convs[size_t(c)];
      const auto& u = users[size_t(c)][size_t(t)];
      conv.prompt.insert(conv.prompt.end(), u.begin(), u.end());
      SamplingParams p = greedy(int(4 + (c * 7 + t * 3) % 20));
      p.ignore_eos = true;
      if (sampled) {
        p.temperature = 0.9f;
        p.top_p = 0.9f;
        p.seed = uint64_t(c * 100 + t);
      }
      EXPECT_TRUE(e.add_request({std::to_string(c), conv.prompt, p}, [&out, c](const TokenEvent& ev) {
                     if (ev.token >= 0) out[size_t(c)].push_back(ev.token);
                   }).ok());
    }
    EXPECT_TRUE(e.run_until_idle().ok());
    for (int c = 0; c < count; ++c) {
      Conversation& conv = convs[size_t(c)];
      conv.outputs.push_back(out[size_t(c)]);
      conv.prompt.insert(conv.prompt.end(), out[size_t(c)].begin(), out[size_t(c)].end());
    }
  }
  *computed = e.stats().prefill_tokens - before;
  return convs;
}

class CacheIdentity : public ::testing::TestWithParam<std::tuple<int, bool>> {};

TEST_P(CacheIdentity, MultiTurnConversationsGiveTheSameTokensWithTheCacheOnAndOff) {
  const auto [tp, sampled] = GetParam();
  auto off = make_engine(tp, cache(false)), on = make_engine(tp, cache(true));
  uint64_t computed_off = 0, computed_on = 0;
  const auto want = run_conversations(*off, 200, 4, sampled, &computed_off);
  const auto got = run_conversations(*on, 200, 4, sampled, &computed_on);
  for (size_t c = 0; c < want.size(); ++c)
    for (size_t t = 0; t < want[c].outputs.size(); ++t)
      ASSERT_EQ(got[c].outputs[t], want[c].outputs[t]) << "conversation " << c << " turn " << t;
  EXPECT_LT(computed_on * 2, computed_off) << "the cache saves most prompt compute";
  const EngineStats s = on->stats();
  EXPECT_EQ(s.free_blocks, s.num_blocks);
}

INSTANTIATE_TEST_SUITE_P(TpAndSampling, CacheIdentity,
                         ::testing::Values(std::tuple(1, false), std::tuple(1, true), std::tuple(2, true)));

// The tiers under pressure: a device cache of a quarter of the conversations' working set
// (cached blocks evicted, requests preempted when short), with and without the host tier, gives
// the tokens of a cache that never runs short; the host tier serves what the device gave up.
class TieredIdentity : public ::testing::TestWithParam<std::tuple<int, bool>> {};

TEST_P(TieredIdentity, AQuarterOfTheWorkingSetGivesTheSameTokens) {
  const auto [tp, host] = GetParam();
  auto roomy = make_engine(tp, cache(true));
  uint64_t computed_roomy = 0, computed_tight = 0;
  const auto want = run_conversations(*roomy, 200, 4, true, &computed_roomy);
  const int working_set = roomy->stats().cached_blocks;
  const uint64_t block_bytes = roomy->stats().kv_bytes_per_rank / uint64_t(roomy->stats().num_blocks);
  EngineOptions tight = cache(true);
  tight.kv_cache_bytes = uint64_t(working_set / 4) * block_bytes;
  if (host) tight.host_kv_bytes = uint64_t(working_set) * 2 * block_bytes;
  auto e = make_engine(tp, tight);
  const auto got = run_conversations(*e, 200, 4, true, &computed_tight);
  for (size_t c = 0; c < want.size(); ++c)
    for (size_t t = 0; t < want[c].outputs.size(); ++t)
      ASSERT_EQ(got[c].outputs[t], want[c].outputs[t]) << "conversation " << c << " turn " << t;
  const EngineStats s = e->stats();
  EXPECT_EQ(s.free_blocks, s.num_blocks);
  if (!host) EXPECT_GT(computed_tight, computed_roomy * 3 / 2) << "a quarter of the working set recomputes much";
  if (host) {
    EXPECT_GT(s.host_hit_tokens, 0u);
    EXPECT_GT(s.host_loaded_blocks, 0u);
    // The host tier holds the working set: prompt compute stays near the roomy run's.
    EXPECT_LT(computed_tight, computed_roomy * 3 / 2) << computed_roomy;
    EXPECT_EQ(s.host_free_blocks, s.host_blocks);  // Nothing is being read now.
  }
  std::cout << "TP " << tp << (host ? " with" : " without") << " the host tier: " << computed_tight
            << " prompt tokens computed (roomy: " << computed_roomy << "), " << s.preemptions << " preemptions, "
            << s.host_hit_tokens << " host hit tokens\n";
}

INSTANTIATE_TEST_SUITE_P(TpAndHost, TieredIdentity,
                         ::testing::Values(std::tuple(1, false), std::tuple(1, true), std::tuple(2, true)));

TEST(PrefixCache, KeysThatAllCollideGiveTheSameTokensAndAreCounted) {
  EngineOptions colliding = cache(true);
  colliding.prefix_cache.key_fn = [](const BlockKey&, std::span<const int32_t>) { return BlockKey{}; };
  auto off = make_engine(1, cache(false)), on = make_engine(1, colliding);
  uint64_t a = 0, b = 0;
  const auto want = run_conversations(*off, 40, 3, false, &a);
  const auto got = run_conversations(*on, 40, 3, false, &b);
  for (size_t c = 0; c < want.size(); ++c) ASSERT_EQ(got[c].outputs, want[c].outputs) << c;
  EXPECT_GT(on->stats().prefix_collisions, 10u);
  // The host tier's index is as exact: a small device cache sends lookups there.
  colliding.kv_cache_bytes = 60 * 16 * 1280;
  colliding.host_kv_bytes = 600 * 16 * 1280;
  auto tiered = make_engine(1, colliding);
  const auto got_tiered = run_conversations(*tiered, 40, 3, false, &b);
  for (size_t c = 0; c < want.size(); ++c) ASSERT_EQ(got_tiered[c].outputs, want[c].outputs) << c;
}

}  // namespace
}  // namespace pdserve::engine
