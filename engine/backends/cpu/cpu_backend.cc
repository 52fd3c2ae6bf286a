#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "engine/backend.h"
#include "engine/backends/cpu/thread_team.h"
#include "engine/spin_barrier.h"
#include "kernels/cpu/ops.h"

namespace pdserve::engine {
namespace {

namespace k = kernels::cpu;

// Work below these sizes runs on the rank's thread alone: a hand-off to the helpers costs
// ~0.3-1.5 us on the 2-core dev machine, and two of its cores compute only ~1.4x
// what one does (they are not idle twins), so a GEMM pays from ~20 us of work up (stories260K
// at batch 32), attention (exp, scattered reads: more time per multiply-add) from less.
constexpr int64_t kMinParallelMacs = int64_t(1) << 18;
constexpr int64_t kMinParallelAttentionMacs = int64_t(1) << 16;
// Output columns and rows a thread takes at a time: whole GEMM tiles (kernels/cpu/ops.cc), and
// 16 columns a whole 64-byte line of an output row, so that no two threads write one.
constexpr int kColumnGrain = 16;
constexpr int kRowGrain = 4;
// A weight matrix this small stays in each core's L2, so the threads split a batch's rows (each
// reading all of it, from cache) rather than its columns: a column split of a small product
// gives each thread slivers of tiles and a shared cache line of every output row. A larger one
// streams from memory, which a column split divides between the threads.
constexpr int64_t kCachedWeightBytes = 512 << 10;

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(CpuThreading threading)
      : team_(threading.threads, spin_budget(std::max(threading.threads, threading.threads_in_process))) {}
  std::string name() const override { return "cpu"; }
  StatusOr<void*> allocate(size_t bytes) override {
    void* p = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
    if (p == nullptr) return absl::ResourceExhaustedError(absl::StrCat("cannot allocate ", bytes, " bytes"));
    std::memset(p, 0, bytes);
    return p;
  }
  void deallocate(void* ptr) override { std::free(ptr); }
  Status copy_to_device(void* dst, const void* src, size_t bytes) override {
    std::memcpy(dst, src, bytes);
    return absl::OkStatus();
  }
  Status copy_to_host(void* dst, const void* src, size_t bytes) override {
    std::memcpy(dst, src, bytes);
    return absl::OkStatus();
  }
  Status synchronize() override { return absl::OkStatus(); }
  MemoryKind memory_kind() const override { return MemoryKind::kHost; }
  Status staging_copy(void* dst, const void* src, size_t bytes) override {
    std::memcpy(dst, src, bytes);
    return absl::OkStatus();
  }
  Status staging_wait() override { return absl::OkStatus(); }
  Status pin_host_memory(void*, size_t) override { return absl::OkStatus(); }
  void unpin_host_memory(void*) override {}
  uint64_t memory_bytes() const override {
    return uint64_t(sysconf(_SC_PHYS_PAGES)) * uint64_t(sysconf(_SC_PAGE_SIZE));
  }

