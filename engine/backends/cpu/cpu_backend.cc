#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "engine/backend.h"
#include "kernels/cpu/ops.h"

namespace pdserve::engine {
namespace {

namespace k = kernels::cpu;

class CpuBackend final : public Backend {
 public:
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
    k::matmul_xwt(y, x, w, rows, out, in, ldw);
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
    k::paged_attention(out, q, kv, tokens, n_q_heads, q_per_kv, window, scale);
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
  k::SampleScratch sample_scratch_;
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend() { return std::make_unique<CpuBackend>(); }

}  // namespace pdserve::engine
