// engine::Backend on one CUDA device: kernels/gpu launches and cuBLAS SGEMM on a per-backend
// stream.
#include <cublas_v2.h>

#include "engine/cuda_backend.h"
#include "kernels/gpu/ops.h"

namespace pdserve::engine {
namespace {

namespace g = kernels::gpu;
namespace k = kernels::cpu;

// Prefill kernel pays off once a call carries tiles of several query tokens.
constexpr int kPrefillKernelMinTokens = 16;

Status cuda_status(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(what, ": ", cudaGetErrorString(e)));
}

class CudaBackend final : public Backend {
 public:
  static StatusOr<std::unique_ptr<Backend>> create(int device) {
    auto b = std::unique_ptr<CudaBackend>(new CudaBackend(device));
    PD_RETURN_IF_ERROR(cuda_status(cudaSetDevice(device), "cudaSetDevice"));
    PD_RETURN_IF_ERROR(cuda_status(cudaStreamCreateWithFlags(&b->stream_, cudaStreamNonBlocking), "cudaStreamCreate"));
    PD_RETURN_IF_ERROR(cuda_status(cudaStreamCreateWithFlags(&b->staging_stream_, cudaStreamNonBlocking),
                                   "cudaStreamCreate"));
    if (cublasCreate(&b->cublas_) != CUBLAS_STATUS_SUCCESS) return absl::InternalError("cublasCreate failed");
    cublasSetStream(b->cublas_, b->stream_);
    // Full fp32: the CPU backend is the reference and TF32 would differ from it by ~1e-3.
    cublasSetMathMode(b->cublas_, CUBLAS_DEFAULT_MATH);
    size_t free_bytes = 0;
    PD_RETURN_IF_ERROR(cuda_status(cudaMemGetInfo(&free_bytes, &b->total_bytes_), "cudaMemGetInfo"));
    return std::unique_ptr<Backend>(std::move(b));
  }

  ~CudaBackend() override {
    bind();
    if (cublas_) cublasDestroy(cublas_);
    if (stream_) cudaStreamDestroy(stream_);
    if (staging_stream_) cudaStreamDestroy(staging_stream_);
  }

  std::string name() const override { return absl::StrCat("cuda:", device_); }

