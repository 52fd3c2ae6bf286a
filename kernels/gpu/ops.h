// The GPU kernels (CUDA and HIP from the same sources), as host functions that queue one launch
// on `stream`. Each mirrors the CPU reference kernel of the same name (kernels/cpu/ops.h,
// kernels/cpu/paged_attention.h) argument for argument, so a backend forwards to either and
// tests compare the two on the same inputs. Every pointer argument is device memory, including
// TokenPlacement's positions, block tables (an array of device pointers) and block mask.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/cpu/paged_attention.h"
#include "kernels/cpu/sampling.h"
#include "kernels/gpu/gpu_compat.h"

namespace pdserve::kernels::gpu {

// kernels::Storage (kernels/abi.h) names the element type of a paged KV cache (the view's
// `storage`) and of the tensors where a kernel offers a choice.
using kernels::Storage;

// out[t] = table[tokens[t]] (rows of `dim`), table stored as `table_type`. A negative tokens[t]
// stands for sampled[-1 - tokens[t]] (device memory; null when no token is negative), as
// engine::Backend::embed.
void embed(float* out, const void* table, Storage table_type, const int* tokens, int n, int dim, const int* sampled,
           gpuStream_t stream);

void rms_norm(float* out, const float* in, const float* weight, int rows, int dim, float eps,
              gpuStream_t stream);
// As cpu::gather_rms_norm; row_ids is device memory.
void gather_rms_norm(float* out, const float* in, const int* row_ids, const float* weight, int rows, int dim, float eps,
                     gpuStream_t stream);
// x += residual, then out = rms_norm(x): the residual add and the next norm in one pass.
void add_rms_norm(float* out, float* x, const float* residual, const float* weight, int rows,
                  int dim, float eps, gpuStream_t stream);

// Attention's input stage (biases, head norms, RoPE; roped Q out, K and V into the paged cache)
// as cpu::qkv_rope_write, in any KV storage; rope.inv_freq is device memory. Head dims even and
// at most 256.
void qkv_rope_write(float* q_out, const kernels::QkvRows& rows, const kernels::RopeTable& rope,
                    const kernels::PagedLayerView& kv, const kernels::TokenPlacement& tokens, gpuStream_t stream);

void silu_mul(float* out, const float* gate, const float* up, int rows, int cols, int64_t in_stride,
              gpuStream_t stream);
void add_inplace(float* x, const float* y, int64_t n, gpuStream_t stream);

// y[rows][out] = x[rows][in] · wᵀ, w's rows `ldw` elements apart and stored as `w_type`;
// accumulated in f32; with `bf16_x` (bf16 weights only) each x element rounded to bf16 first
// (engine::GemmPrecision::kBf16). The portable kernels (kernels/gpu/gemm.cu): a GEMV up to
// kGemvMaxRows rows, a tiled kernel above. Backends take the vendor BLAS instead above
// kGemvMaxRows where its operands' types allow (f32 × f32, or bf16 × bf16), else these.
constexpr int kGemvMaxRows = 8;
void matmul_xwt(float* y, const float* x, const void* w, Storage w_type, int rows, int out, int in, int64_t ldw,
                gpuStream_t stream, bool bf16_x = false);
// act[r][h] = silu(g) · u for `rows` ≤ kGemvMaxRows rows of x, where [g | u] = x · wᵀ, w bf16
// and its first `hidden` rows the gate's, the next `hidden` the up projection's: matmul_xwt
// into [rows][2·hidden] then silu_mul, bit for bit, in one GEMV launch that writes only act.
void gate_up_silu_gemv(float* act, const float* x, const void* w, int rows, int hidden, int in, int64_t ldw,
                       gpuStream_t stream, bool bf16_x = false);
// out[i] = in[i] rounded to bf16 (nearest even), for a vendor GEMM's bf16 input.
void round_to_bf16(void* out, const float* in, int64_t n, gpuStream_t stream);

// As cpu::sample_rows: tokens[r] (and logprobs[r] for rows asking) from row r of `logits` with
// params[r] (log-probabilities of the raw row; the edits and penalties; then greedy, or
// temperature, top_k, top_p and the row's draw). `scratch` holds kernels::sample_scratch_floats(logits.rows,
// logits.vocab) floats.
void sample(int* tokens, kernels::RowLogprobs* logprobs, const kernels::ShardedLogits& logits, const kernels::SampleRow* params,
            const kernels::SeenTokens& seen, const kernels::LogitEdits& edits, float* scratch, gpuStream_t stream);

// `kv` as the CPU kernel's, in any storage (f32, f16 or bf16: rounded to nearest even).
void paged_kv_write(const kernels::PagedLayerView& kv, const kernels::TokenPlacement& tokens, const float* k,
                    int64_t k_row_stride, const float* v, int64_t v_row_stride, int n_kv_heads, gpuStream_t stream);

// Decode-shaped attention: one query token per (token, head) work item, online softmax over the
// token's visible positions. Right for any batch; prefill_attention is faster for long chunks.
void paged_attention(float* out, const float* q, const kernels::PagedLayerView& kv,
                     const kernels::TokenPlacement& tokens, int n_q_heads, int q_per_kv, int window, float scale,
                     gpuStream_t stream);

// Decode attention split over the key range (flash-decoding) and grouped by KV head: each K/V
// row is read once per group of up to 8 query heads, and each token's visible keys are spread
// over up to `splits` blocks (1..kMaxDecodeSplits), merged by a second kernel. Same result as
// paged_attention. A token cuts its own range into pieces of max(min_keys_per_split,
// ceil(visible / splits)) keys, its own and not its batch's: so its result is the same, bit for
// bit, whatever its batch-mates and however many splits the launch has beyond those it fills —
// which a step recorded once (Backend::begin_capture) and replayed over other batches relies on.
// decode_splits(max_position, window) with kMinKeysPerSplit is the production choice for a step
// whose positions are at most max_position. `scratch`: split_decode_scratch_floats(...) floats
// of device memory (none for 1 split).
inline constexpr int kMaxDecodeSplits = 32;
inline constexpr int kMinKeysPerSplit = 128;
int decode_splits(int max_position, int window);
size_t split_decode_scratch_floats(int num_tokens, int n_q_heads, int v_head_dim, int splits);
void split_decode_attention(float* out, const float* q, const kernels::PagedLayerView& kv,
                            const kernels::TokenPlacement& tokens, int n_q_heads, int q_per_kv, int window, float scale,
                            int splits, int min_keys_per_split, float* scratch, gpuStream_t stream);

// Chunked causal prefill: same result as paged_attention, but a tile of consecutive query
// tokens of one sequence (same block table, consecutive positions) shares each K/V tile it
// loads. Tokens that do not form such runs fall back to per-token work inside the kernel.
void prefill_attention(float* out, const float* q, const kernels::PagedLayerView& kv,
                       const kernels::TokenPlacement& tokens, int n_q_heads, int q_per_kv, int window, float scale,
                       gpuStream_t stream);

// prefill_attention on tensor cores (CUDA sm_80+, and the emulation), for
// engine::GemmPrecision::kBf16: Q, K, V and the softmax's probabilities rounded to bf16 (nearest
// even) as the products' operands, accumulated in f32; the softmax itself in f32. Any KV
// storage (rounded to bf16 as it is loaded); tiles of 64 query rows and 32 keys, in 50-148 KB
// of shared memory (head dims 64-256). Not equal to prefill_attention: within bf16's rounding
// of it. It is prefill_attention on HIP, where no MFMA variant exists yet, and on a device
// whose shared memory cannot hold the tiles (head dim 256 on GPUs with ~100 KB a block).
void prefill_attention_bf16(float* out, const float* q, const kernels::PagedLayerView& kv,
                            const kernels::TokenPlacement& tokens, int n_q_heads, int q_per_kv, int window, float scale,
                            gpuStream_t stream);

// As the CPU kernel: per token, the top_k blocks by best index-key match plus its own block.
void index_select_blocks(uint8_t* block_mask, int mask_stride, const float* q_index,
                         const kernels::PagedLayerView& index_view, const kernels::TokenPlacement& tokens, int top_k,
                         gpuStream_t stream);

// Layout conversion for KV transfer: copies heads [head_begin, head_begin+n_heads) of K (and V)
// of `n_blocks` blocks (ids in `block_ids`) between a paged view and a packed buffer laid out
// [block][slot][head][k dims] followed, per block, by the same for V, in the view's storage.
// Packing from one layout and unpacking into another converts between any two layouts
// PagedLayerView can describe; both views must have the same storage (elements are copied, not
// converted).
void pack_blocks(void* packed, const kernels::PagedLayerView& kv, const int* block_ids, int n_blocks, int head_begin,
                 int n_heads, gpuStream_t stream);
void unpack_blocks(const kernels::PagedLayerView& kv, const void* packed, const int* block_ids, int n_blocks,
                   int head_begin, int n_heads, gpuStream_t stream);

// Bytes one block takes in the packed layout of pack_blocks.
int64_t packed_block_bytes(const kernels::PagedLayerView& kv, int n_heads);

// Deterministic N(0, stddev)-like fill (a counter-based hash, Box-Muller) for synthetic weights
// made on the device; `value` fill when stddev is 0.
void fill_random(float* x, int64_t n, uint64_t seed, float stddev, float value, gpuStream_t stream);

}  // namespace pdserve::kernels::gpu
