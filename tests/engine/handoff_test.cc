// The engine's prefill/decode hand-off in one process: a prefill-only request on one engine,
// its blocks' KV copied byte for byte into blocks reserved on another engine, and a preloaded
// request decoding from them gives exactly the tokens of an undivided run.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <mutex>
#include <set>

#include "absl/strings/str_cat.h"

#include "engine/engine.h"
#include "engine/sampling/stop_checker.h"
#include "tests/engine/kv_copy.h"
#include "tests/engine/test_model.h"

namespace pdserve::engine {
namespace {

std::unique_ptr<Engine> make_engine(int tp, int max_batch_tokens = EngineOptions{}.max_batch_tokens) {
  auto model = load_model({pdserve::testing::stories_bin()});
  EXPECT_TRUE(model.ok());
  EngineOptions o;
  o.tp = tp;
  o.max_batch_tokens = max_batch_tokens;
  o.kv_cache_bytes = 8 << 20;
  auto e = Engine::create(std::move(*model), o);
  EXPECT_TRUE(e.ok()) << e.status();
  return std::move(*e);
}

using pdserve::testing::copy_kv;
using pdserve::testing::decode_preloaded;
using pdserve::testing::run_prefill_only;

TEST(Handoff, PrefillOnlyThenPreloadedDecodeEqualsWholeRun) {
  for (int tp : {1, 2}) {
    auto prefill = make_engine(tp), decode = make_engine(tp);
    std::vector<int> prompt = {1};
    for (int i = 0; i < 37; ++i) prompt.push_back(3 + (i * 53) % 500);
    SamplingParams params;
    params.max_tokens = 60;
    // On a third engine: the decode engine's cache must hold nothing but what copy_kv puts there.
    const std::vector<int> whole = make_engine(tp)->generate(prompt, params)->token_ids;

    std::set<std::pair<int, int>> hooked;  // (rank, layer) seen with our request completed.
    std::mutex mu;                         // The hook runs on every rank's thread at once.
    prefill->set_layer_hook([&](int rank, int layer, const std::vector<std::string>& done) {
      std::lock_guard lock(mu);
      for (const std::string& id : done)
        if (id == "r") hooked.insert({rank, layer});
    });
    const auto [first, handed] = run_prefill_only(*prefill, prompt, params);
    ASSERT_GE(first, 0);
    EXPECT_EQ(hooked.size(), size_t(tp * prefill->config().n_layers));
    const int prompt_blocks = int((prompt.size() + 15) / 16);
    ASSERT_GE(int(handed.size()), prompt_blocks);
    EXPECT_LT(prefill->stats().free_blocks, prefill->stats().num_blocks);  // Held for the transfer.

    auto reserved = decode->reserve_cached_blocks({}, "", int(prompt.size()) + params.max_tokens);
    ASSERT_TRUE(reserved.ok());
    copy_kv(*prefill, handed, *decode, reserved->blocks, prompt_blocks);
    ASSERT_TRUE(prefill->release_blocks(handed).ok());
    EXPECT_EQ(prefill->stats().free_blocks, prefill->stats().num_blocks);

    EXPECT_EQ(decode_preloaded(*decode, prompt, params, reserved->blocks, first), whole) << "TP " << tp;
    EXPECT_EQ(decode->stats().free_blocks, decode->stats().num_blocks);
  }
}

// The decode side of P/D with prefix reuse: reserve_cached_blocks starts a request's blocks
// with the decode engine's own hit — every full prompt block, the last one included, since the
// decode side never computes the prompt — and only blocks [hit, n) need KV from the prefill
// side. Decoding from the hit plus the copied suffix gives the undivided run's tokens, for a
// second send of a prompt and for a follow-up turn; a reservation given back returns its hit
// blocks to the cache (evictable again) and its new blocks to the free stack.
TEST(Handoff, DecodeSideHitSkipsItsCachedBlocks) {
  for (int tp : {1, 2}) {
    for (int len : {38, 48}) {  // 2 full blocks and a part, and 3 full blocks (all of them hit).
      auto prefill = make_engine(tp), decode = make_engine(tp);
      std::vector<int> prompt = {1};
      for (int i = 1; i < len; ++i) prompt.push_back(3 + (i * 53) % 500);
      SamplingParams params;
      params.max_tokens = 40;
      params.ignore_eos = true;
      // Sends the prompt through the split; returns the decode side's hit (blocks) and tokens.
      auto send = [&](const std::vector<int>& p) {
        const int n = int((p.size() + 15) / 16);
        auto reserved = decode->reserve_cached_blocks(p, "", int(p.size()) + params.max_tokens);
        EXPECT_TRUE(reserved.ok()) << reserved.status();
        const auto [first, handed] = run_prefill_only(*prefill, p, params);
        const int hit = reserved->cached_blocks;
        copy_kv(*prefill, {handed.begin() + hit, handed.end()}, *decode,
                {reserved->blocks.begin() + hit, reserved->blocks.end()}, n - hit);
        EXPECT_TRUE(prefill->release_blocks(handed).ok());
        return std::pair{hit, decode_preloaded(*decode, p, params, reserved->blocks, first)};
      };
      const std::vector<int> whole = make_engine(tp)->generate(prompt, params)->token_ids;
      const auto [hit1, out1] = send(prompt);
      EXPECT_EQ(hit1, 0);
      EXPECT_EQ(out1, whole) << "TP " << tp << ", " << len << " tokens";
      const auto [hit2, out2] = send(prompt);
      EXPECT_EQ(hit2, len / 16) << "every full prompt block hits on the decode side";
      EXPECT_EQ(out2, whole) << "TP " << tp << ", " << len << " tokens, second send";
      // A follow-up turn: the prompt, the output (its blocks were cached as they filled), more.
      std::vector<int> turn = prompt;
      turn.insert(turn.end(), whole.begin(), whole.end());
      turn.insert(turn.end(), {7, 8, 9});
      const auto [hit3, out3] = send(turn);
      EXPECT_GT(hit3, len / 16);
      EXPECT_EQ(out3, make_engine(tp)->generate(turn, params)->token_ids) << "TP " << tp << ", follow-up";
      EXPECT_EQ(decode->stats().free_blocks, decode->stats().num_blocks);
      // Given back unused (an abort): the hit goes back to the cache, the rest to the free stack.
      const EngineStats before = decode->stats();
      auto r = decode->reserve_cached_blocks(turn, "", int(turn.size()) + 8);
      ASSERT_TRUE(r.ok());
      EXPECT_EQ(r->cached_blocks, int(turn.size()) / 16);
      EXPECT_EQ(decode->stats().free_blocks, before.num_blocks - int(r->blocks.size()));
      EXPECT_EQ(decode->stats().evictable_blocks, before.evictable_blocks - r->cached_blocks);
      ASSERT_TRUE(decode->release_blocks(r->blocks).ok());
      const EngineStats after = decode->stats();
      EXPECT_EQ(after.free_blocks, after.num_blocks);
      EXPECT_EQ(after.evictable_blocks, before.evictable_blocks);
      EXPECT_EQ(after.cached_blocks, before.cached_blocks);
      // Another namespace shares nothing.
      auto other = decode->reserve_cached_blocks(turn, "tenant-b", int(turn.size()) + 8);
      ASSERT_TRUE(other.ok());
      EXPECT_EQ(other->cached_blocks, 0);
      ASSERT_TRUE(decode->release_blocks(other->blocks).ok());
    }
  }
}

// With the prefix cache off, nothing hits.
TEST(Handoff, DecodeSideReservationWithTheCacheOffHitsNothing) {
  auto model = load_model({pdserve::testing::stories_bin()});
  ASSERT_TRUE(model.ok());
  EngineOptions o;
  o.kv_cache_bytes = 8 << 20;
  o.prefix_cache.enabled = false;
  auto e = Engine::create(std::move(*model), o);
  ASSERT_TRUE(e.ok());
  std::vector<int> prompt = {1};
  for (int i = 1; i < 40; ++i) prompt.push_back(3 + i);
  SamplingParams params;
  params.max_tokens = 4;
  ASSERT_TRUE((*e)->generate(prompt, params).ok());
  auto r = (*e)->reserve_cached_blocks(prompt, "", 44);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->cached_blocks, 0);
  EXPECT_EQ(int(r->blocks.size()), 3);
  ASSERT_TRUE((*e)->release_blocks(r->blocks).ok());
}

// Push mode posts each layer from the layer hook, so it needs the blocks before any layer of
// the request is written, and must get them back however the request ends.
TEST(Handoff, OnAdmittedGivesTheBlocksBeforeTheFirstLayerAndTheyAlwaysComeBack) {
  auto prefill = make_engine(2, /*max_batch_tokens=*/16);  // The prompt takes 3 steps.
  std::vector<int> prompt = {1};
  for (int i = 0; i < 40; ++i) prompt.push_back(3 + (i * 31) % 500);
  SamplingParams params;
  params.max_tokens = 8;
  std::vector<std::string> order;  // "admitted" and "layer R L" for our request, in order.
  std::mutex mu;
  prefill->set_layer_hook([&](int rank, int layer, const std::vector<std::string>& done) {
    std::lock_guard lock(mu);
    for (const std::string& id : done)
      if (id == "r") order.push_back(absl::StrCat("layer ", rank, " ", layer));
  });
  for (bool abort_midway : {false, true}) {
    // A prompt of its own each time: the prefix cache would hold the first one's blocks.
    prompt[1] = 3 + int(abort_midway);
    order.clear();
    std::vector<int> admitted, handed;
    bool finished = false;
    GenerationRequest req{"r", prompt, params};
    req.handoff.prefill_only = true;
    req.handoff.on_admitted = [&](const std::vector<int>& blocks) {
      std::lock_guard lock(mu);
      order.push_back("admitted");
      admitted = blocks;
    };
    ASSERT_TRUE(prefill->add_request(req, [&](const TokenEvent& ev) {
      if (ev.finished) finished = true, handed = ev.blocks;
    }).ok());
    ASSERT_TRUE(prefill->step().ok());  // Admits and runs the first chunk.
    if (abort_midway) prefill->abort("r");
    ASSERT_TRUE(prefill->run_until_idle().ok());
    ASSERT_TRUE(finished);
    ASSERT_FALSE(order.empty());
    EXPECT_EQ(order.front(), "admitted");
    // Every layer on both ranks once the prompt completes; none for an aborted prompt.
    EXPECT_EQ(order.size(), abort_midway ? 1 : 1 + size_t(2 * prefill->config().n_layers));
    ASSERT_GE(admitted.size(), 3u);
    EXPECT_EQ(handed, admitted) << (abort_midway ? "aborted" : "finished");
    EXPECT_TRUE(std::is_sorted(admitted.begin(), admitted.end()));  // A run, for coalescing.
    EXPECT_LT(prefill->stats().free_blocks, prefill->stats().num_blocks);
    ASSERT_TRUE(prefill->release_blocks(handed).ok());
    EXPECT_EQ(prefill->stats().free_blocks, prefill->stats().num_blocks);
  }
}

TEST(Handoff, PreloadedRequestValidation) {
  auto e = make_engine(1);
  SamplingParams p;
  p.max_tokens = 10;
  GenerationRequest r{"x", {1, 50}, p};
  r.handoff.preloaded_blocks = {0};
  r.handoff.first_token = 5;
  EXPECT_FALSE(e->add_request(r, nullptr).ok());  // Block 0 was never reserved.
  auto blocks = e->reserve_cached_blocks({}, "", 12);
  ASSERT_TRUE(blocks.ok());
  r.handoff.preloaded_blocks = blocks->blocks;
  r.handoff.first_token = 100000;
  EXPECT_FALSE(e->add_request(r, nullptr).ok());
  r.handoff.first_token = 5;
  r.handoff.prefill_only = true;
  EXPECT_FALSE(e->add_request(r, nullptr).ok());
  ASSERT_TRUE(e->release_blocks(blocks->blocks).ok());
  EXPECT_EQ(e->stats().free_blocks, e->stats().num_blocks);
}

TEST(Handoff, AbortedPrefillOnlyFreesItsBlocks) {
  auto e = make_engine(1);
  GenerationRequest r{"x", std::vector<int>(300, 7), SamplingParams{}};
  r.prompt[0] = 1;
  r.handoff.prefill_only = true;
  std::vector<int> handed = {-1};
  ASSERT_TRUE(e->add_request(r, [&](const TokenEvent& ev) {
    if (ev.finished) handed = ev.blocks;
  }).ok());
  e->abort("x");
  ASSERT_TRUE(e->run_until_idle().ok());
  EXPECT_TRUE(handed.empty());
  EXPECT_EQ(e->stats().free_blocks, e->stats().num_blocks);
}

// A preloaded request aborted before the scheduler admitted it (the decode side's client gone
// right after its KV arrived: abort and admission land in one step) gives back the blocks it was
// handed; a bench with random client aborts found them leaked.
TEST(Handoff, APreloadedRequestAbortedBeforeAdmissionFreesItsBlocks) {
  auto e = make_engine(1);
  auto reserved = e->reserve_cached_blocks({}, "", 40);
  ASSERT_TRUE(reserved.ok());
  SamplingParams p;
  p.max_tokens = 8;
  GenerationRequest r{"x", {1, 50, 60, 70}, p};
  r.handoff.preloaded_blocks = reserved->blocks;
  r.handoff.first_token = 5;
  FinishReason reason = FinishReason::kLength;
  ASSERT_TRUE(e->add_request(r, [&](const TokenEvent& ev) {
    if (ev.finished) reason = ev.reason;
  }).ok());
  e->abort("x");
  ASSERT_TRUE(e->run_until_idle().ok());
  EXPECT_EQ(reason, FinishReason::kAbort);
  EXPECT_EQ(e->stats().free_blocks, e->stats().num_blocks);
}

}  // namespace
}  // namespace pdserve::engine

