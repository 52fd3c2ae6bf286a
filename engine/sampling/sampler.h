// Per-request sampling: the request's parameters (SamplingParams, with their validation) and
// the Sampler that turns one row of logits into the next token. Each request owns its own
// random generator, seeded from the request, so a seeded request draws the same tokens on
// every run whatever else is in the batch.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "common/status.h"
#include "kernels/cpu/sampling.h"

namespace pdserve::engine {

struct SamplingParams {
  float temperature = 0.0f;  // 0: greedy (argmax).
  int top_k = 0;             // 0: off.
  float top_p = 1.0f;        // Nucleus mass in (0, 1]; 1: off.
  int64_t seed = -1;         // -1: seeded at random.
  int max_tokens = 16;       // Generated tokens at most (finish reason "length").
  std::vector<int> stop_token_ids;        // Besides the model's EOS ids.
  std::vector<std::string> stop_strings;  // Generation stops before the first occurrence.
  bool ignore_eos = false;  // Keep going through the model's EOS ids (stop_token_ids still stop).
  // > 0; 1: off. The logit of each id in the prompt or the output so far is divided by it when
  // positive, multiplied by it otherwise (kernels::cpu::penalize).
  float repetition_penalty = 1.0f;
  // In [-2, 2]; 0: off. Over the output so far (vLLM's definitions, kernels/cpu/sampling.h):
  // logit -= frequency_penalty * (times the id was generated) + presence_penalty * (was it).
  float frequency_penalty = 0.0f;
  float presence_penalty = 0.0f;
  // Token id -> added to its logit, each in [-100, 100], at most kMaxLogitBias ids, each in the
  // vocabulary (Engine::add_request checks that).
  std::vector<std::pair<int, float>> logit_bias;
  static constexpr int kMaxLogitBias = 1024;
  // EOS and stop_token_ids cannot be sampled, and stop strings do not stop, until this many
  // tokens were generated (vLLM's min_tokens). <= max_tokens.
  int min_tokens = 0;
  // -1: none. Else each generated token's log-probability and its `logprobs` most likely
  // alternatives (<= kernels::kMaxLogprobs), log_softmax of the raw logits (vLLM's default
  // logprobs_mode, raw_logprobs: before penalties, biases and temperature).
  int logprobs = -1;
  // -1: none. Else the same for every prompt token after the first, computed in the prefill
  // pass (TokenEvent::prompt_logprobs).
  int prompt_logprobs = -1;
  // Whether streamed text leaves out special tokens' text (vLLM's default: true).
  bool skip_special_tokens = true;

  // InvalidArgument naming the offending field: temperature < 0 or NaN, top_p outside (0, 1],
  // top_k < 0, max_tokens <= 0, a negative stop token id, an empty stop string, a
  // repetition_penalty not > 0 and finite, frequency or presence penalty outside [-2, 2], a
  // logit bias outside [-100, 100] or on a negative id or too many of them, min_tokens outside
  // [0, max_tokens], logprobs or prompt_logprobs outside [-1, kMaxLogprobs].
  Status validate() const;
};

class Sampler {
 public:
  // `params` should have passed validate().
  explicit Sampler(const SamplingParams& params);

  // The next token given `vocab` logits (kernels::cpu::sample_token at next_row(), without the
  // penalties and logit edits, which need the sequence's state: kernels::cpu::sample_rows):
  // greedy, the argmax, lowest index on ties; otherwise softmax at the temperature, keep the
  // top_k most likely, then the smallest most-likely prefix holding at least top_p of the mass,
  // and draw from what is left. NaN logits are never chosen (unless nothing else is left).
  int sample(const float* logits, int vocab);
  // How to sample the next token, taking its random draw: for a backend that samples on the
  // device, with the same result as sample() on the same logits. It carries the penalties and
  // the logprobs wanted; the caller, which keeps the sequence's seen ids and its logit edits,
  // fills in its seen slot and its bias and banned ranges.
  kernels::SampleRow next_row();
  // Consumes the random draw that sampling one token takes, without sampling: the decode side
  // of a P/D split calls it for the first token, drawn on the prefill side, so that a seeded
  // request continues with the same draws as an undivided run.
  void skip_draw() { next_row(); }

 private:
  // Uniform in [0, 1) from 53 random bits: the same on every platform, unlike
  // std::uniform_real_distribution whose algorithm the standard leaves open.
  double uniform();

  float temperature_;
  int top_k_;
  float top_p_;
  float repetition_penalty_;
  float frequency_penalty_;
  float presence_penalty_;
  int logprobs_;
  std::mt19937_64 rng_;
  kernels::cpu::SampleScratch scratch_;
};

}  // namespace pdserve::engine
