// Token sampling on the device, one block per row, picking what kernels/cpu/sampling.h's
// reference picks, so that only one int per row (and, for rows asking, its RowLogprobs) leaves
// the GPU instead of the row's logits. The log-probabilities come from the raw row first; a row
// with logit edits or count penalties is then edited into its scratch row, on which the rest
// runs as on a plain row.
//
// The reference sorts candidates; a block cannot sort a 128K vocabulary cheaply, so it works
// with cuts of the sorted order instead. Most likely first, lower index first among equals, the
// prefix ending at element (v, c) holds every probability above v and those equal to v with
// index <= c. "The shortest prefix whose count or mass reaches a target" — top_k, top_p and the
// draw alike — is then a binary search over v's bits (probabilities are non-negative floats,
// so their bits order as their values) followed by a walk, in index order, over the elements
// equal to v. Sums are in a fixed order (each thread's elements in turn, then a fixed tree), so
// a row samples the same token on every run; they can differ from the reference's sequential
// sums in the last bits of a double, which can move a token only for a draw within ~1e-16 of a
// boundary.
//
// Each step of those searches is a pass over the elements, ~60-100 per top-p row; so a row with
// top_k or top_p first narrows them (issue 18's R3): one pass builds a histogram of the
// probabilities by their top bits (exact counts, and masses in integer fixed point, so that the
// atomics add up alike in any order), which names a bin edge every element of the final prefix
// is at or above; the columns at or above it are compacted, in column order, and the searches
// run over those alone. A count cut (top_k) is exact; a mass cut (top_p alone) takes one bin more
// than the fixed-point masses say, and the searches' own sum over the candidates must reach the
// target, or the row searches all its elements as before. Either way the searches see the
// elements the full searches would at every value they try above the edge; their double sums run
// over the candidates in another order, which can differ in the last bits (the same ~1e-16 as
// above, and as deterministic).
#include <cmath>

#include "kernels/cpu/sampling.h"
#include "kernels/gpu/kernel_util.h"

