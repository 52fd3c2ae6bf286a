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
  int32_t* counts = seen.counts != nullptr ? seen.counts_of(row.seen_slot) : nullptr;
  if (row.clear_slot) {
    std::fill_n(slot, seen.words_per_slot(), 0u);
    if (counts != nullptr) std::fill_n(counts, seen.vocab, 0);
  }
  for (int i = 0; i < row.new_ids_count; ++i) {
    const int id = seen.new_ids[row.new_ids_begin + i];
    if (id < 0 || id >= seen.vocab) continue;
    slot[id >> 5] |= 1u << (id & 31);
    if (counts != nullptr && i >= row.new_output_from) ++counts[id];
  }
}

LogNormalizer log_normalizer(const float* logits, int vocab) {
  float max = -INFINITY;
  for (int i = 0; i < vocab; ++i)
    if (logits[i] > max) max = logits[i];  // NaN compares false: skipped.
  double sum = 0.0;
  for (int i = 0; i < vocab; ++i)
    if (!std::isnan(logits[i])) sum += std::exp(LogNormalizer::logprob_shift(logits[i], max));
  return {max, std::log(sum)};
}

void row_logprobs(const float* logits, int vocab, int id, int top, RowLogprobs* out) {
  top = std::max(0, std::min({top, kMaxLogprobs, vocab}));
  const LogNormalizer normalizer = log_normalizer(logits, vocab);
  const auto key = [logits](int i) { return std::isnan(logits[i]) ? -INFINITY : logits[i]; };
  // The top ids kept sorted (more likely first, the lower id among equals) while scanning in id
  // order: a later id enters only when strictly more likely than the last kept.
  int count = 0;
  for (int i = 0; i < vocab && top > 0; ++i) {
    const float k = key(i);
    if (count == top && !(k > key(out->top_ids[count - 1]))) continue;
    int at = count < top ? count++ : top - 1;
    while (at > 0 && k > key(out->top_ids[at - 1])) {
      out->top_ids[at] = out->top_ids[at - 1];
      --at;
    }
    out->top_ids[at] = i;
  }
  out->top_count = count;
  for (int j = 0; j < count; ++j) out->top_logprobs[j] = normalizer.logprob(logits[out->top_ids[j]]);
  out->logprob = id >= 0 && id < vocab ? normalizer.logprob(logits[id]) : -INFINITY;
}

void sample_rows(int* tokens, RowLogprobs* logprobs, const ShardedLogits& logits, const SampleRow* params,
                 const SeenTokens& seen, const LogitEdits& edits, SampleScratch* scratch) {
  const int vocab = logits.vocab;
  for (int r = 0; r < logits.rows; ++r) {
    const SampleRow& p = params[r];
    update_seen(seen, p);
    const bool penalised =
        p.seen_slot >= 0 && (p.repetition_penalty != 1.0f || p.frequency_penalty != 0.0f || p.presence_penalty != 0.0f);
    const bool edited = p.bias_count > 0 || p.banned_count > 0 || penalised;
    const bool want_logprobs = logprobs != nullptr && p.logprobs >= 0;
    // A plain row is sampled where it lies; a gathered or edited one is copied into scratch.
    const float* row = logits.row_of_shard(0, r);
    if (logits.shards > 1 || edited) {
      scratch->row.resize(vocab);
      for (int s = 0; s < logits.shards; ++s) {
        const int begin = logits.shard_begin(s), end = logits.shard_begin(s + 1);
        std::copy_n(logits.row_of_shard(s, r), end - begin, scratch->row.data() + begin);
      }
      row = scratch->row.data();
    }
    // Of the raw row, before any edit; the sampled token's log-probability once it is known.
    LogNormalizer normalizer;
    if (want_logprobs) {
      row_logprobs(row, vocab, p.logprob_of, p.logprobs, &logprobs[r]);
      if (p.logprob_of < 0) normalizer = log_normalizer(row, vocab);
    }
    if (edited) {
      float* edit = scratch->row.data();
      for (int i = 0; i < p.bias_count; ++i) {
        const LogitBias& b = edits.biases[p.bias_begin + i];
        if (b.id >= 0 && b.id < vocab) edit[b.id] += b.bias;
      }
      for (int i = 0; i < p.banned_count; ++i) {
        const int id = edits.banned[p.banned_begin + i];
        if (id >= 0 && id < vocab) edit[id] = -INFINITY;
      }
      if (penalised) {
        const uint32_t* slot = seen.slot(p.seen_slot);
        const int32_t* counts = seen.counts != nullptr ? seen.counts_of(p.seen_slot) : nullptr;
        for (int i = 0; i < vocab; ++i) {
          if (is_seen(slot, i)) edit[i] = penalize(edit[i], p.repetition_penalty);
          if (counts != nullptr && counts[i] != 0)
            edit[i] = penalize_counted(edit[i], counts[i], p.frequency_penalty, p.presence_penalty);
        }
      }
    }
    tokens[r] = sample_token(row, vocab, p, scratch);
    add_sampled_to_seen(seen, p, tokens[r]);
    if (want_logprobs && p.logprob_of < 0) {
      // The raw logit of the token: the row was edited in scratch, the shards were not.
      int s = 0;
      while (logits.shard_begin(s + 1) <= tokens[r]) ++s;
      const float raw = logits.row_of_shard(s, r)[tokens[r] - logits.shard_begin(s)];
      logprobs[r].logprob = normalizer.logprob(raw);
    }
  }
}

}  // namespace pdserve::kernels::cpu
