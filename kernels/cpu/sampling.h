// Token sampling, the reference every backend's sampling kernel follows: greedy argmax, or a
// softmax at a temperature restricted to the top_k most likely tokens, then to the smallest
// most-likely prefix holding top_p of their mass, and a draw from what is left at a uniform
// number the caller supplies. The random generator stays with the caller (engine::Sampler owns
// one per request), so a backend that samples on the device, given the same number, picks the
// same token and a seeded request draws the same tokens wherever it is sampled.
#pragma once

#include <cstdint>
#include <vector>

#if defined(__CUDACC__) || defined(__HIPCC__)
#define PDSERVE_HOST_DEVICE __host__ __device__
#else
#define PDSERVE_HOST_DEVICE
#endif

namespace pdserve::kernels::cpu {

// How to pick one row's token.
struct SampleRow {
  float temperature = 0.0f;  // 0: greedy.
  int top_k = 0;             // 0: off.
  float top_p = 1.0f;        // In (0, 1]; 1: off.
  double u = 0.0;            // The draw, uniform in [0, 1); unused when greedy.
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

// tokens[r] = sample_token(row r of `logits`, params[r]) for every row.
void sample_rows(int* tokens, const ShardedLogits& logits, const SampleRow* params, SampleScratch* scratch);

}  // namespace pdserve::kernels::cpu
