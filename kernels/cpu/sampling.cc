#include "kernels/cpu/sampling.h"

#include <algorithm>
#include <cmath>

namespace pdserve::kernels::cpu {
namespace {

int argmax_skipping_nan(const float* logits, int vocab) {
  int best = -1;
  for (int i = 0; i < vocab; ++i) {
    if (std::isnan(logits[i])) continue;
    // Strictly greater keeps the lowest index on ties.
    if (best < 0 || logits[i] > logits[best]) best = i;
  }
  return best < 0 ? 0 : best;
}

}  // namespace

int sample_token(const float* logits, int vocab, const SampleRow& row, SampleScratch* scratch) {
  if (vocab <= 0) return 0;
  const int best = argmax_skipping_nan(logits, vocab);
  if (row.temperature == 0.0f || row.top_k == 1) return best;
  const float max_logit = logits[best];
  if (!std::isfinite(max_logit)) return best;
  std::vector<float>& probs = scratch->probs;
  std::vector<int>& candidates = scratch->candidates;
  probs.resize(vocab);
  candidates.clear();
  const double inv_temperature = 1.0 / row.temperature;
  for (int i = 0; i < vocab; ++i) {
    const float logit = logits[i];
    // exp of a non-positive number cannot overflow; NaN and -inf get no mass.
    const float p = std::isnan(logit) ? 0.0f : static_cast<float>(std::exp((logit - max_logit) * inv_temperature));
    probs[i] = p;
    if (p > 0.0f) candidates.push_back(i);
  }
  // Most likely first; the lower index first among equals, so the order is deterministic.
  const auto more_likely = [&probs](int a, int b) { return probs[a] != probs[b] ? probs[a] > probs[b] : a < b; };
  size_t sorted = 0;  // candidates[0, sorted) is in more_likely order.
  if (row.top_k > 0 && static_cast<size_t>(row.top_k) < candidates.size()) {
    std::partial_sort(candidates.begin(), candidates.begin() + row.top_k, candidates.end(), more_likely);
    candidates.resize(row.top_k);
    sorted = candidates.size();
  }
  double total = 0.0;
  for (int id : candidates) total += probs[id];
  if (row.top_p < 1.0f) {
    const double target = static_cast<double>(row.top_p) * total;
    double kept = 0.0;
    size_t count = 0;
    while (count < candidates.size()) {
      if (count == sorted) {
        // The nucleus is usually a small fraction of a large vocabulary: sort a growing
        // prefix instead of everything. partial_sort's prefix is what a full sort would give.
        sorted = std::min(candidates.size(), std::max<size_t>(64, 2 * sorted));
        std::partial_sort(candidates.begin() + count, candidates.begin() + sorted, candidates.end(), more_likely);
      }
      kept += probs[candidates[count++]];
      if (kept >= target) break;
    }
    candidates.resize(count);
    total = kept;
  }
  double remaining = row.u * total;
  for (int id : candidates) {
    remaining -= probs[id];
    if (remaining < 0.0) return id;
  }
  return candidates.back();  // Rounding left a sliver past the last candidate.
}

void update_seen(const SeenTokens& seen, const SampleRow& row) {
  if (row.seen_slot < 0) return;
  uint32_t* slot = seen.slot(row.seen_slot);
  if (row.clear_slot) std::fill_n(slot, seen.words_per_slot(), 0u);
  for (int i = 0; i < row.new_ids_count; ++i) {
    const int id = seen.new_ids[row.new_ids_begin + i];
    if (id >= 0 && id < seen.vocab) slot[id >> 5] |= 1u << (id & 31);
  }
}

void sample_rows(int* tokens, RowLogprobs* logprobs, const ShardedLogits& logits, const SampleRow* params,
                 const SeenTokens& seen, const LogitEdits& edits, SampleScratch* scratch) {
  (void)logprobs;  // Contract only: issue 15's kernel work fills these in.
  (void)edits;
  for (int r = 0; r < logits.rows; ++r) {
    const SampleRow& p = params[r];
    const float* row = logits.row_of_shard(0, r);
    if (logits.shards > 1 || p.seen_slot >= 0) {
      scratch->row.resize(logits.vocab);
      for (int s = 0; s < logits.shards; ++s) {
        const int begin = logits.shard_begin(s), end = logits.shard_begin(s + 1);
        std::copy_n(logits.row_of_shard(s, r), end - begin, scratch->row.data() + begin);
      }
      row = scratch->row.data();
    }
    if (p.seen_slot >= 0) {
      update_seen(seen, p);
      const uint32_t* slot = seen.slot(p.seen_slot);
      for (int i = 0; i < logits.vocab; ++i)
        if (is_seen(slot, i)) scratch->row[i] = penalize(scratch->row[i], p.repetition_penalty);
    }
    tokens[r] = sample_token(row, logits.vocab, p, scratch);
  }
}

}  // namespace pdserve::kernels::cpu