namespace pdserve::kernels::gpu {
namespace {

using kernels::SampleRow;
using kernels::SeenTokens;
using kernels::ShardedLogits;

constexpr int kSampleThreads = 512;  // A block on the GPU: a multiple of both warp sizes.
constexpr uint32_t kOneBits = 0x3F800000u;  // 1.0f: no probability is larger.
// Histogram bins by a probability's top bits (sign, exponent, 3 mantissa bits): p <= 1 gives a
// bin <= kOneBits >> kBinShift = 1016.
constexpr int kBinShift = 20, kBins = 1024;
constexpr double kMassScale = 1099511627776.0;  // 2^40: a bin's mass as an integer.

// The elements a search runs over, by position: every column of the row (idx == nullptr:
// position i is column i), or a list of columns in increasing order. `probs` is by column.
struct Elements {
  const float* probs;
  const int* idx;
  int n;
  __device__ int col(int i) const { return idx != nullptr ? idx[i] : i; }
};

// The prefix of the sorted order ending at (v, c); (0, -1) is every positive probability.
struct Cut {
  float v;
  int c;
  __device__ bool holds(float p, int i) const { return p > v || (p == v && i <= c); }
};

// Sum over the block in a fixed order, every thread getting it.
__device__ double block_sum(double x, double* shared) {
  __syncthreads();  // `shared` may still be read by a previous call.
  shared[threadIdx.x] = x;
  __syncthreads();
  for (int s = int(blockDim.x) / 2; s > 0; s >>= 1) {
    if (int(threadIdx.x) < s) shared[threadIdx.x] += shared[threadIdx.x + s];
    __syncthreads();
  }
  return shared[0];
}

// Count (mass == false) or mass of the elements of `cut` with probability >= at_least.
__device__ double measure(Elements e, Cut cut, float at_least, bool mass, double* shared) {
  double sum = 0.0;
  for (int i = threadIdx.x; i < e.n; i += blockDim.x) {
    const int c = e.col(i);
    const float p = e.probs[c];
    if (p >= at_least && cut.holds(p, c)) sum += mass ? double(p) : 1.0;
  }
  return block_sum(sum, shared);
}

__device__ bool reaches(double f, double target, bool strict) { return strict ? f > target : f >= target; }

// This thread's contiguous share [begin, end) of n elements: the block's threads, in order, cover
// them in order (walk and compact scan the shares' sums in thread order).
struct Chunk {
  int begin, end;
};
__device__ Chunk chunk_of(int n) {
  const int chunk = (n + int(blockDim.x) - 1) / int(blockDim.x);
  const int begin = min(n, int(threadIdx.x) * chunk);
  return {begin, min(n, begin + chunk)};
}

// In index order, the first element satisfying `pred` at which base + the running count or mass
// of such elements reaches `target`; the last such element if none does (the caller's sums, in
// another order, reached it), -1 if there is none. Each thread sums a contiguous chunk, one thread scans the
// chunk sums, and the thread of the chunk where the target is reached walks it.
template <typename Pred>
__device__ int walk(Elements e, Pred pred, bool mass, double base, double target, bool strict, double* shared,
                    int* result) {
  const int threads = blockDim.x;
  const auto [begin, end] = chunk_of(e.n);
  double sum = 0.0;
  int last = -1;
  for (int i = begin; i < end; ++i) {
    const int c = e.col(i);
    const float p = e.probs[c];
    if (pred(p, c)) {
      sum += mass ? double(p) : 1.0;
      last = c;
    }
  }
  __syncthreads();  // `shared` and `result` may still be read by a previous call.
  shared[threadIdx.x] = sum;
  if (threadIdx.x == 0) result[0] = result[2] = -1;
  __syncthreads();
  if (threadIdx.x == 0) {
    double running = base;
    int owner = -1;
    for (int t = 0; t < threads && owner < 0; ++t) {
      if (reaches(running + shared[t], target, strict)) owner = t;
      else running += shared[t];
    }
    result[1] = owner;
    shared[threads] = running;  // The total before the owner's chunk.
  }
  atomicMax(&result[2], last);
  __syncthreads();
  if (int(threadIdx.x) == result[1]) {
    // Where the running total reaches the target, or else (added from another start, it rounds
    // differently) the chunk's last element, with which its own sum did.
    double running = shared[threads];
    int at = -1;
    for (int i = begin; i < end; ++i) {
      const int c = e.col(i);
      const float p = e.probs[c];
      if (!pred(p, c)) continue;
      at = c;
      running += mass ? double(p) : 1.0;
      if (reaches(running, target, strict)) break;
    }
    result[0] = at;
  }
  __syncthreads();
  return result[0] >= 0 ? result[0] : result[2];
}

// The shortest prefix of `cut` in sorted order whose count or mass reaches `target` (strictly
// when `strict`); `cut` itself must reach it.
__device__ Cut select(Elements e, Cut cut, bool mass, double target, bool strict, double* shared, int* result) {
  // The largest v whose elements >= v reach the target: v = 0 (all of `cut`) does; above 1 none.
  uint32_t lo = 0, hi = kOneBits + 1;
  while (hi - lo > 1) {
    const uint32_t mid = lo + (hi - lo) / 2;
    if (reaches(measure(e, cut, __uint_as_float(mid), mass, shared), target, strict))
      lo = mid;
    else hi = mid;
  }
  const float v = __uint_as_float(lo);
  const double above = measure(e, cut, __uint_as_float(lo + 1), mass, shared);  // Elements > v.
  const auto equal = [cut, v](float p, int i) { return p == v && cut.holds(p, i); };
  return Cut{v, walk(e, equal, mass, above, target, strict, shared, result)};
}

// Per bin of probabilities by top bits: how many, and their mass in 2^-40 units (rounded down).
struct Histogram {
  unsigned* counts;            // [kBins]
  unsigned long long* masses;  // [kBins]
};

// One pass over the row's n probabilities: their histogram, and the count and mass of the
// positive ones in measure's order (so the same doubles as measure's).
__device__ void histogram(const float* probs, int n, Histogram h, double* count, double* mass, double* shared) {
  for (int b = threadIdx.x; b < kBins; b += blockDim.x) {
    h.counts[b] = 0u;
    h.masses[b] = 0ull;
  }
  __syncthreads();
  double c = 0.0, m = 0.0;
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const float p = probs[i];
    if (!(p > 0.0f)) continue;
    // p <= 1 for a positive temperature; a larger p (a caller's bad row) stays in bounds.
    const int bin = min(int(__float_as_uint(p) >> kBinShift), kBins - 1);
    atomicAdd(&h.counts[bin], 1u);
    atomicAdd(&h.masses[bin], static_cast<unsigned long long>(double(p) * kMassScale));
    c += 1.0;
    m += double(p);
  }
  *count = block_sum(c, shared);
  *mass = block_sum(m, shared);
}

// The lower edge of the highest bin at which the bins from the top hold `target` elements
// (by_mass false) or mass, one bin lower again for a mass (the fixed-point masses are rounded
// down, and the searches' double sums round otherwise); 0 when none does. Into every thread.
__device__ float bin_edge(Histogram h, bool by_mass, double target, int* result) {
  __syncthreads();  // `result` may still be read by a previous call.
  if (threadIdx.x == 0) {
    double cum = 0.0;
    int bin = 0;
    for (int b = kBins - 1; b >= 0; --b) {
      cum += by_mass ? double(h.masses[b]) / kMassScale : double(h.counts[b]);
      if (cum >= target) {
        bin = by_mass && b > 0 ? b - 1 : b;
        break;
      }
    }
    result[0] = bin;
  }
  __syncthreads();
  return __uint_as_float(uint32_t(result[0]) << kBinShift);
}

// The columns whose probability is at least `edge` (and positive), in column order, into
// `cand`; their number. Each thread counts its contiguous chunk, a scan of the counts gives
// each chunk's place, and each thread writes its own.
__device__ int compact(const float* probs, int n, float edge, int* cand, int* offsets) {
  const int threads = blockDim.x;
  const auto [begin, end] = chunk_of(n);
  const auto keep = [edge](float p) { return p > 0.0f && p >= edge; };
  int count = 0;
  for (int i = begin; i < end; ++i) count += keep(probs[i]);
  __syncthreads();  // `offsets` may still be read by a previous call.
  offsets[threadIdx.x] = count;
  __syncthreads();
  if (threadIdx.x == 0) {
    int running = 0;
    for (int t = 0; t < threads; ++t) {
      const int c = offsets[t];
      offsets[t] = running;
      running += c;
    }
    offsets[threads] = running;
  }
  __syncthreads();
  int at = offsets[threadIdx.x];
  for (int i = begin; i < end; ++i)
    if (keep(probs[i])) cand[at++] = i;
  __syncthreads();  // Every candidate is written before anyone reads the list.
  return offsets[threads];
}

// The largest value(x, col) over row `row`'s columns with eligible(value, col), the lowest column
// among equals, into every thread; i == vocab when none is eligible. Each thread walks its
// columns in increasing order, then a fixed tree picks among the threads.
struct Best {
  float v;
  int i;
};
template <typename Value, typename Eligible>
__device__ Best block_argmax(const ShardedLogits& logits, int row, Value value, Eligible eligible, float* best_v,
                             int* best_i) {
  const int n = logits.vocab;
  float v = -INFINITY;
  int idx = n;
  for (int s = 0; s < logits.shards; ++s) {
    const int begin = logits.shard_begin(s), cols = logits.shard_begin(s + 1) - begin;
    const float* src = logits.row_of_shard(s, row);
    for (int j = threadIdx.x; j < cols; j += blockDim.x) {
      const float x = value(src[j], begin + j);
      if (eligible(x, begin + j) && (idx == n || x > v)) {
        v = x;
        idx = begin + j;
      }
    }
  }
  __syncthreads();  // best_v and best_i may still be read by a previous call.
  best_v[threadIdx.x] = v;
  best_i[threadIdx.x] = idx;
  __syncthreads();
  for (int s = int(blockDim.x) / 2; s > 0; s >>= 1) {
    if (int(threadIdx.x) < s) {
      const float ov = best_v[threadIdx.x + s];
      const int oi = best_i[threadIdx.x + s];
      const int mi = best_i[threadIdx.x];
      if (oi < n && (mi == n || ov > best_v[threadIdx.x] || (ov == best_v[threadIdx.x] && oi < mi))) {
        best_v[threadIdx.x] = ov;
        best_i[threadIdx.x] = oi;
      }
    }
    __syncthreads();
  }
  return Best{best_v[0], best_i[0]};
}

// The raw logit of column `col` of row `row`.
__device__ float logit_of(const ShardedLogits& logits, int row, int col) {
  int s = 0;
  while (logits.shard_begin(s + 1) <= col) ++s;
  return logits.row_of_shard(s, row)[col - logits.shard_begin(s)];
}

__global__ void sample_kernel(int* tokens, kernels::RowLogprobs* logprobs, ShardedLogits logits, const SampleRow* params,
                              SeenTokens seen, kernels::LogitEdits edits, float* scratch) {
  __shared__ double shared[kSampleThreads + 1];
  __shared__ float best_v[kSampleThreads];
  __shared__ int best_i[kSampleThreads + 1];  // Also compact()'s per-thread offsets and total.
  __shared__ unsigned bin_counts[kBins];
  __shared__ unsigned long long bin_masses[kBins];
  __shared__ int result[3];
  __shared__ int top_ids[kernels::kMaxLogprobs];
  __shared__ float top_v[kernels::kMaxLogprobs];
  const int row = blockIdx.x, n = logits.vocab;
  const SampleRow P = params[row];
  const auto no_nan = [](float x, int) { return !isnan(x); };

  // The log-probabilities of the raw row (cpu::row_logprobs), before anything edits it: the
  // max, the sum of exp in double, and the top ids by passes of an argmax, each excluding what
  // the passes before chose — everything at or before the last in the order (logit descending,
  // id ascending) — with NaN ranked as -inf.
  const bool want_logprobs = logprobs != nullptr && P.logprobs >= 0;
  cpu::LogNormalizer normalizer;
  int top = 0;
  if (want_logprobs) {
    const auto key = [](float x, int) { return isnan(x) ? -INFINITY : x; };
    const auto any = [](float, int) { return true; };
    normalizer.max = block_argmax(logits, row, key, any, best_v, best_i).v;
    double sum = 0.0;
    for (int s = 0; s < logits.shards; ++s) {
      const int cols = logits.shard_begin(s + 1) - logits.shard_begin(s);
      const float* src = logits.row_of_shard(s, row);
      for (int j = threadIdx.x; j < cols; j += blockDim.x)
        if (!isnan(src[j])) sum += exp(cpu::LogNormalizer::logprob_shift(src[j], normalizer.max));
    }
    normalizer.log_sum = log(block_sum(sum, shared));
    top = P.logprobs < kernels::kMaxLogprobs ? P.logprobs : kernels::kMaxLogprobs;
    if (top > n) top = n;
    for (int j = 0; j < top; ++j) {
      const float last_v = j > 0 ? top_v[j - 1] : 0.0f;
      const int last_i = j > 0 ? top_ids[j - 1] : -1;
      const auto after_last = [j, last_v, last_i](float x, int col) {
        return j == 0 || x < last_v || (x == last_v && col > last_i);
      };
      const Best b = block_argmax(logits, row, key, after_last, best_v, best_i);
      if (threadIdx.x == 0) {
        top_ids[j] = b.i;
        top_v[j] = b.v;
      }
      __syncthreads();  // Every thread reads the pass's choice before the next.
    }
  }

  // cpu::update_seen: the step's new ids join the row's slot, which stays on the device
  // between steps; the output's among them are counted. One thread counts, so that a repeated
  // id needs no atomic add (a step brings one output token, or a preempted sequence's few).
  uint32_t* slot = nullptr;
  int32_t* counts = nullptr;
  if (P.seen_slot >= 0) {
    slot = seen.slot(P.seen_slot);
    if (seen.counts != nullptr) counts = seen.counts_of(P.seen_slot);
    if (P.clear_slot) {
      for (int64_t w = threadIdx.x; w < seen.words_per_slot(); w += blockDim.x) slot[w] = 0u;
      if (counts != nullptr)
        for (int i = threadIdx.x; i < n; i += blockDim.x) counts[i] = 0;
    }
    __syncthreads();
    for (int i = threadIdx.x; i < P.new_ids_count; i += blockDim.x) {
      const int id = seen.new_ids[P.new_ids_begin + i];
      if (id >= 0 && id < n) atomicOr(&slot[id >> 5], 1u << (id & 31));
    }
    if (counts != nullptr && threadIdx.x == 0)
      for (int i = P.new_output_from > 0 ? P.new_output_from : 0; i < P.new_ids_count; ++i) {
        const int id = seen.new_ids[P.new_ids_begin + i];
        if (id >= 0 && id < n) ++counts[id];
      }
    __syncthreads();
  }
  const float penalty = P.repetition_penalty, frequency = P.frequency_penalty, presence = P.presence_penalty;
  // The penalties on one logit, in the reference's order: repetition, then frequency and presence.
  const auto penalise = [slot, counts, penalty, frequency, presence](float x, int col) {
    if (slot == nullptr) return x;
    if (cpu::is_seen(slot, col)) x = cpu::penalize(x, penalty);
    return counts != nullptr ? cpu::penalize_counted(x, counts[col], frequency, presence) : x;
  };

  // A row with logit_bias, banned ids or count penalties is edited into its scratch row first:
  // a full copy, the sparse edits (biases by one thread in their order, as the reference adds
  // them, so that a repeated id rounds alike), then the penalties; the rest reads that. A row
  // with the repetition penalty alone is penalised as it is read.
  ShardedLogits source = logits;
  const bool sparse = P.bias_count > 0 || P.banned_count > 0;
  if (sparse || (slot != nullptr && counts != nullptr && (frequency != 0.0f || presence != 0.0f))) {
    float* edited = scratch + int64_t(row) * n;
    for (int s = 0; s < logits.shards; ++s) {
      const int begin = logits.shard_begin(s), cols = logits.shard_begin(s + 1) - begin;
      const float* src = logits.row_of_shard(s, row);
      for (int j = threadIdx.x; j < cols; j += blockDim.x)
        edited[begin + j] = sparse ? src[j] : penalise(src[j], begin + j);
    }
    if (sparse) {
      __syncthreads();
      if (threadIdx.x == 0)
        for (int i = 0; i < P.bias_count; ++i) {
          const kernels::LogitBias b = edits.biases[P.bias_begin + i];
          if (b.id >= 0 && b.id < n) edited[b.id] += b.bias;
        }
      __syncthreads();
      for (int i = threadIdx.x; i < P.banned_count; i += blockDim.x) {
        const int id = edits.banned[P.banned_begin + i];
        if (id >= 0 && id < n) edited[id] = -INFINITY;
      }
      __syncthreads();
      if (slot != nullptr)
        for (int i = threadIdx.x; i < n; i += blockDim.x) edited[i] = penalise(edited[i], i);
    }
    __syncthreads();
    source = ShardedLogits{scratch, logits.rows, n, 1};
    slot = nullptr;  // Penalised already.
  }
  const auto logit_at = [slot, penalise](float x, int col) { return slot != nullptr ? penalise(x, col) : x; };

  // The argmax, NaN skipped, lowest index on ties.
  const Best argmax = block_argmax(source, row, logit_at, no_nan, best_v, best_i);
  const int best = argmax.i < n ? argmax.i : 0;
  const float max_logit = argmax.v;
  int token = best;
  if (!(P.temperature == 0.0f || P.top_k == 1 || argmax.i == n || !isfinite(max_logit))) {
    // In place over an edited row: each thread turns the logits it reads into probabilities.
    float* probs = scratch + int64_t(row) * n;
    const double inv_temperature = 1.0 / double(P.temperature);
    for (int s = 0; s < source.shards; ++s) {
      const int begin = source.shard_begin(s), cols = source.shard_begin(s + 1) - begin;
      const float* src = source.row_of_shard(s, row);
      for (int j = threadIdx.x; j < cols; j += blockDim.x) {
        const float x = logit_at(src[j], begin + j);
        probs[begin + j] = isnan(x) ? 0.0f : float(exp(double(x - max_logit) * inv_temperature));
      }
    }
    __syncthreads();  // Each thread reads every thread's probabilities from here on.

    // Count and mass of the positive probabilities, and, for a row that may cut, their histogram.
    const Histogram hist{bin_counts, bin_masses};
    Elements all{probs, nullptr, n};
    Cut cut{0.0f, -1};
    double positive = 0.0, total = 0.0;
    if (P.top_k > 0 || P.top_p < 1.0f)
      histogram(probs, n, hist, &positive, &total, shared);
    else
      total = measure(all, cut, 0.0f, true, shared);
    const bool cut_by_count = P.top_k > 0 && double(P.top_k) < positive, cut_by_mass = P.top_p < 1.0f;
    int picked;
    if (!cut_by_count && !cut_by_mass) {
      // Every positive probability, walked in index order.
      const auto candidate = [cut](float p, int i) { return cut.holds(p, i); };
      picked = walk(all, candidate, true, 0.0, P.u * total, true, shared, result);
    } else {
      // The searches run over the candidates: every column at or above the edge of the bin that
      // holds the top_k-th element (the top_p prefix of those is among them too), or, with top_p
      // alone, one bin below where the masses from the top reach top_p of the total.
      const double p_target = double(P.top_p) * total;
      const float edge =
          cut_by_count ? bin_edge(hist, false, double(P.top_k), result) : bin_edge(hist, true, p_target, result);
      int* cand = reinterpret_cast<int*>(scratch + int64_t(logits.rows) * n) + int64_t(row) * n;
      Elements e{probs, cand, compact(probs, n, edge, cand, best_i)};
      if (!cut_by_count && !reaches(measure(e, cut, 0.0f, true, shared), p_target, false)) e = all;
      if (cut_by_count) {
        cut = select(e, cut, false, double(P.top_k), false, shared, result);
        total = measure(e, cut, 0.0f, true, shared);
      }
      if (cut_by_mass) {
        cut = select(e, cut, true, double(P.top_p) * total, false, shared, result);
        total = measure(e, cut, 0.0f, true, shared);
      }
      const double target = P.u * total;
      if (reaches(total, target, true)) {
        picked = select(e, cut, true, target, true, shared, result).c;
      } else {
        // Rounding left a sliver past the last candidate: the last in sorted order.
        picked = select(e, cut, false, measure(e, cut, 0.0f, false, shared), false, shared, result).c;
      }
    }
    if (picked >= 0) token = picked;
  }
  if (P.seen_slot >= 0 && P.add_sampled) {
    __syncthreads();  // Every thread has read the slot.
    if (threadIdx.x == 0) cpu::add_sampled_to_seen(seen, P, token);
  }
  if (threadIdx.x != 0) return;
  tokens[row] = token;
  if (!want_logprobs) return;
  // Of the raw logits, which the edits left in place.
  kernels::RowLogprobs& out = logprobs[row];
  const int of = P.logprob_of >= 0 ? P.logprob_of : token;
  out.logprob = of < n ? normalizer.logprob(logit_of(logits, row, of)) : -INFINITY;
  out.top_count = top;
  for (int j = 0; j < top; ++j) {
    out.top_ids[j] = top_ids[j];
    out.top_logprobs[j] = normalizer.logprob(top_v[j]);
  }
}

}  // namespace

void sample(int* tokens, kernels::RowLogprobs* logprobs, const kernels::ShardedLogits& logits, const kernels::SampleRow* params,
            const kernels::SeenTokens& seen, const kernels::LogitEdits& edits, float* scratch, gpuStream_t stream) {
  if (logits.rows <= 0) return;
  gpu_launch(sample_kernel, logits.rows, kSampleThreads, 0, stream, tokens, logprobs, logits, params, seen, edits,
             scratch);
}

}  // namespace pdserve::kernels::gpu
