#include "tests/engine/guarded_backend.h"

#include <sys/mman.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <set>
#include <vector>

#include "engine/model/float_convert.h"

namespace pdserve::testing {
namespace {

namespace k = kernels::cpu;
using engine::Backend;

std::atomic<uint64_t> bf16_gemms{0};

[[noreturn]] void misuse(const char* what) {
  std::fprintf(stderr, "guarded backend: %s\n", what);
  std::abort();
}

class GuardedBackend final : public Backend {
 public:
  GuardedBackend(size_t capacity, std::string name, bool pinnable, std::function<Status()> queued_errors)
      : capacity_(capacity),
        name_(std::move(name)),
        pinnable_(pinnable),
        queued_errors_(std::move(queued_errors)),
        inner_(engine::make_cpu_backend()) {
    void* p = mmap(nullptr, capacity, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    base_ = p == MAP_FAILED ? nullptr : static_cast<uint8_t*>(p);
  }
  ~GuardedBackend() override {
    if (!pinned_.empty()) misuse("host memory still pinned when the backend goes");
    if (base_ != nullptr) munmap(base_, capacity_);
  }

  std::string name() const override { return name_; }
  StatusOr<void*> allocate(size_t bytes) override {
    std::lock_guard lock(mu_);
    const size_t at = (used_ + 255) / 256 * 256;
    if (base_ == nullptr || at + bytes > capacity_)
      return absl::ResourceExhaustedError(absl::StrCat("guarded backend: ", bytes, " bytes do not fit"));
    used_ = at + bytes;
    return base_ + at;  // Fresh anonymous pages: zero.
  }
  void deallocate(void*) override {}
  Status copy_to_device(void* dst, const void* src, size_t bytes) override {
    Open open(this);
    std::memmove(dst, src, bytes);
    return absl::OkStatus();
  }
  Status copy_to_host(void* dst, const void* src, size_t bytes) override { return copy_to_device(dst, src, bytes); }
  Status synchronize() override { return absl::OkStatus(); }
  Status queued_errors() override { return queued_errors_ ? queued_errors_() : absl::OkStatus(); }
  uint64_t memory_bytes() const override { return capacity_; }
  engine::MemoryKind memory_kind() const override { return engine::MemoryKind::kOpaque; }
  Status staging_copy(void* dst, const void* src, size_t bytes) override { return copy_to_device(dst, src, bytes); }
  Status staging_wait() override { return absl::OkStatus(); }
  // As the CUDA runtime keeps them: pinning twice or unpinning what is not pinned is an error, which
  // here aborts (no caller looks at it), as does memory still pinned when the backend goes.
  Status pin_host_memory(void* ptr, size_t) override {
    if (!pinnable_) return absl::InternalError("host register: operation not supported");
    std::lock_guard lock(mu_);
    if (!pinned_.insert(ptr).second) misuse("host memory pinned twice");
    return absl::OkStatus();
  }
  void unpin_host_memory(void* ptr) override {
    std::lock_guard lock(mu_);
    if (pinned_.erase(ptr) == 0) misuse("unpinning host memory that is not pinned");
  }

  void embed(float* out, const float* table, const int* tokens, int n, int dim, const int* sampled) override {
    Open open(this);
    inner_->embed(out, table, tokens, n, dim, sampled);
  }
  void rms_norm(float* out, const float* in, const float* w, int rows, int dim, float eps) override {
    Open open(this);
    inner_->rms_norm(out, in, w, rows, dim, eps);
  }
  void gather_rms_norm(float* out, const float* in, const int* row_ids, const float* w, int rows, int dim,
                       float eps) override {
    Open open(this);
    inner_->gather_rms_norm(out, in, row_ids, w, rows, dim, eps);
  }
  void add_rms_norm(float* out, float* x, const float* residual, const float* w, int rows, int dim,
                    float eps) override {
    Open open(this);
    inner_->add_rms_norm(out, x, residual, w, rows, dim, eps);
  }
  void matmul_xwt(float* y, const float* x, const float* w, int rows, int out, int in, int64_t ldw) override {
    Open open(this);
    inner_->matmul_xwt(y, x, w, rows, out, in, ldw);
  }
  bool bf16_weights() const override { return true; }
  // Widening bf16 is exact, so this is the CPU's GEMM on the same values a GPU would read; with
  // kBf16 on x rounded to bf16 as a GPU rounds it.
  void matmul_xwt_bf16(float* y, const float* x, const uint16_t* w, int rows, int out, int in, int64_t ldw,
                       engine::GemmPrecision precision) override {
    Open open(this);
    ++bf16_gemms;
    widened_.resize(size_t(out) * in);
    for (int o = 0; o < out; ++o)
      for (int i = 0; i < in; ++i) widened_[size_t(o) * in + i] = engine::bf16_to_f32(w[int64_t(o) * ldw + i]);
    if (precision == engine::GemmPrecision::kBf16) {
      rounded_x_.resize(size_t(rows) * in);
      for (size_t i = 0; i < rounded_x_.size(); ++i) rounded_x_[i] = engine::bf16_to_f32(engine::f32_to_bf16(x[i]));
      x = rounded_x_.data();
    }
    inner_->matmul_xwt(y, x, widened_.data(), rows, out, in, in);
  }
  Status reserve_gemm_scratch(engine::GemmPrecision, int, int) override { return absl::OkStatus(); }
  bool bf16_kv() const override { return inner_->bf16_kv(); }
  void paged_kv_write(const kernels::PagedLayerView& kv, const kernels::TokenPlacement& tokens, const float* kp,
                      int64_t k_row_stride, const float* vp, int64_t v_row_stride, int n_kv_heads) override {
    Open open(this);
    inner_->paged_kv_write(kv, tokens, kp, k_row_stride, vp, v_row_stride, n_kv_heads);
  }
  void qkv_rope_write(float* q_out, const kernels::QkvRows& rows, const kernels::RopeTable& rope,
                      const kernels::PagedLayerView& kv, const kernels::TokenPlacement& tokens) override {
    Open open(this);
    inner_->qkv_rope_write(q_out, rows, rope, kv, tokens);
  }
  // Exact whatever the precision: this device's bf16 is its GEMMs' (the tensor-core attention is
  // the GPU kernel's, tested against the CPU in tests/gpu).
  void paged_attention(float* out, const float* q, const kernels::PagedLayerView& kv,
                       const kernels::TokenPlacement& tokens, int n_q_heads, int q_per_kv, int window, float scale,
                       engine::GemmPrecision) override {
    Open open(this);
    inner_->paged_attention(out, q, kv, tokens, n_q_heads, q_per_kv, window, scale, engine::GemmPrecision::kExact);
  }
  void index_select_blocks(uint8_t* block_mask, int mask_stride, const float* q_index,
                           const kernels::PagedLayerView& index_view, const kernels::TokenPlacement& tokens,
                           int top_k) override {
    Open open(this);
    inner_->index_select_blocks(block_mask, mask_stride, q_index, index_view, tokens, top_k);
  }
  void sample(int* tokens, kernels::RowLogprobs* logprobs, const kernels::ShardedLogits& logits, const kernels::SampleRow* params,
              const kernels::SeenTokens& seen, const kernels::LogitEdits& edits, float* scratch) override {
    Open open(this);
    inner_->sample(tokens, logprobs, logits, params, seen, edits, scratch);
  }
  void silu_mul(float* out, const float* gate, const float* up, int rows, int cols, int64_t in_stride) override {
    Open open(this);
    inner_->silu_mul(out, gate, up, rows, cols, in_stride);
  }
  void add_inplace(float* x, const float* y, int64_t n) override {
    Open open(this);
    inner_->add_inplace(x, y, n);
  }

 private:
  // The memory is readable and writable while one of the backend's own calls runs.
  class Open {
   public:
    explicit Open(GuardedBackend* b) : b_(b), lock_(b->mu_) { b_->protect(PROT_READ | PROT_WRITE); }
    ~Open() { b_->protect(PROT_NONE); }

   private:
    GuardedBackend* b_;
    std::lock_guard<std::mutex> lock_;
  };
  void protect(int prot) {
    if (used_ > 0) mprotect(base_, (used_ + 4095) / 4096 * 4096, prot);
  }

  const size_t capacity_;
  const std::string name_;
  const bool pinnable_;
  const std::function<Status()> queued_errors_;
  std::set<void*> pinned_;  // Guarded by mu_.
  std::unique_ptr<Backend> inner_;
  uint8_t* base_ = nullptr;
  std::mutex mu_;  // Serializes calls: one opens the memory for its duration only.
  size_t used_ = 0;
  std::vector<float> widened_;    // matmul_xwt_bf16's weights as f32 (host memory).
  std::vector<float> rounded_x_;  // Its activations rounded to bf16 (GemmPrecision::kBf16).
};

}  // namespace

uint64_t guarded_bf16_gemms() { return bf16_gemms.load(); }

std::unique_ptr<engine::Backend> make_guarded_backend(size_t capacity, const std::string& name, bool pinnable,
                                                      std::function<Status()> queued_errors) {
  return std::make_unique<GuardedBackend>(capacity, name, pinnable, std::move(queued_errors));
}

}  // namespace pdserve::testing