  StatusOr<void*> allocate(size_t bytes) override {
    bind();
    void* p = nullptr;
    PD_RETURN_IF_ERROR(cuda_status(cudaMalloc(&p, bytes ? bytes : 1),
                                   absl::StrCat("cudaMalloc of ", bytes, " bytes").c_str()));
    // Synchronous so that the zeros are there for any stream that uses the memory next.
    PD_RETURN_IF_ERROR(cuda_status(cudaMemset(p, 0, bytes), "cudaMemset"));
    return p;
  }
  void deallocate(void* ptr) override {
    bind();
    cudaFree(ptr);
  }
  // cudaMemcpyDefault: either side may be host or device memory (unified addressing).
  Status copy_to_device(void* dst, const void* src, size_t bytes) override {
    bind();
    return cuda_status(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream_), "copy_to_device");
  }
  // Waits for the copy, so that the host may read `dst` when it returns, as on the CPU.
  Status copy_to_host(void* dst, const void* src, size_t bytes) override {
    bind();
    PD_RETURN_IF_ERROR(cuda_status(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream_), "copy_to_host"));
    return cuda_status(cudaStreamSynchronize(stream_), "copy_to_host");
  }
  Status synchronize() override {
    bind();
    PD_RETURN_IF_ERROR(cuda_status(cudaGetLastError(), "kernel launch"));
    if (gemm_failed_) {
      gemm_failed_ = false;
      return absl::InternalError("cublasSgemm failed");
    }
    return cuda_status(cudaStreamSynchronize(stream_), "synchronize");
  }
  uint64_t memory_bytes() const override { return total_bytes_; }
  bool host_memory() const override { return false; }
  Status staging_copy(void* dst, const void* src, size_t bytes) override {
    bind();
    return cuda_status(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, staging_stream_), "staging copy");
  }
  Status staging_wait() override {
    bind();
    return cuda_status(cudaStreamSynchronize(staging_stream_), "staging copy");
  }
  Status pin_host_memory(void* ptr, size_t bytes) override {
    bind();
    return cuda_status(cudaHostRegister(ptr, bytes, cudaHostRegisterDefault), "cudaHostRegister");
  }
  void unpin_host_memory(void* ptr) override {
    bind();
    cudaHostUnregister(ptr);
  }

  void embed(float* out, const float* table, const int* tokens, int n, int dim) override {
    bind();
    g::embed(out, table, g::Storage::kF32, tokens, n, dim, stream_);
  }
  void rms_norm(float* out, const float* in, const float* w, int rows, int dim, float eps) override {
    bind();
    g::rms_norm(out, in, w, rows, dim, eps, stream_);
  }
  // Row-major y = x · wᵀ is column-major yᵀ = w' ᵀ · xᵀ where w' (w read column-major) is
  // [in][out] with leading dimension ldw: hence op(A) = T on w, op(B) = N on x.
  void matmul_xwt(float* y, const float* x, const float* w, int rows, int out, int in,
                  int64_t ldw) override {
    bind();
    if (rows <= 0 || out <= 0) return;
    const float alpha = 1.0f, beta = 0.0f;
    const cublasStatus_t s = cublasSgemm(cublas_, CUBLAS_OP_T, CUBLAS_OP_N, out, rows, in, &alpha, w,
                                         int(ldw), x, in, &beta, y, out);
    if (s != CUBLAS_STATUS_SUCCESS) gemm_failed_ = true;
  }
  void add_bias(float* y, const float* bias, int rows, int out) override {
    bind();
    g::add_bias(y, bias, rows, out, stream_);
  }
  void rope(float* x, int rows, int64_t row_stride, int n_heads, int head_dim, const int* positions,
            float theta, bool rotate_half) override {
    bind();
    g::rope(x, rows, row_stride, n_heads, head_dim, positions, theta, rotate_half, stream_);
  }
  void paged_kv_write(const k::PagedLayerView& kv, const k::TokenPlacement& tokens, const float* kp,
                      int64_t k_row_stride, const float* vp, int64_t v_row_stride,
                      int n_kv_heads) override {
    bind();
    g::paged_kv_write(kv, g::Storage::kF32, tokens, kp, k_row_stride, vp, v_row_stride, n_kv_heads, stream_);
  }
  void paged_attention(float* out, const float* q, const k::PagedLayerView& kv,
                       const k::TokenPlacement& tokens, int n_q_heads, int q_per_kv, int window,
                       float scale) override {
    bind();
    if (tokens.num_tokens >= kPrefillKernelMinTokens) {
      g::prefill_attention(out, q, kv, g::Storage::kF32, tokens, n_q_heads, q_per_kv, window, scale, stream_);
    } else {
      g::paged_attention(out, q, kv, g::Storage::kF32, tokens, n_q_heads, q_per_kv, window, scale, stream_);
    }
  }
  void index_select_blocks(uint8_t* block_mask, int mask_stride, const float* q_index,
                           const k::PagedLayerView& index_view, const k::TokenPlacement& tokens,
                           int top_k) override {
    bind();
    g::index_select_blocks(block_mask, mask_stride, q_index, index_view, g::Storage::kF32, tokens, top_k, stream_);
  }
  void silu_mul(float* gate, const float* up, int64_t n) override {
    bind();
    g::silu_mul(gate, up, n, stream_);
  }
  void add_inplace(float* x, const float* y, int64_t n) override {
    bind();
    g::add_inplace(x, y, n, stream_);
  }

 private:
  explicit CudaBackend(int device) : device_(device) {}
  // The CUDA current device is per thread, and rank threads may call any backend.
  void bind() const { cudaSetDevice(device_); }

  int device_;
  cudaStream_t stream_ = nullptr;
  cudaStream_t staging_stream_ = nullptr;  // kvtransfer staging copies, beside the forward pass.
  cublasHandle_t cublas_ = nullptr;
  size_t total_bytes_ = 0;
  // Kernel entry points return nothing (as on the CPU); a failed GEMM is reported by the next
  // synchronize().
  bool gemm_failed_ = false;
};

}  // namespace

int cuda_device_count() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

StatusOr<std::unique_ptr<Backend>> make_cuda_backend(int device) {
  const int n = cuda_device_count();
  if (device < 0 || device >= n)
    return absl::UnavailableError(absl::StrCat("CUDA device ", device, " requested, ", n, " available"));
  return CudaBackend::create(device);
}

}  // namespace pdserve::engine
