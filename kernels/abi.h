// The kernels' ABI: the plain structs every backend's kernels take — the CPU reference
// (kernels/cpu) and the GPU kernels (kernels/gpu) alike, and engine::Backend's entry points that
// forward to them — so that one description of a paged KV layer, of a step's tokens and of a
// row's sampling reaches every kernel unchanged. Plain data only (host and device code include
// it); what the kernels compute with them is documented beside the kernels.
#pragma once

#include <cstdint>

#if defined(__CUDACC__) || defined(__HIPCC__)
#define PDSERVE_HOST_DEVICE __host__ __device__
#else
#define PDSERVE_HOST_DEVICE
#endif

namespace pdserve::kernels {

// Element type of a paged KV cache (and of the GPU kernels' tensors where they offer a choice).
// Arithmetic is f32 whatever the storage; the CPU reference kernels take f32 only.
enum class Storage : uint8_t { kF32 = 0, kF16 = 1, kBF16 = 2 };

// Bytes of one element of `s`.
PDSERVE_HOST_DEVICE constexpr int storage_bytes(Storage s) { return s == Storage::kF32 ? 4 : 2; }

// One layer's cache on one rank, its elements `storage`. Element [block][slot][head][d] of K is
// at k + block*k_block_stride + slot*k_token_stride + head*k_head_stride + d elements (likewise
// V).
struct PagedLayerView {
  void* k = nullptr;
  void* v = nullptr;  // nullptr for key-only layers.
  Storage storage = Storage::kF32;
  int64_t k_block_stride = 0, k_token_stride = 0, k_head_stride = 0;
  int64_t v_block_stride = 0, v_token_stride = 0, v_head_stride = 0;
  int block_size = 0;
  int head_dim = 0;
  int v_head_dim = 0;
};

// The tokens of one forward pass: token t sits at positions[t] of the sequence whose block
// table is block_tables[t] (so tokens of many sequences can be mixed in one call).
struct TokenPlacement {
  int num_tokens = 0;
  // A negative position marks padding: the rows a step recorded for a larger batch than it runs
  // (Backend::begin_capture). The GPU kernels of the decode path (attention's input stage, KV
  // writes, decode attention, block selection) write no KV for it and give it zero attention
  // output; the CPU kernels and the prefill kernels take none.
  const int* positions = nullptr;
  const int* const* block_tables = nullptr;
  // Optional: token t attends only positions whose logical block b (position / block size)
  // has block_mask[t * mask_stride + b] != 0 (set by index_select_blocks).
  const uint8_t* block_mask = nullptr;
  int mask_stride = 0;
  // A hint: every token is the only one of its sequence here (decode tokens), so a backend's
  // one-query-per-sequence attention kernel fits however many there are.
  bool single_tokens = false;
  // A hint known on the host: no token's position exceeds it (-1: unknown). A GPU backend sizes
  // its split-KV decode launch by it without reading positions back.
  int max_position = -1;
};

// A step's Q, K and V projection rows as attention's input stage takes them (qkv_rope_write):
// token t's n_q_heads Q heads start at q + t*q_stride, its n_kv_heads K heads at k + t*k_stride
// and its V heads at v + t*v_stride. Three buffers of their own, or the column ranges of one
// fused QKV GEMM's rows (then every stride is the fused row's width). Biases (Qwen2) span a
// tensor's heads, head norms (Qwen3) one head, with epsilon norm_eps; null where the model has
// none.
struct QkvRows {
  const float* q = nullptr;
  const float* k = nullptr;
  const float* v = nullptr;
  int64_t q_stride = 0, k_stride = 0, v_stride = 0;
  int n_q_heads = 0, n_kv_heads = 0;
  const float* q_bias = nullptr;
  const float* k_bias = nullptr;
  const float* v_bias = nullptr;
  const float* q_norm = nullptr;
  const float* k_norm = nullptr;
  float norm_eps = 0.0f;
};

// A layer's rotary embedding: head_dim/2 inverse frequencies (engine/rope_scaling.h's table,
// scaling included) in the kernel's memory, the factor on cos and sin (yarn's attention
// scale; 1 otherwise), and the pairing: (i, i + head_dim/2) when rotate_half (Hugging Face),
// else adjacent (2i, 2i+1) (llama2.c/Meta).
struct RopeTable {
  const float* inv_freq = nullptr;
  float attention_scale = 1.0f;
  bool rotate_half = false;
};

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
  // Whether the token this row samples then joins its slot as an output token (bitmap and
  // count), where it is sampled: the next step's penalties see it without the host uploading it,
  // so that step may be queued before the host has read this one's (asynchronous scheduling).
  bool add_sampled = false;
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

// Floats of backend memory a backend's sampling takes as scratch for `rows` rows of `vocab`
// columns: per row, its probabilities and a list of candidate columns.
inline constexpr int64_t sample_scratch_floats(int rows, int vocab) { return 2 * int64_t(rows) * vocab; }

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

}  // namespace pdserve::kernels
