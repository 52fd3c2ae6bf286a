// Token sampling, the reference every backend's sampling kernel follows. Per row, in vLLM V1's
// order: the log-probabilities of the raw logits (vLLM's default logprobs_mode, raw_logprobs:
// before any of what follows), then the logit edits — logit_bias added, banned ids (min_tokens'
// stop ids) set to -inf — then the penalties — repetition on the ids the row has seen (prompt
// and output), frequency and presence on the output's counts — then greedy argmax, or a
// softmax at a temperature restricted to the top_k most likely tokens, then to the smallest
// most-likely prefix holding top_p of their mass, and a draw from what is left at a uniform
// number the caller supplies. The random generator stays with the caller (engine::Sampler owns
// one per request), so a backend that samples on the device, given the same number, picks the
// same token and a seeded request draws the same tokens wherever it is sampled.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/abi.h"

namespace pdserve::kernels::cpu {

// transformers' RepetitionPenaltyLogitsProcessor (and vLLM's) on one logit of a seen id.
PDSERVE_HOST_DEVICE inline float penalize(float logit, float penalty) {
  return logit > 0.0f ? logit / penalty : logit * penalty;
}
PDSERVE_HOST_DEVICE inline bool is_seen(const uint32_t* slot, int id) { return (slot[id >> 5] >> (id & 31)) & 1u; }

// The frequency and presence penalties on one logit of an id the output holds `count` times.
// In double, where frequency * count is exact (counts below 2^29), so that no backend's fused
// multiply-add can round it differently; one rounding to float at the end.
PDSERVE_HOST_DEVICE inline float penalize_counted(float logit, int32_t count, float frequency, float presence) {
  if (count <= 0) return logit;
  return float(double(logit) - (double(frequency) * double(count) + double(presence)));
}

// log_softmax's normaliser of a row: its largest logit (NaN skipped) and log sum exp(x - max)
// over its non-NaN logits, in double. NaN gets -inf, as does everything in a row with no logit
// above -inf (it has no mass to share); x == max counts as x - max = 0, so a row whose max is
// +inf shares the mass among its +inf logits.
struct LogNormalizer {
  float max = -INFINITY;
  double log_sum = 0.0;

  PDSERVE_HOST_DEVICE float logprob(float x) const {
    return x != x || max == -INFINITY ? -INFINITY : float(logprob_shift(x, max) - log_sum);
  }
  PDSERVE_HOST_DEVICE static double logprob_shift(float x, float max) {
    return x == max ? 0.0 : double(x) - double(max);
  }
};

// Reused between calls, so that sampling does not allocate a vocabulary's worth per token.
struct SampleScratch {
  std::vector<float> row, probs;
  std::vector<int> candidates;
};

// The token for one row of `vocab` logits. Greedy (temperature 0 or top_k 1): the argmax, the
// lowest index on ties. Otherwise probabilities exp((logit - max) / temperature); the top_k
// most likely (ties to the lower index); of those, in that order, the shortest prefix whose
// mass reaches top_p of theirs; then the first candidate at which the running mass exceeds
// u × the candidates' mass — walked most likely first when top_k or top_p cut the
// candidates, in index order when neither did. NaN logits are never chosen (unless nothing
// else is left).
int sample_token(const float* logits, int vocab, const SampleRow& row, SampleScratch* scratch);

// Adds row's new ids to its slot of `seen` — the bitmap, and the output counts from
// new_output_from on — emptying both first when clear_slot; ids outside the vocabulary are
// skipped. Nothing for a row without a slot.
void update_seen(const SeenTokens& seen, const SampleRow& row);

// Adds `token`, sampled by `row`, to its slot of `seen` as an output token (the bitmap, and the
// count when `seen` keeps counts), when row.add_sampled; nothing for a row without a slot. The
// GPU sampler calls it too (one thread of the row's block).
PDSERVE_HOST_DEVICE inline void add_sampled_to_seen(const SeenTokens& seen, const SampleRow& row, int token) {
  if (row.seen_slot < 0 || !row.add_sampled || token < 0 || token >= seen.vocab) return;
  seen.slot(row.seen_slot)[token >> 5] |= 1u << (token & 31);
  if (seen.counts != nullptr) ++seen.counts_of(row.seen_slot)[token];
}

// The normaliser of one row of `vocab` logits.
LogNormalizer log_normalizer(const float* logits, int vocab);

// log_softmax of one row of raw logits: the log-probability of `id` (-inf outside the
// vocabulary) and of the min(top, kMaxLogprobs, vocab) most likely ids into `out` (NaN ranked as
// -inf, the lower id first among equal logits).
void row_logprobs(const float* logits, int vocab, int id, int top, RowLogprobs* out);

// For every row r: logprobs[r] from the raw row when params[r].logprobs >= 0 (row_logprobs; the
// sampled token's, when logprob_of is -1, is of its raw logit too; other rows' entries are left
// as they were); update_seen; the edits and penalties (the module comment's order);
// tokens[r] = sample_token(the edited row, params[r]), which then joins the row's slot when
// params[r].add_sampled (add_sampled_to_seen). `seen` may be empty when no row has a
// slot, its counts null when no row has a frequency or presence penalty, `edits` empty when no
// row has edits, and `logprobs` null when no row asks for them. A row that is neither gathered
// (shards > 1) nor edited is sampled in place, not copied.
void sample_rows(int* tokens, RowLogprobs* logprobs, const ShardedLogits& logits, const SampleRow* params,
                 const SeenTokens& seen, const LogitEdits& edits, SampleScratch* scratch);

}  // namespace pdserve::kernels::cpu
