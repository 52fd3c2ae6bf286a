#include "engine/backends/phase_profiler.h"

#include <algorithm>
#include <chrono>
#include <utility>

namespace pdserve::engine {

const char* phase_name(Phase phase) {
  switch (phase) {
    case Phase::kGemm: return "gemm";
    case Phase::kLmHead: return "lm_head";
    case Phase::kAttention: return "attention";
    case Phase::kSmallKernels: return "small_kernels";
    case Phase::kSampling: return "sampling";
    case Phase::kCopies: return "copies";
  }
  return "?";
}

PhaseProfiler::PhaseProfiler(Backend* inner, int lm_head_out, const Clock& clock)
    : inner_(inner), lm_head_out_(lm_head_out), clock_(clock) {}

PhaseProfiler::PhaseProfiler(std::unique_ptr<Backend> inner, int lm_head_out, const Clock& clock)
    : owned_(std::move(inner)), inner_(owned_.get()), lm_head_out_(lm_head_out), clock_(clock) {}

std::array<PhasePerStep, kPhases> PhaseProfiler::per_step() const {
  const double steps = double(std::max<int64_t>(1, totals_[size_t(Phase::kLmHead)].calls));
  std::array<PhasePerStep, kPhases> out;
  for (size_t i = 0; i < out.size(); ++i)
    out[i] = {double(totals_[i].calls) / steps,
              std::chrono::duration<double, std::milli>(totals_[i].time).count() / steps};
  return out;
}

Status PhaseProfiler::set_enabled(bool enabled) {
  PD_RETURN_IF_ERROR(inner_->synchronize());
  enabled_ = enabled;
  return absl::OkStatus();
}

template <typename Call>
void PhaseProfiler::timed(Phase phase, Call&& call) {
  if (!enabled_) {
    call();
    return;
  }
  const TimePoint start = clock_.now();
  call();
  // A failure here surfaces again at the caller's own synchronize().
  (void)inner_->synchronize();
  PhaseTotal& total = totals_[size_t(phase)];
  ++total.calls;
  total.time += clock_.now() - start;
}

Status PhaseProfiler::copy_to_device(void* dst, const void* src, size_t bytes) {
  Status s;
  timed(Phase::kCopies, [&] { s = inner_->copy_to_device(dst, src, bytes); });
  return s;
}

Status PhaseProfiler::copy_to_host(void* dst, const void* src, size_t bytes) {
  Status s;
  timed(Phase::kCopies, [&] { s = inner_->copy_to_host(dst, src, bytes); });
  return s;
}

void PhaseProfiler::embed(float* out, const float* table, const int* tokens, int n, int dim, const int* sampled) {
  timed(Phase::kSmallKernels, [&] { inner_->embed(out, table, tokens, n, dim, sampled); });
}

void PhaseProfiler::rms_norm(float* out, const float* in, const float* w, int rows, int dim, float eps) {
  timed(Phase::kSmallKernels, [&] { inner_->rms_norm(out, in, w, rows, dim, eps); });
}

void PhaseProfiler::matmul_xwt(float* y, const float* x, const float* w, int rows, int out, int in, int64_t ldw) {
  timed(out == lm_head_out_ ? Phase::kLmHead : Phase::kGemm,
        [&] { inner_->matmul_xwt(y, x, w, rows, out, in, ldw); });
}

void PhaseProfiler::matmul_xwt_bf16(float* y, const float* x, const uint16_t* w, int rows, int out, int in, int64_t ldw,
                                    GemmPrecision precision) {
  timed(out == lm_head_out_ ? Phase::kLmHead : Phase::kGemm,
        [&] { inner_->matmul_xwt_bf16(y, x, w, rows, out, in, ldw, precision); });
}

// The inner backend's fused GEMV, or its GEMM and silu_mul: one call, timed as a whole, so charged
// to the GEMMs either way (prefill breakdowns with bf16 weights count silu_mul's time there).
void PhaseProfiler::gate_up_silu_bf16(float* act, float* gate_up, const float* x, const uint16_t* w, int rows,
                                      int hidden, int in, int64_t ldw, GemmPrecision precision) {
  timed(Phase::kGemm, [&] { inner_->gate_up_silu_bf16(act, gate_up, x, w, rows, hidden, in, ldw, precision); });
}

void PhaseProfiler::qkv_rope_write(float* q_out, const kernels::QkvRows& rows, const kernels::RopeTable& rope,
                                   const kernels::PagedLayerView& kv, const kernels::TokenPlacement& tokens) {
  timed(Phase::kSmallKernels, [&] { inner_->qkv_rope_write(q_out, rows, rope, kv, tokens); });
}

void PhaseProfiler::paged_kv_write(const kernels::PagedLayerView& kv, const kernels::TokenPlacement& tokens,
                                   const float* k, int64_t k_row_stride, const float* v, int64_t v_row_stride,
                                   int n_kv_heads) {
  timed(Phase::kAttention,
        [&] { inner_->paged_kv_write(kv, tokens, k, k_row_stride, v, v_row_stride, n_kv_heads); });
}

void PhaseProfiler::paged_attention(float* out, const float* q, const kernels::PagedLayerView& kv,
                                    const kernels::TokenPlacement& tokens, int n_q_heads, int q_per_kv, int window,
                                    float scale, GemmPrecision precision) {
  timed(Phase::kAttention,
        [&] { inner_->paged_attention(out, q, kv, tokens, n_q_heads, q_per_kv, window, scale, precision); });
}

void PhaseProfiler::index_select_blocks(uint8_t* block_mask, int mask_stride, const float* q_index,
                                        const kernels::PagedLayerView& index_view,
                                        const kernels::TokenPlacement& tokens, int top_k) {
  timed(Phase::kAttention,
        [&] { inner_->index_select_blocks(block_mask, mask_stride, q_index, index_view, tokens, top_k); });
}

void PhaseProfiler::sample(int* tokens, kernels::RowLogprobs* logprobs, const kernels::ShardedLogits& logits,
                           const kernels::SampleRow* params, const kernels::SeenTokens& seen,
                           const kernels::LogitEdits& edits, float* scratch) {
  timed(Phase::kSampling, [&] { inner_->sample(tokens, logprobs, logits, params, seen, edits, scratch); });
}

void PhaseProfiler::silu_mul(float* out, const float* gate, const float* up, int rows, int cols, int64_t in_stride) {
  timed(Phase::kSmallKernels, [&] { inner_->silu_mul(out, gate, up, rows, cols, in_stride); });
}

void PhaseProfiler::gather_rms_norm(float* out, const float* in, const int* row_ids, const float* w, int rows, int dim,
                                    float eps) {
  timed(Phase::kSmallKernels, [&] { inner_->gather_rms_norm(out, in, row_ids, w, rows, dim, eps); });
}

void PhaseProfiler::add_rms_norm(float* out, float* x, const float* residual, const float* w, int rows, int dim,
                                 float eps) {
  timed(Phase::kSmallKernels, [&] { inner_->add_rms_norm(out, x, residual, w, rows, dim, eps); });
}

void PhaseProfiler::add_inplace(float* x, const float* y, int64_t n) {
  timed(Phase::kSmallKernels, [&] { inner_->add_inplace(x, y, n); });
}

}  // namespace pdserve::engine