namespace pdserve::engine {
namespace {

// EngineOptions::kv_arena_allocator: each rank computes into the memory it supplies (dirty
// here, as UCX-allocated memory may be), zero-filled, with the tokens of a default engine.
TEST(Handoff, ArenasFromAnAllocatorAreZeroedAndUsed) {
  std::vector<std::vector<uint8_t>> arenas(2);
  EngineOptions o;
  o.tp = 2;
  o.kv_cache_bytes = 8 << 20;
  o.kv_arena_allocator = [&](int rank, size_t bytes) -> StatusOr<void*> {
    arenas[rank].assign(bytes, 0xAB);
    return arenas[rank].data();
  };
  auto model = load_model({pdserve::testing::stories_bin()});
  ASSERT_TRUE(model.ok());
  auto e = Engine::create(std::move(*model), o);
  ASSERT_TRUE(e.ok()) << e.status();
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ((*e)->kv_arena(r), arenas[r].data());
    EXPECT_EQ(arenas[r].size(), (*e)->kv_layout(r).total_bytes());
    EXPECT_TRUE(std::all_of(arenas[r].begin(), arenas[r].end(), [](uint8_t b) { return b == 0; }));
  }
  SamplingParams params;
  params.max_tokens = 12;
  const std::vector<int> prompt = {1, 403, 407, 261, 378};
  EXPECT_EQ((*e)->generate(prompt, params)->token_ids,
            make_engine(2)->generate(prompt, params)->token_ids);
}

TEST(Handoff, SeededSamplingContinuesAcrossTheSplit) {
  auto prefill = make_engine(1), decode = make_engine(1);
  std::vector<int> prompt = {1, 403, 407, 261, 378};
  SamplingParams params;
  params.max_tokens = 40;
  params.temperature = 0.9f;
  params.seed = 1234;
  const std::vector<int> whole = make_engine(1)->generate(prompt, params)->token_ids;
  const auto [first, handed] = run_prefill_only(*prefill, prompt, params);
  auto reserved = decode->reserve_cached_blocks({}, "", int(prompt.size()) + params.max_tokens);
  ASSERT_TRUE(reserved.ok());
  copy_kv(*prefill, handed, *decode, reserved->blocks, 1);
  ASSERT_TRUE(prefill->release_blocks(handed).ok());
  EXPECT_EQ(decode_preloaded(*decode, prompt, params, reserved->blocks, first), whole);
}

// The repetition penalty across the split: the prefill side samples the first token penalising
// the prompt's ids, the decode side, given the same prompt, penalises them and the output; the
// tokens are the undivided run's, greedy and seeded, at TP 1 and 2.
TEST(Handoff, RepetitionPenaltyContinuesAcrossTheSplit) {
  for (int tp : {1, 2})
    for (float temperature : {0.0f, 0.9f}) {
      auto prefill = make_engine(tp), decode = make_engine(tp);
      std::vector<int> prompt = {1};
      for (int i = 0; i < 37; ++i) prompt.push_back(3 + (i * 53) % 500);
      SamplingParams params;
      params.max_tokens = 40;
      params.temperature = temperature;
      params.seed = 99;
      params.ignore_eos = true;
      params.repetition_penalty = 1.4f;
      const std::vector<int> whole = make_engine(tp)->generate(prompt, params)->token_ids;
      SamplingParams unpenalised = params;
      unpenalised.repetition_penalty = 1.0f;
      EXPECT_NE(whole, make_engine(tp)->generate(prompt, unpenalised)->token_ids);
      const auto [first, handed] = run_prefill_only(*prefill, prompt, params);
      ASSERT_GE(first, 0);
      auto reserved = decode->reserve_cached_blocks({}, "", int(prompt.size()) + params.max_tokens);
      ASSERT_TRUE(reserved.ok());
      copy_kv(*prefill, handed, *decode, reserved->blocks, int((prompt.size() + 15) / 16));
      ASSERT_TRUE(prefill->release_blocks(handed).ok());
      EXPECT_EQ(decode_preloaded(*decode, prompt, params, reserved->blocks, first), whole)
          << "TP " << tp << ", temperature " << temperature;
    }
}

// A request migrated mid-stream: prompt + the k tokens already streamed, prefilled on one
// engine and decoded on another, continues with exactly the draws of the undivided run.
TEST(Handoff, ResumedRequestContinuesAcrossTheSplit) {
  std::vector<int> prompt = {1, 403, 407, 261, 378};
  SamplingParams params;
  params.max_tokens = 40;
  params.temperature = 0.9f;
  params.seed = 77;
  const std::vector<int> whole = make_engine(1)->generate(prompt, params)->token_ids;
  ASSERT_EQ(whole.size(), 40u);
  for (int k : {1, 9, 38}) {
    auto prefill = make_engine(1), decode = make_engine(1);
    std::vector<int> resumed_prompt = prompt;
    resumed_prompt.insert(resumed_prompt.end(), whole.begin(), whole.begin() + k);
    SamplingParams rest = params;
    rest.max_tokens = params.max_tokens - k;
    const auto [first, handed] = run_prefill_only(*prefill, resumed_prompt, rest, k);
    EXPECT_EQ(first, whole[k]) << "cut at " << k;
    auto reserved = decode->reserve_cached_blocks({}, "", int(resumed_prompt.size()) + rest.max_tokens);
    ASSERT_TRUE(reserved.ok());
    copy_kv(*prefill, handed, *decode, reserved->blocks, int(resumed_prompt.size() + 15) / 16);
    ASSERT_TRUE(prefill->release_blocks(handed).ok());
    std::vector<int> got = {};
    if (rest.max_tokens > 1) got = decode_preloaded(*decode, resumed_prompt, rest, reserved->blocks, first, k);
    else ASSERT_TRUE(decode->release_blocks(reserved->blocks).ok());
    std::vector<int> expected(whole.begin() + k + (rest.max_tokens > 1 ? 0 : 1), whole.end());
    if (rest.max_tokens > 1) EXPECT_EQ(got, expected) << "cut at " << k;
    EXPECT_EQ(decode->stats().free_blocks, decode->stats().num_blocks);
  }
}

// The router streams the prefill side's first token itself (first_token_streamed): the decode
// stream then starts after it, and the first token's text as the router's own stop rules give
// it, followed by the decode stream's, is the undivided run's text, held-back bytes included.
TEST(Handoff, AStreamedFirstTokenIsNotStreamedAgainAndTheTextStaysWhole) {
  std::vector<int> prompt = {1, 403, 407, 261, 378};
  SamplingParams base;
  base.max_tokens = 24;
  struct Run {
    std::vector<int> tokens;
    std::string text;
    std::string reason;
  };
  auto collect = [](Run& r) {
    return [&r](const TokenEvent& ev) {
      if (ev.token >= 0) r.tokens.push_back(ev.token);
      r.text += ev.text;
      if (ev.finished) r.reason = std::string(finish_reason_name(ev.reason));
    };
  };
  Run plain;
  {
    auto e = make_engine(1);
    ASSERT_TRUE(e->add_request({"r", prompt, base}, collect(plain)).ok());
    ASSERT_TRUE(e->run_until_idle().ok());
  }
  ASSERT_EQ(plain.tokens.size(), 24u);
  const auto tokenizer_owner = make_engine(1);
  const Tokenizer& tok = tokenizer_owner->tokenizer();
  const std::string first_piece = tok.decode_token(prompt.back(), plain.tokens[0]);
  ASSERT_FALSE(first_piece.empty());
  // No stop string; one the first token's text begins but that never completes (its text is
  // held back until the second token); one that ends the run at its third token; max_tokens 1.
  std::vector<SamplingParams> cases(4, base);
  cases[1].stop_strings = {first_piece + "\x01never"};
  cases[2].stop_strings = {tok.decode_token(plain.tokens[1], plain.tokens[2])};
  cases[3].max_tokens = 1;
  for (size_t c = 0; c < cases.size(); ++c) {
    const SamplingParams& params = cases[c];
    Run whole;
    auto reference = make_engine(1);
    ASSERT_TRUE(reference->add_request({"r", prompt, params}, collect(whole)).ok());
    ASSERT_TRUE(reference->run_until_idle().ok());

    auto prefill = make_engine(1), decode = make_engine(1);
    const auto [first, handed] = run_prefill_only(*prefill, prompt, params);
    ASSERT_EQ(first, whole.tokens.front()) << "case " << c;
    // The router's side: the first token through its own stop rules.
    StopChecker stop(params, prefill->config().eos_ids);
    const StopStep step = stop.push(first, tok.decode_token(prompt.back(), first));
    if (c == 1) {
      EXPECT_EQ(step.delta, "") << "the first token's text is held back";
    }
    Run split;
    split.tokens.push_back(first);
    split.text = step.delta;
    auto reserved = decode->reserve_cached_blocks({}, "", int(prompt.size()) + params.max_tokens);
    ASSERT_TRUE(reserved.ok());
    copy_kv(*prefill, handed, *decode, reserved->blocks, 1);
    ASSERT_TRUE(prefill->release_blocks(handed).ok());
    GenerationRequest req{"r", prompt, params};
    req.handoff.preloaded_blocks = reserved->blocks;
    req.handoff.first_token = first;
    req.handoff.first_token_streamed = true;
    int events = 0;
    ASSERT_TRUE(decode->add_request(req, [&, inner = collect(split)](const TokenEvent& ev) {
      if (events++ == 0 && !ev.finished) {
        EXPECT_NE(ev.token, first) << "the first token came again";
      }
      inner(ev);
    }).ok());
    ASSERT_TRUE(decode->run_until_idle().ok());
    EXPECT_EQ(split.tokens, whole.tokens) << "case " << c;
    EXPECT_EQ(split.text, whole.text) << "case " << c;
    EXPECT_EQ(split.reason, whole.reason) << "case " << c;
    EXPECT_EQ(decode->stats().free_blocks, decode->stats().num_blocks);
  }
  // Only a preloaded request can have had its first token streamed.
  GenerationRequest bad{"b", prompt, base};
  bad.handoff.first_token_streamed = true;
  EXPECT_TRUE(absl::IsInvalidArgument(make_engine(1)->add_request(bad, nullptr)));
}

}  // namespace
}  // namespace pdserve::engine