  void embed(float* out, const float* table, const int* tokens, int n, int dim, const int* sampled) override {
    for (int t = 0; t < n; ++t) {
      const int token = tokens[t] < 0 ? sampled[-1 - tokens[t]] : tokens[t];
      std::memcpy(out + int64_t(t) * dim, table + int64_t(token) * dim, sizeof(float) * dim);
    }
  }
  void rms_norm(float* out, const float* in, const float* w, int rows, int dim, float eps) override {
    k::rms_norm(out, in, w, rows, dim, eps);
  }
  void gather_rms_norm(float* out, const float* in, const int* row_ids, const float* w, int rows, int dim,
                       float eps) override {
    k::gather_rms_norm(out, in, row_ids, w, rows, dim, eps);
  }
  void add_rms_norm(float* out, float* x, const float* residual, const float* w, int rows, int dim,
                    float eps) override {
    k::add_rms_norm(out, x, residual, w, rows, dim, eps);
  }
  void matmul_xwt(float* y, const float* x, const float* w, int rows, int out, int in,
                  int64_t ldw) override {
    if (team_.size() == 1 || int64_t(rows) * out * in < kMinParallelMacs)
      return k::matmul_xwt(y, x, w, rows, out, in, ldw);
    const int parts = team_.size();
    if (rows >= 2 * kRowGrain * parts && int64_t(out) * in * int64_t(sizeof(float)) <= kCachedWeightBytes)
      return team_.run(parts, [&](int part) {
        const PartRange mine = part_range(rows, parts, part, kRowGrain);
        if (mine.begin < mine.end)
          k::matmul_xwt(y + int64_t(mine.begin) * out, x + int64_t(mine.begin) * in, w, mine.end - mine.begin, out, in,
                        ldw);
      });
    team_.run(parts, [&](int part) {
      const PartRange cols = part_range(out, parts, part, kColumnGrain);
      if (cols.begin < cols.end) k::matmul_xwt_columns(y, x, w, rows, out, in, ldw, cols.begin, cols.end);
    });
  }
  bool bf16_weights() const override { return false; }
  void matmul_xwt_bf16(float*, const float*, const uint16_t*, int, int, int, int64_t, GemmPrecision) override {
    std::fprintf(stderr, "pdserve: the CPU backend computes with f32 weights (bf16_weights() is false)\n");
    std::abort();
  }
  Status reserve_gemm_scratch(GemmPrecision, int, int) override { return absl::OkStatus(); }
  bool bf16_kv() const override { return false; }
  void paged_kv_write(const kernels::PagedLayerView& kv, const kernels::TokenPlacement& tokens, const float* kp,
                      int64_t k_row_stride, const float* vp, int64_t v_row_stride,
                      int n_kv_heads) override {
    k::paged_kv_write(kv, tokens, kp, k_row_stride, vp, v_row_stride, n_kv_heads);
  }
  void qkv_rope_write(float* q_out, const kernels::QkvRows& rows, const kernels::RopeTable& rope,
                      const kernels::PagedLayerView& kv, const kernels::TokenPlacement& tokens) override {
    k::qkv_rope_write(q_out, rows, rope, kv, tokens);
  }
  void paged_attention(float* out, const float* q, const kernels::PagedLayerView& kv,
                       const kernels::TokenPlacement& tokens, int n_q_heads, int q_per_kv, int window, float scale,
                       GemmPrecision precision) override {
    if (precision != GemmPrecision::kExact) {
      std::fprintf(stderr, "pdserve: the CPU backend computes exactly (kBf16 takes bf16 weights, which it refuses)\n");
      std::abort();
    }
    if (team_.size() == 1 || tokens.num_tokens < 2)
      return k::paged_attention(out, q, kv, tokens, n_q_heads, q_per_kv, window, scale);
    // Each token's keys are its work: the parts take runs of tokens with about equal shares.
    int64_t keys = 0;
    for (int t = 0; t < tokens.num_tokens; ++t) keys += visible_keys(tokens.positions[t], window);
    if (keys * n_q_heads * (kv.head_dim + kv.v_head_dim) < kMinParallelAttentionMacs)
      return k::paged_attention(out, q, kv, tokens, n_q_heads, q_per_kv, window, scale);
    // Token t goes to the part its keys' midpoint falls in: part p takes tokens
    // [token_bounds_[p], token_bounds_[p + 1]).
    const int parts = team_.size();
    token_bounds_.assign(size_t(parts) + 1, tokens.num_tokens);
    token_bounds_[0] = 0;
    int64_t before = 0;
    for (int t = 0, p = 0; t < tokens.num_tokens; ++t) {
      const int64_t own = visible_keys(tokens.positions[t], window);
      const int part = int(std::min<int64_t>(parts - 1, (2 * before + own) * parts / (2 * keys)));
      while (p < part) token_bounds_[size_t(++p)] = t;
      before += own;
    }
    team_.run(parts, [&](int part) {
      const int begin = token_bounds_[size_t(part)], end = token_bounds_[size_t(part) + 1];
      if (begin == end) return;
      kernels::TokenPlacement mine = tokens;
      mine.num_tokens = end - begin;
      mine.positions += begin;
      mine.block_tables += begin;
      if (mine.block_mask) mine.block_mask += int64_t(begin) * tokens.mask_stride;
      k::paged_attention(out + int64_t(begin) * n_q_heads * kv.v_head_dim, q + int64_t(begin) * n_q_heads * kv.head_dim,
                         kv, mine, n_q_heads, q_per_kv, window, scale);
    });
  }
  void index_select_blocks(uint8_t* block_mask, int mask_stride, const float* q_index,
                           const kernels::PagedLayerView& index_view, const kernels::TokenPlacement& tokens,
                           int top_k) override {
    k::index_select_blocks(block_mask, mask_stride, q_index, index_view, tokens, top_k);
  }
  void sample(int* tokens, kernels::RowLogprobs* logprobs, const kernels::ShardedLogits& logits, const kernels::SampleRow* params,
              const kernels::SeenTokens& seen, const kernels::LogitEdits& edits, float*) override {
    k::sample_rows(tokens, logprobs, logits, params, seen, edits, &sample_scratch_);
  }
  void silu_mul(float* out, const float* gate, const float* up, int rows, int cols, int64_t in_stride) override {
    k::silu_mul(out, gate, up, rows, cols, in_stride);
  }
  void add_inplace(float* x, const float* y, int64_t n) override { k::add_inplace(x, y, n); }

 private:
  // The keys a token at `position` attends to (kernels::cpu::paged_attention's count).
  static int64_t visible_keys(int position, int window) {
    return window > 0 ? std::min(position + 1, window) : position + 1;
  }

  ThreadTeam team_;
  std::vector<int> token_bounds_;  // paged_attention's parts; kept to allocate nothing a call.
  k::SampleScratch sample_scratch_;
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(CpuThreading threading) {
  if (threading.threads < 1 || threading.threads > kMaxCpuThreads) {
    std::fprintf(stderr, "pdserve: a CPU backend of %d threads (1 to %d)\n", threading.threads, kMaxCpuThreads);
    std::abort();
  }
  return std::make_unique<CpuBackend>(threading);
}

}  // namespace pdserve::engine
