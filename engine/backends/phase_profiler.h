// PhaseProfiler: an engine::Backend that forwards every call to another backend and, while
// enabled, times each kernel entry point to its completion (a synchronize() after it) and adds
// it to its phase — GEMMs, the LM head's GEMM, attention, the small kernels (norms, attention's
// input stage of biases, RoPE and KV writes, elementwise, embedding), sampling, copies (SwiGLU
// with bf16 weights is one gate_up_silu_bf16 call, charged to the GEMMs whether the backend fuses
// it or not: a call is timed as a whole). What a
// benchmark prints as a step's breakdown (bench/engine_bench --breakdown, bench/gpu_bench
// --breakdown): where a step's time goes and how many kernel calls (at least one launch each on
// a GPU) it makes. Waiting after every call removes the overlap of launches with work, so the
// phases add up to more than an unprofiled step; their shares are what guide the next
// optimisation. Disabled, it only forwards.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>

#include "common/clock.h"
#include "engine/backend.h"

namespace pdserve::engine {

enum class Phase { kGemm, kLmHead, kAttention, kSmallKernels, kSampling, kCopies };
inline constexpr int kPhases = 6;
// "gemm", "lm_head", "attention", "small_kernels", "sampling", "copies".
const char* phase_name(Phase phase);

// What one phase took while profiling was on.
struct PhaseTotal {
  int64_t calls = 0;
  Duration time{0};
};

// A phase's share of one forward step: its totals over the steps profiled.
struct PhasePerStep {
  double calls = 0;
  double ms = 0;
};

class PhaseProfiler final : public Backend {
 public:
  // Over `inner` (not owned), which must outlive it. A GEMM whose output has `lm_head_out`
  // columns counts as the LM head's (the rank's vocabulary slice).
  PhaseProfiler(Backend* inner, int lm_head_out, const Clock& clock = RealClock::instance());
  // Owning `inner`.
  PhaseProfiler(std::unique_ptr<Backend> inner, int lm_head_out, const Clock& clock = RealClock::instance());

  // Starts or stops timing (waits for the queued work first, so none is charged to a phase).
  Status set_enabled(bool enabled);
  // The totals since the last reset().
  const std::array<PhaseTotal, kPhases>& totals() const { return totals_; }
  // The totals per forward step, counting steps by the LM head's calls (one a step; at least 1).
  std::array<PhasePerStep, kPhases> per_step() const;
  void reset() { totals_ = {}; }

  std::string name() const override { return inner_->name(); }
  StatusOr<void*> allocate(size_t bytes) override { return inner_->allocate(bytes); }
  void deallocate(void* ptr) override { inner_->deallocate(ptr); }
  Status copy_to_device(void* dst, const void* src, size_t bytes) override;
  Status copy_to_host(void* dst, const void* src, size_t bytes) override;
  Status synchronize() override { return inner_->synchronize(); }
  Status copy_to_host_queued(void* dst, const void* src, size_t bytes) override {
    return inner_->copy_to_host_queued(dst, src, bytes);
  }
  StatusOr<std::unique_ptr<QueueMark>> create_mark() override { return inner_->create_mark(); }
  Status queued_errors() override { return inner_->queued_errors(); }
  uint64_t memory_bytes() const override { return inner_->memory_bytes(); }
  Status staging_copy(void* dst, const void* src, size_t bytes) override { return inner_->staging_copy(dst, src, bytes); }
  Status staging_wait() override { return inner_->staging_wait(); }
  Status pin_host_memory(void* ptr, size_t bytes) override { return inner_->pin_host_memory(ptr, bytes); }
  void unpin_host_memory(void* ptr) override { inner_->unpin_host_memory(ptr); }
  MemoryKind memory_kind() const override { return inner_->memory_kind(); }
  bool bf16_weights() const override { return inner_->bf16_weights(); }
  bool bf16_kv() const override { return inner_->bf16_kv(); }

  void embed(float* out, const float* table, const int* tokens, int n, int dim, const int* sampled) override;
  void rms_norm(float* out, const float* in, const float* w, int rows, int dim, float eps) override;
  void gather_rms_norm(float* out, const float* in, const int* row_ids, const float* w, int rows, int dim,
                       float eps) override;
  void add_rms_norm(float* out, float* x, const float* residual, const float* w, int rows, int dim, float eps) override;
  void matmul_xwt(float* y, const float* x, const float* w, int rows, int out, int in, int64_t ldw) override;
  void matmul_xwt_bf16(float* y, const float* x, const uint16_t* w, int rows, int out, int in, int64_t ldw,
                       GemmPrecision precision) override;
  void gate_up_silu_bf16(float* act, float* gate_up, const float* x, const uint16_t* w, int rows, int hidden, int in,
                         int64_t ldw, GemmPrecision precision) override;
  Status reserve_gemm_scratch(GemmPrecision precision, int max_rows, int max_in) override {
    return inner_->reserve_gemm_scratch(precision, max_rows, max_in);
  }
  // Timing waits after every call, which a recording cannot: a profiled backend runs eagerly.
  Status begin_capture() override {
    return absl::UnimplementedError("a profiled backend runs eagerly: its calls are timed one by one");
  }
  void paged_kv_write(const kernels::PagedLayerView& kv, const kernels::TokenPlacement& tokens, const float* k,
                      int64_t k_row_stride, const float* v, int64_t v_row_stride, int n_kv_heads) override;
  void qkv_rope_write(float* q_out, const kernels::QkvRows& rows, const kernels::RopeTable& rope,
                      const kernels::PagedLayerView& kv, const kernels::TokenPlacement& tokens) override;
  void paged_attention(float* out, const float* q, const kernels::PagedLayerView& kv,
                       const kernels::TokenPlacement& tokens, int n_q_heads, int q_per_kv, int window, float scale,
                       GemmPrecision precision) override;
  void index_select_blocks(uint8_t* block_mask, int mask_stride, const float* q_index,
                           const kernels::PagedLayerView& index_view, const kernels::TokenPlacement& tokens,
                           int top_k) override;
  void sample(int* tokens, kernels::RowLogprobs* logprobs, const kernels::ShardedLogits& logits,
              const kernels::SampleRow* params, const kernels::SeenTokens& seen, const kernels::LogitEdits& edits,
              float* scratch) override;
  void silu_mul(float* out, const float* gate, const float* up, int rows, int cols, int64_t in_stride) override;
  void add_inplace(float* x, const float* y, int64_t n) override;

 private:
  // Runs `call` and, when enabled, charges it (to its completion) to `phase`.
  template <typename Call>
  void timed(Phase phase, Call&& call);

  std::unique_ptr<Backend> owned_;
  Backend* inner_;
  int lm_head_out_;
  const Clock& clock_;
  bool enabled_ = false;
  std::array<PhaseTotal, kPhases> totals_{};
};

}  // namespace pdserve::engine
