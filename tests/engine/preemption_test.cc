// Admission on demand and preemption on the bundled model: requests take KV blocks as they
// grow instead of reserving prompt + max_tokens up front, so concurrency follows the tokens
// actually used; when the pool runs short, the latest admitted sequence gives its blocks back
// and is recomputed later — with output identical, event for event (tokens, text, logprobs,
// prompt logprobs), to a pool that never runs short, greedy and seeded, at TP 1 and 2, with the
// prefix cache on and off. Aborting a preempted request leaks nothing.
#include <gtest/gtest.h>

#include <map>
#include <random>

#include "engine/engine.h"
#include "tests/engine/client_events.h"
#include "tests/engine/kv_copy.h"
#include "tests/engine/test_model.h"

namespace pdserve::engine {
namespace {

constexpr uint64_t kBlockBytes = 16 * 1280;  // stories260K at TP 1: 16 tokens × 1280 bytes.

std::unique_ptr<Engine> make_engine(int tp, int num_blocks = 0, bool prefix_cache = true) {
  auto model = load_model({pdserve::testing::stories_bin()});
  EXPECT_TRUE(model.ok()) << model.status();
  EngineOptions o;
  o.tp = tp;
  o.prefix_cache.enabled = prefix_cache;
  // Per rank: TP 2 splits each block's heads in two.
  if (num_blocks > 0) o.kv_cache_bytes = uint64_t(num_blocks) * kBlockBytes / uint64_t(tp);
  auto engine = Engine::create(std::move(*model), o);
  EXPECT_TRUE(engine.ok()) << engine.status();
  if (engine.ok() && num_blocks > 0) {
    EXPECT_EQ((*engine)->stats().num_blocks, num_blocks);
  }
  return std::move(*engine);
}

using pdserve::testing::Request;
using pdserve::testing::Seen;

// Eight requests whose outputs run to the context: greedy, seeded sampling with penalties and
// logprobs, one with prompt logprobs, prompts long and short (some sharing a prefix).
std::vector<Request> workload() {
  std::vector<Request> out;
  for (int i = 0; i < 8; ++i) {
    Request r;
    r.prompt = {1};
    const int len = i % 3 == 0 ? 1 : 20 + 9 * i;
    for (int t = 1; t < len; ++t) r.prompt.push_back(3 + (t * 37 + (i % 2) * t * 5) % 500);
    r.params.max_tokens = 256;
    r.params.ignore_eos = true;
    if (i % 2 == 1) {
      r.params.temperature = 0.9f;
      r.params.top_p = 0.95f;
      r.params.seed = 100 + i;
      r.params.frequency_penalty = 0.3f;
      r.params.logprobs = 2;
    }
    if (i == 4) r.params.prompt_logprobs = 1;
    out.push_back(std::move(r));
  }
  return out;
}

// Runs the requests all at once; records the most sequences ever running at the end of a step.
std::map<std::string, Seen> run_all(Engine& e, const std::vector<Request>& requests, int* max_running = nullptr) {
  std::map<std::string, Seen> seen;
  for (size_t i = 0; i < requests.size(); ++i) {
    const std::string id = "r" + std::to_string(i);
    Seen* s = &seen[id];
    EXPECT_TRUE(e.add_request({id, requests[i].prompt, requests[i].params}, pdserve::testing::record_into(s)).ok());
  }
  while (e.has_work()) {
    EXPECT_TRUE(e.step().ok());
    if (max_running) *max_running = std::max(*max_running, e.stats().running);
  }
  return seen;
}

class PreemptionIdentity : public ::testing::TestWithParam<std::tuple<int, bool>> {};

TEST_P(PreemptionIdentity, OutputEqualsAPoolThatNeverRunsShort) {
  const auto [tp, prefix_cache] = GetParam();
  const std::vector<Request> requests = workload();
  auto roomy = make_engine(tp, 0, prefix_cache);
  const auto want = run_all(*roomy, requests);
  ASSERT_EQ(roomy->stats().preemptions, 0u);
  // 40 blocks: the eight requests need 128 at their longest.
  auto tight = make_engine(tp, 40, prefix_cache);
  const auto got = run_all(*tight, requests);
  EXPECT_GT(tight->stats().preemptions, 0u);
  for (const auto& [id, w] : want) {
    EXPECT_EQ(w.reason, FinishReason::kLength) << id;
    EXPECT_EQ(got.at(id), w) << id << " (TP " << tp << ", prefix cache " << prefix_cache << ")";
  }
  EXPECT_EQ(got.at("r4").prompt_logprobs.size(), requests[4].prompt.size() - 1);
  const EngineStats s = tight->stats();
  EXPECT_EQ(s.free_blocks, s.num_blocks);
  EXPECT_EQ(s.running + s.waiting, 0);
}

INSTANTIATE_TEST_SUITE_P(TpAndCache, PreemptionIdentity,
                         ::testing::Values(std::tuple{1, true}, std::tuple{1, false}, std::tuple{2, true}));

// max_tokens = the context (512) on a pool that holds two such requests in full: all eight run
// at once (they hold what they use, not what they may use), and as the pool fills, the latest
// admitted make room.
TEST(Preemption, ConcurrencyFollowsTheTokensUsedNotTheReservation) {
  auto e = make_engine(1, 64);
  const int context = e->config().max_seq_len;
  std::vector<Request> requests(8, Request{{1}, {}});
  for (size_t i = 0; i < requests.size(); ++i) {
    requests[i].params.max_tokens = context;
    requests[i].params.ignore_eos = true;
    requests[i].params.temperature = 1.0f;
    requests[i].params.seed = int(i);
  }
  ASSERT_EQ(e->blocks_needed(1, context), 32);  // Reserved in full, 64 blocks would run 2.
  int max_running = 0;
  const auto seen = run_all(*e, requests, &max_running);
  EXPECT_EQ(max_running, 8);
  EXPECT_GT(e->stats().preemptions, 0u);
  for (const auto& [id, s] : seen) EXPECT_EQ(int(s.tokens.size()), context) << id;  // The prompt is position 0.
  EXPECT_EQ(e->stats().free_blocks, 64);
}

// A request preempted (waiting to be recomputed) and then aborted finishes with "abort" and
// leaves every block free; so does one aborted while running after a preemption.
TEST(Preemption, AbortingPreemptedRequestsLeaksNothing) {
  auto e = make_engine(1, 24, /*prefix_cache=*/true);
  std::map<std::string, FinishReason> finished;
  for (int i = 0; i < 6; ++i) {
    SamplingParams p;
    p.max_tokens = 256;
    p.ignore_eos = true;
    const std::string id = "r" + std::to_string(i);
    ASSERT_TRUE(e->add_request({id, {1, 3 + i}, p}, [&finished, id](const TokenEvent& ev) {
                   if (ev.finished) finished[id] = ev.reason;
                 }).ok());
  }
  while (e->stats().preemptions == 0 && e->has_work()) ASSERT_TRUE(e->step().ok());
  ASSERT_GT(e->stats().preemptions, 0u);
  ASSERT_GT(e->stats().waiting, 0);
  e->abort("r5");  // The latest admitted: the first preempted.
  e->abort("r0");  // Running.
  ASSERT_TRUE(e->run_until_idle().ok());
  EXPECT_EQ(finished["r5"], FinishReason::kAbort);
  EXPECT_EQ(finished["r0"], FinishReason::kAbort);
  for (int i = 1; i < 5; ++i) EXPECT_EQ(finished["r" + std::to_string(i)], FinishReason::kLength) << i;
  EXPECT_EQ(e->stats().free_blocks, 24);
}

// The decode side of P/D: a preloaded request needs only its prompt's blocks and takes the
// rest as it decodes; preempted, it recomputes its prompt here. Either way, the same tokens.
TEST(Preemption, PreloadedRequestsGrowOnDemandAndSurvivePreemption) {
  std::vector<int> prompt = {1};
  for (int i = 0; i < 40; ++i) prompt.push_back(3 + (i * 53) % 500);
  SamplingParams params;
  params.max_tokens = 200;
  params.ignore_eos = true;
  const std::vector<int> whole = make_engine(1)->generate(prompt, params)->token_ids;

  auto prefill = make_engine(1);
  const auto handed = pdserve::testing::run_prefill_only(*prefill, prompt, params);
  const int prompt_blocks = int(prompt.size() + 15) / 16;
  for (bool squeeze : {false, true}) {
    auto decode = make_engine(1, 20);
    auto reserved = decode->reserve_cached_blocks({}, "", int(prompt.size()));
    ASSERT_TRUE(reserved.ok());
    ASSERT_EQ(int(reserved->blocks.size()), prompt_blocks);
    pdserve::testing::copy_kv(*prefill, handed.blocks, *decode, reserved->blocks, prompt_blocks);
    if (squeeze) {
      // An earlier request that grows past what is left preempts the preloaded one (admitted
      // after it).
      SamplingParams p;
      p.max_tokens = 250;
      p.ignore_eos = true;
      ASSERT_TRUE(decode->add_request({"early", {1}, p}, nullptr).ok());
      ASSERT_TRUE(decode->step().ok());
    }
    EXPECT_EQ(pdserve::testing::decode_preloaded(*decode, prompt, params, reserved->blocks, handed.first_token), whole)
        << "squeezed: " << squeeze;
    EXPECT_EQ(decode->stats().preemptions > 0, squeeze);
    EXPECT_EQ(decode->stats().free_blocks, 20);
  }
  ASSERT_TRUE(prefill->release_blocks(handed.blocks).ok());
}

// A leak soak: 2,000 requests on a pool a few requests fill, with a host tier that evicts too,
// 20 % of them aborted at a random point (queued, mid-prefill, decoding, preempted), beside
// prefill-only hand-offs and decode-side reservations taken and released. Every request finishes
// exactly once, and every block of both pools comes back.
TEST(Preemption, SoakWithAbortsAtEveryStageLeaksNoBlock) {
  auto model = load_model({pdserve::testing::stories_bin()});
  ASSERT_TRUE(model.ok());
  EngineOptions o;
  o.kv_cache_bytes = 48 * kBlockBytes;
  o.host_kv_bytes = 100 * kBlockBytes;
  o.max_batch_tokens = 64;  // Prompts take several chunks: aborts land mid-prefill.
  auto created = Engine::create(std::move(*model), o);
  ASSERT_TRUE(created.ok()) << created.status();
  Engine& e = **created;
  std::mt19937 rng(17);
  std::map<std::string, int> finishes;
  std::vector<std::vector<int>> handed;  // Prefill-only blocks to give back.
  std::vector<std::string> live;
  int next = 0, aborted = 0, preempted_aborts = 0;
  const std::vector<int> shared = {1, 5, 9, 13, 17, 21, 25, 29, 33, 37, 41, 45, 49, 53, 57, 61, 65, 69};
  auto submit = [&] {
    const std::string id = "q" + std::to_string(next++);
    std::vector<int> prompt = shared;
    prompt.resize(size_t(1 + rng() % shared.size()));
    for (int i = int(rng() % 120); i > 0; --i) prompt.push_back(int(3 + rng() % 500));
    GenerationRequest r{id, prompt, {}};
    r.params.max_tokens = int(1 + rng() % 200);
    r.params.ignore_eos = rng() % 2 == 0;
    if (rng() % 4 == 0) {
      r.params.temperature = 0.8f;
      r.params.seed = next;
    }
    if (rng() % 10 == 0) r.handoff.prefill_only = true;
    ASSERT_TRUE(e.add_request(r, [&, id](const TokenEvent& ev) {
                   if (!ev.finished) return;
                   ++finishes[id];
                   if (!ev.blocks.empty()) handed.push_back(ev.blocks);
                 }).ok());
    live.push_back(id);
  };
  for (int i = 0; i < 2000; ++i) {
    submit();
    if (rng() % 5 == 0 && !live.empty()) {  // 20 %: abort a random live request.
      const size_t k = rng() % live.size();
      preempted_aborts += e.stats().preemptions > 0;
      e.abort(live[k]);
      live.erase(live.begin() + int64_t(k));
      ++aborted;
    }
    if (rng() % 7 == 0) {  // A decode-side reservation, taken and given back.
      auto r = e.reserve_cached_blocks(shared, "", int(shared.size()) + 5);
      if (r.ok()) ASSERT_TRUE(e.release_blocks(r->blocks).ok());
    }
    for (int s = int(rng() % 3); s > 0; --s) ASSERT_TRUE(e.step().ok());
    for (const auto& b : handed) ASSERT_TRUE(e.release_blocks(b).ok());
    handed.clear();
    std::erase_if(live, [&](const std::string& id) { return finishes.count(id) > 0; });
  }
  // Hand-offs hold their blocks until given back, as a transfer would.
  while (e.has_work()) {
    ASSERT_TRUE(e.step().ok());
    for (const auto& b : handed) ASSERT_TRUE(e.release_blocks(b).ok());
    handed.clear();
  }
  EXPECT_EQ(int(finishes.size()), 2000);
  for (const auto& [id, n] : finishes) EXPECT_EQ(n, 1) << id;
  const EngineStats s = e.stats();
  EXPECT_GT(s.preemptions, 0u);
  EXPECT_GT(s.host_loaded_blocks, 0u);
  EXPECT_GT(aborted, 300);
  EXPECT_EQ(s.free_blocks, s.num_blocks);
  EXPECT_EQ(s.host_free_blocks, s.host_blocks);
  EXPECT_EQ(s.running + s.waiting, 0);
}

}  // namespace
}  // namespace pdserve::engine
