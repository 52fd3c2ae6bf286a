// Teacher-forced comparison of two engines (issue 18's R4 and R5a). A change of numerics (a bf16
// KV cache, bf16 GEMM inputs) moves logits in their low bits, so free-run token equality with
// the exact engine is not a fair test of it: one near-tie decided the other way changes every
// later token. These score one token stream on both engines instead, position by position.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "engine/engine.h"

namespace pdserve::testing {

// How closely `candidate` follows `reference` over a forced token stream.
struct ForcedAgreement {
  int positions = 0;              // Scored positions: the stream's tokens after the first.
  int argmax_agree = 0;           // Positions whose most likely next token is the same on both.
  float max_logprob_diff = 0.0f;  // The largest |Δ log p| of a forced token.
};

// `forced` as a prompt on both engines, scored by prompt log-probabilities (prefill only: the
// engines' --max-batch-tokens choose its chunks, and so the GEMMs' row counts).
inline ForcedAgreement teacher_forced(engine::Engine& reference, engine::Engine& candidate,
                                      const std::vector<int>& forced) {
  engine::SamplingParams score;
  score.max_tokens = 1;
  score.prompt_logprobs = 1;
  auto want = reference.generate(forced, score), got = candidate.generate(forced, score);
  ForcedAgreement a;
  EXPECT_TRUE(want.ok() && got.ok()) << want.status() << " " << got.status();
  if (!want.ok() || !got.ok()) return a;
  EXPECT_EQ(got->prompt_logprobs.size(), forced.size() - 1);
  EXPECT_EQ(want->prompt_logprobs.size(), forced.size() - 1);
  a.positions = int(std::min(got->prompt_logprobs.size(), want->prompt_logprobs.size()));
  for (int i = 0; i < a.positions; ++i) {
    const engine::TokenLogprob &g = got->prompt_logprobs[i], &w = want->prompt_logprobs[i];
    EXPECT_EQ(g.token, forced[i + 1]);
    if (g.top.empty() || w.top.empty()) {
      ADD_FAILURE() << "position " << i << " has no top log-probability";
      continue;
    }
    a.argmax_agree += g.top[0].first == w.top[0].first;
    a.max_logprob_diff = std::max(a.max_logprob_diff, std::abs(g.logprob - w.logprob));
  }
  return a;
}

// `candidate`'s greedy continuation of `prompt` (n tokens, EOS ignored), judged by `reference`:
// the most a chosen token's log-probability falls short of the reference's best choice there (0
// where every choice is the reference's own).
inline float worst_choice_gap(engine::Engine& reference, engine::Engine& candidate, std::vector<int> prompt, int n) {
  engine::SamplingParams run;
  run.max_tokens = n;
  run.ignore_eos = true;
  auto free_run = candidate.generate(prompt, run);
  EXPECT_TRUE(free_run.ok()) << free_run.status();
  if (!free_run.ok()) return INFINITY;
  const size_t first = prompt.size() - 1;  // Prompt log-probabilities start at the second token.
  prompt.insert(prompt.end(), free_run->token_ids.begin(), free_run->token_ids.end());
  engine::SamplingParams score;
  score.max_tokens = 1;
  score.prompt_logprobs = 1;
  auto judged = reference.generate(prompt, score);
  EXPECT_TRUE(judged.ok()) << judged.status();
  if (!judged.ok()) return INFINITY;
  float gap = 0.0f;
  for (size_t i = first; i < judged->prompt_logprobs.size(); ++i) {
    const engine::TokenLogprob& j = judged->prompt_logprobs[i];
    if (j.top.empty()) return INFINITY;
    gap = std::max(gap, j.top[0].second - j.logprob);
  }
  return gap;
}

}  // namespace pdserve::testing
