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

#if defined(__CUDACC__) || defined(__HIPCC__)
#define PDSERVE_HOST_DEVICE __host__ __device__
#else
#define PDSERVE_HOST_DEVICE
#endif

namespace pdserve::kernels::cpu {

// The most alternatives a row's log-probabilities list (OpenAI's top_logprobs limit).
inline constexpr int kMaxLogprobs = 20;

// One logit_bias entry: `bias` is added to the logit of `id`.
struct LogitBias {
  int id = 0;
  float bias = 0.0f;
};

// A step's sparse logit edits, shared by its rows (each row names its ranges in SampleRow).
struct LogitEdits {
  const LogitBias* biases = nullptr;
  const int* banned = nullptr;  // Ids whose logit becomes -inf.
};

// A row's log-probabilities, log_softmax of its raw logits: of one token, and the row's
// `top_count` most likely tokens, most likely first (the lower id first among equals). NaN
// logits count as -inf.
struct RowLogprobs {
  float logprob = 0.0f;  // Of SampleRow::logprob_of, or of the sampled token.
  int top_count = 0;
  int top_ids[kMaxLogprobs] = {};
  float top_logprobs[kMaxLogprobs] = {};
};

// How to pick one row's token.
struct SampleRow {
  float temperature = 0.0f;  // 0: greedy.
  int top_k = 0;             // 0: off.
  float top_p = 1.0f;        // In (0, 1]; 1: off.
  double u = 0.0;            // The draw, uniform in [0, 1); unused when greedy.
  // The repetition penalty, applied when seen_slot >= 0: each id of the slot's bitmap in
  // SeenTokens, once the row's new ids are in it, has its logit divided by the penalty when
  // positive and multiplied by it otherwise. The slot holds the sequence's ids across steps, so
  // a step adds only what is new since the last (the whole prompt first, then one token).
  float repetition_penalty = 1.0f;
  int seen_slot = -1;       // -1: no penalty.
  bool clear_slot = false;  // Empty the slot before adding (a slot's first use by a sequence).
  int new_ids_begin = 0;    // SeenTokens::new_ids[begin, begin + count) join the slot first.
  int new_ids_count = 0;
  // Of those new ids, the ones from new_ids_begin + new_output_from on are output tokens: they
  // are also counted in the slot's output counts (SeenTokens::counts), which the frequency and
  // presence penalties read: logit -= frequency_penalty * count + presence_penalty * (count > 0).
  int new_output_from = 0;
  float frequency_penalty = 0.0f;
  float presence_penalty = 0.0f;
  // LogitEdits::biases[bias_begin, bias_begin + bias_count) are added to the row's logits,
  // then LogitEdits::banned[banned_begin, banned_begin + banned_count) set to -inf. Ids outside
  // the vocabulary are skipped.
  int bias_begin = 0;
  int bias_count = 0;
  int banned_begin = 0;
  int banned_count = 0;
  // -1: no log-probabilities. Else, in the row's RowLogprobs, the log-probability of
  // `logprob_of` (-1: of the sampled token) and the top `logprobs` (<= kMaxLogprobs) tokens.
  int logprobs = -1;
  int logprob_of = -1;
};

// The token ids each penalised sequence has seen (prompt and output so far), kept where the
// rows are sampled: one bitmap of vocab bits per slot, [slots][words_per_slot()] 32-bit words;
// how often each id occurs in the sequence's output, [slots][vocab] counts; and the step's new
// ids, which sampling adds to the rows' slots.
struct SeenTokens {
  uint32_t* bits = nullptr;
  int32_t* counts = nullptr;
  const int* new_ids = nullptr;
  int vocab = 0;

  PDSERVE_HOST_DEVICE int64_t words_per_slot() const { return (int64_t(vocab) + 31) / 32; }
  PDSERVE_HOST_DEVICE uint32_t* slot(int s) const { return bits + int64_t(s) * words_per_slot(); }
  PDSERVE_HOST_DEVICE int32_t* counts_of(int s) const { return counts + int64_t(s) * vocab; }
};

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

// The logits of `rows` rows over `vocab` columns as tensor-parallel ranks gather them. Shard s
// holds the columns [shard_begin(s), shard_begin(s+1)) of every row — the first vocab % shards
// shards one column more, as the engine splits the LM head — as a [rows][its columns] matrix
// at data + s*rows*shard_stride(): each rank's slice padded to the widest for the all-gather.
// One shard is the plain [rows][vocab].
struct ShardedLogits {
  const float* data = nullptr;
  int rows = 0;
  int vocab = 0;
  int shards = 1;

  PDSERVE_HOST_DEVICE int shard_begin(int s) const {
    const int base = vocab / shards, extra = vocab % shards;
    return s * base + (s < extra ? s : extra);
  }
  // Columns of the widest shard.
  PDSERVE_HOST_DEVICE int shard_stride() const { return vocab / shards + (vocab % shards != 0 ? 1 : 0); }
  PDSERVE_HOST_DEVICE const float* row_of_shard(int s, int row) const {
    return data + int64_t(s) * rows * shard_stride() + int64_t(row) * (shard_begin(s + 1) - shard_begin(s));
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

// The normaliser of one row of `vocab` logits.
LogNormalizer log_normalizer(const float* logits, int vocab);

// log_softmax of one row of raw logits: the log-probability of `id` (-inf outside the
// vocabulary) and of the min(top, kMaxLogprobs, vocab) most likely ids into `out` (NaN ranked as
// -inf, the lower id first among equal logits).
void row_logprobs(const float* logits, int vocab, int id, int top, RowLogprobs* out);

// For every row r: logprobs[r] from the raw row when params[r].logprobs >= 0 (row_logprobs; the
// sampled token's, when logprob_of is -1, is of its raw logit too; other rows' entries are left
// as they were); update_seen; the edits and penalties (the module comment's order);
// tokens[r] = sample_token(the edited row, params[r]). `seen` may be empty when no row has a
// slot, its counts null when no row has a frequency or presence penalty, `edits` empty when no
// row has edits, and `logprobs` null when no row asks for them. A row that is neither gathered
// (shards > 1) nor edited is sampled in place, not copied.
void sample_rows(int* tokens, RowLogprobs* logprobs, const ShardedLogits& logits, const SampleRow* params,
                 const SeenTokens& seen, const LogitEdits& edits, SampleScratch* scratch);

}  // namespace pdserve::kernels::cpu
