// engine::Backend on one GPU, from one source for CUDA and HIP: kernels/gpu launches and the
// vendor SGEMM and bf16 GEMM (cuBLAS; hipBLAS where the ROCm build has it, else the portable
// GEMM) on a per-backend stream, staging copies on a second one.
#include "engine/gpu_backend.h"

#include <atomic>
#include <mutex>
#include <shared_mutex>
#include <thread>

#include "engine/backend_buffer.h"
#include "engine/backends/gpu/gpu_abi_id.h"
#include "engine/backends/gpu/gpu_blas.h"
#include "engine/backends/gpu/gpu_queue.h"
#include "kernels/gpu/ops.h"

namespace pdserve::engine {
namespace {

namespace g = kernels::gpu;

// Prefill kernel pays off once a call carries tiles of several query tokens.
constexpr int kPrefillKernelMinTokens = 16;
[[maybe_unused]] constexpr size_t kBlasWorkspaceBytes = size_t(32) << 20;

#if defined(PDSERVE_GPU_HIP)
constexpr const char* kKind = "hip";
constexpr MemoryKind kMemory = MemoryKind::kRocm;
#elif defined(PDSERVE_GPU_EMULATION)
constexpr const char* kKind = "emulated";
constexpr MemoryKind kMemory = MemoryKind::kOpaque;  // Host memory, but kept behind copies as a GPU's.
#else
constexpr const char* kKind = "cuda";
constexpr MemoryKind kMemory = MemoryKind::kCuda;
#endif

Status gpu_status(gpuError_t e, const char* what) {
  if (e == gpuSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(what, ": ", gpuGetErrorString(e)));
}

class GpuBackend final : public Backend {
 public:
  static StatusOr<std::unique_ptr<Backend>> create(int device) {
    auto b = std::unique_ptr<GpuBackend>(new GpuBackend(device));
    PD_RETURN_IF_ERROR(gpu_status(gpuSetDevice(device), "set device"));
    PD_RETURN_IF_ERROR(gpu_status(gpuStreamCreateWithFlags(&b->stream_, gpuStreamNonBlocking), "stream create"));
    PD_RETURN_IF_ERROR(gpu_status(gpuStreamCreateWithFlags(&b->staging_stream_, gpuStreamNonBlocking),
                                  "stream create"));
#if defined(PDSERVE_GPU_BLAS)
    if (gpublasCreate(&b->blas_) != GPUBLAS_STATUS_SUCCESS) return absl::InternalError("BLAS handle create failed");
    gpublasSetStream(b->blas_, b->stream_);
#if defined(PDSERVE_GPU_CUDA)
    // Full fp32: the CPU backend is the reference and TF32 would differ from it by ~1e-3.
    cublasSetMathMode(b->blas_, CUBLAS_DEFAULT_MATH);
    // A workspace of our own, so that a GEMM recorded in a graph allocates none (what cuBLAS
    // asks of stream capture); the size of its own default pool on Hopper.
    PD_RETURN_IF_ERROR(b->blas_workspace_.reserve(b.get(), kBlasWorkspaceBytes));
    if (cublasSetWorkspace(b->blas_, b->blas_workspace_.as<void>(), kBlasWorkspaceBytes) != CUBLAS_STATUS_SUCCESS)
      return absl::InternalError("BLAS workspace set failed");
#endif
#endif
    size_t free_bytes = 0;
    PD_RETURN_IF_ERROR(gpu_status(gpuMemGetInfo(&free_bytes, &b->total_bytes_), "memory info"));
    return std::unique_ptr<Backend>(std::move(b));
  }
  // The device and stream its work is queued on.
  GpuQueue queue() const { return {device_, stream_}; }
  // A communicator's collectives join the stream: from then on the backend drains it before
  // driver-synchronizing calls (drain()).
  void adopt_queue() { drains_ = true; }

  ~GpuBackend() override {
    bind();
#if defined(PDSERVE_GPU_BLAS)
    if (blas_) gpublasDestroy(blas_);  // Before its workspace goes.
#endif
    decode_scratch_.reset();  // Here, while this is still a whole backend (streams too) to free them with.
    gemm_x_.reset();
    retired_.clear();
    blas_workspace_.reset();
    if (stream_) (void)gpuStreamDestroy(stream_);
    if (staging_stream_) (void)gpuStreamDestroy(staging_stream_);
  }

  std::string name() const override { return absl::StrCat(kKind, ":", device_); }

  StatusOr<void*> allocate(size_t bytes) override {
    bind();
    PD_ASSIGN_OR_RETURN(auto held, stream_call("an allocation"));
    drain();
    void* p = nullptr;
    if (gpuError_t e = gpuMalloc(&p, bytes ? bytes : 1); e != gpuSuccess) {
      (void)gpuGetLastError();  // Returned here; not a failed kernel for the next synchronize().
      return gpu_status(e, absl::StrCat("device allocation of ", bytes, " bytes").c_str());
    }
    // Zeroed on this backend's stream, then waited for: a plain memset runs on the legacy default
    // stream, which does not order with our non-blocking streams, and could land after the first
    // writes queued here (the first GPU run showed it: zeroed block tables and sampled tokens).
    PD_RETURN_IF_ERROR(gpu_status(gpuMemsetAsync(p, 0, bytes, stream_), "memset"));
    PD_RETURN_IF_ERROR(gpu_status(gpuStreamSynchronize(stream_), "memset"));
    return p;
  }
  void deallocate(void* ptr) override {
    bind();
    auto held = stream_call("a free");
    if (!held.ok()) {
      deferred_frees_.push_back(ptr);  // Freed when the recording ends.
      return;
    }
    drain();
    (void)gpuFree(ptr);
  }
  // gpuMemcpyDefault: either side may be host or device memory (unified addressing).
  Status copy_to_device(void* dst, const void* src, size_t bytes) override {
    bind();
    PD_ASSIGN_OR_RETURN(auto held, stream_call("a copy"));
    return gpu_status(gpuMemcpyAsync(dst, src, bytes, gpuMemcpyDefault, stream_), "copy_to_device");
  }
  // Waits for the copy, so that the host may read `dst` when it returns, as on the CPU.
  Status copy_to_host(void* dst, const void* src, size_t bytes) override {
    bind();
    PD_ASSIGN_OR_RETURN(auto held, stream_call("a copy"));
    drain();
    PD_RETURN_IF_ERROR(gpu_status(gpuMemcpyAsync(dst, src, bytes, gpuMemcpyDefault, stream_), "copy_to_host"));
    return gpu_status(gpuStreamSynchronize(stream_), "copy_to_host");
  }
  Status synchronize() override {
    bind();
    PD_ASSIGN_OR_RETURN(auto held, stream_call("a wait"));
    PD_RETURN_IF_ERROR(launch_errors());
    return gpu_status(gpuStreamSynchronize(stream_), "synchronize");
  }
  // Into pinned memory the copy is queued like a kernel and the call returns at once.
  Status copy_to_host_queued(void* dst, const void* src, size_t bytes) override {
    bind();
    PD_ASSIGN_OR_RETURN(auto held, stream_call("a copy"));
    return gpu_status(gpuMemcpyAsync(dst, src, bytes, gpuMemcpyDefault, stream_), "copy_to_host_queued");
  }
  Status queued_errors() override {
    bind();
    return launch_errors();
  }
  StatusOr<std::unique_ptr<QueueMark>> create_mark() override {
    bind();
    gpuEvent_t event = nullptr;
    PD_RETURN_IF_ERROR(gpu_status(gpuEventCreateWithFlags(&event, gpuEventDisableTiming), "event create"));
    return std::unique_ptr<QueueMark>(new Mark(this, event));
  }
  uint64_t memory_bytes() const override { return total_bytes_; }
  MemoryKind memory_kind() const override { return kMemory; }
  Status staging_copy(void* dst, const void* src, size_t bytes) override {
    bind();
    return gpu_status(gpuMemcpyAsync(dst, src, bytes, gpuMemcpyDefault, staging_stream_), "staging copy");
  }
  Status staging_wait() override {
    bind();
    return gpu_status(gpuStreamSynchronize(staging_stream_), "staging copy");
  }
  Status pin_host_memory(void* ptr, size_t bytes) override {
    bind();
    const gpuError_t e = gpuHostRegister(ptr, bytes, gpuHostRegisterDefault);
    // The runtime keeps a failed call's error as the thread's last one: cleared, so that the next
    // launch check does not report this refusal (whose caller falls back to pageable memory).
    if (e != gpuSuccess) (void)gpuGetLastError();
    return gpu_status(e, "host register");
  }
  void unpin_host_memory(void* ptr) override {
    bind();
    if (gpuHostUnregister(ptr) != gpuSuccess) (void)gpuGetLastError();  // Likewise.
  }

  void embed(float* out, const float* table, const int* tokens, int n, int dim, const int* sampled) override {
    bind();
    g::embed(out, table, g::Storage::kF32, tokens, n, dim, sampled, stream_);
  }
  void rms_norm(float* out, const float* in, const float* w, int rows, int dim, float eps) override {
    bind();
    g::rms_norm(out, in, w, rows, dim, eps, stream_);
  }
  void gather_rms_norm(float* out, const float* in, const int* row_ids, const float* w, int rows, int dim,
                       float eps) override {
    bind();
    g::gather_rms_norm(out, in, row_ids, w, rows, dim, eps, stream_);
  }
  void add_rms_norm(float* out, float* x, const float* residual, const float* w, int rows, int dim,
                    float eps) override {
    bind();
    g::add_rms_norm(out, x, residual, w, rows, dim, eps, stream_);
  }
  void matmul_xwt(float* y, const float* x, const float* w, int rows, int out, int in,
                  int64_t ldw) override {
    bind();
    if (rows <= 0 || out <= 0) return;
#if defined(PDSERVE_GPU_BLAS)
    // Row-major y = x · wᵀ is column-major yᵀ = w' ᵀ · xᵀ where w' (w read column-major) is
    // [in][out] with leading dimension ldw: hence op(A) = T on w, op(B) = N on x.
    const float alpha = 1.0f, beta = 0.0f;
    if (gpublasSgemm(blas_, GPUBLAS_OP_T, GPUBLAS_OP_N, out, rows, in, &alpha, w, int(ldw), x, in, &beta, y,
                     out) != GPUBLAS_STATUS_SUCCESS)
      gemm_failed_ = true;
#else
    g::matmul_xwt(y, x, w, g::Storage::kF32, rows, out, in, ldw, stream_);
#endif
  }
  // bf16 weights. kExact (f32 activations): the portable GEMM, which reads the weights as stored
  // and accumulates in f32, so a bf16 checkpoint computes what the CPU computes from it (the
  // vendor GEMMs take both operands in one type). kBf16: above the GEMV's rows, the vendor bf16
  // GEMM on a bf16 copy of x (tensor cores, f32 accumulation and output); up to them, without a
  // vendor BLAS, or where the BLAS refuses the call, the portable GEMM rounding x as it loads it
  // (the same products).
  bool bf16_weights() const override { return true; }
  void matmul_xwt_bf16(float* y, const float* x, const uint16_t* w, int rows, int out, int in, int64_t ldw,
                       GemmPrecision precision) override {
    bind();
    if (rows <= 0 || out <= 0) return;
    const bool bf16_x = precision == GemmPrecision::kBf16;
#if defined(PDSERVE_GPU_BLAS)
    // The copy was sized by reserve_gemm_scratch: the forward pass allocates nothing.
    if (bf16_x && rows > g::kGemvMaxRows && gemm_x_.bytes() >= size_t(rows) * in * 2) {
      g::round_to_bf16(gemm_x_.as<void>(), x, int64_t(rows) * in, stream_);
      const float alpha = 1.0f, beta = 0.0f;
      // A refused call queues nothing and says so at once.
      if (gpublasGemmEx(blas_, GPUBLAS_OP_T, GPUBLAS_OP_N, out, rows, in, &alpha, w, GPUBLAS_R_16BF, int(ldw),
                        gemm_x_.as<void>(), GPUBLAS_R_16BF, in, &beta, y, GPUBLAS_R_32F, out, GPUBLAS_COMPUTE_32F,
                        GPUBLAS_GEMM_DEFAULT) == GPUBLAS_STATUS_SUCCESS)
        return;
    }
#endif
    g::matmul_xwt(y, x, w, g::Storage::kBF16, rows, out, in, ldw, stream_, bf16_x);
  }
  // Up to kGemvMaxRows rows (decode, or a short prompt): the portable GEMV with silu_mul as its
  // epilogue, the products matmul_xwt_bf16 computes for them (it takes the same GEMV there), in
  // one launch.
  void gate_up_silu_bf16(float* act, float* gate_up, const float* x, const uint16_t* w, int rows, int hidden, int in,
                         int64_t ldw, GemmPrecision precision) override {
    bind();
    if (rows > g::kGemvMaxRows) return Backend::gate_up_silu_bf16(act, gate_up, x, w, rows, hidden, in, ldw, precision);
    g::gate_up_silu_gemv(act, x, w, rows, hidden, in, ldw, stream_, precision == GemmPrecision::kBf16);
  }
  Status reserve_gemm_scratch(GemmPrecision precision, int max_rows, int max_in) override {
#if defined(PDSERVE_GPU_BLAS)
    if (precision == GemmPrecision::kBf16 && max_rows > g::kGemvMaxRows)
      return grow_scratch(gemm_x_, size_t(max_rows) * size_t(max_in) * 2);
#else
    (void)precision, (void)max_rows, (void)max_in;
#endif
    return absl::OkStatus();
  }
  bool bf16_kv() const override { return true; }
  void paged_kv_write(const kernels::PagedLayerView& kv, const kernels::TokenPlacement& tokens, const float* kp,
                      int64_t k_row_stride, const float* vp, int64_t v_row_stride,
                      int n_kv_heads) override {
    bind();
    g::paged_kv_write(kv, tokens, kp, k_row_stride, vp, v_row_stride, n_kv_heads, stream_);
  }
  void qkv_rope_write(float* q_out, const kernels::QkvRows& rows, const kernels::RopeTable& rope,
                      const kernels::PagedLayerView& kv, const kernels::TokenPlacement& tokens) override {
    bind();
    g::qkv_rope_write(q_out, rows, rope, kv, tokens, stream_);
  }
  void paged_attention(float* out, const float* q, const kernels::PagedLayerView& kv,
                       const kernels::TokenPlacement& tokens, int n_q_heads, int q_per_kv, int window, float scale,
                       GemmPrecision precision) override {
    bind();
    if (tokens.num_tokens >= kPrefillKernelMinTokens && !tokens.single_tokens) {
      if (precision == GemmPrecision::kBf16)
        g::prefill_attention_bf16(out, q, kv, tokens, n_q_heads, q_per_kv, window, scale, stream_);
      else
        g::prefill_attention(out, q, kv, tokens, n_q_heads, q_per_kv, window, scale, stream_);
    } else if (tokens.max_position >= 0) {
      // Decode: split over the key range, each K/V row read once per group of query heads.
      int splits = g::decode_splits(tokens.max_position, window);
      // Growing frees the old scratch, which waits for the kernels queued on it.
      const size_t floats = g::split_decode_scratch_floats(tokens.num_tokens, n_q_heads, kv.v_head_dim, splits);
      if (!grow_scratch(decode_scratch_, floats * sizeof(float)).ok())
        splits = 1;  // One split keeps no partial states: slower, never wrong.
      g::split_decode_attention(out, q, kv, tokens, n_q_heads, q_per_kv, window, scale, splits, g::kMinKeysPerSplit,
                                decode_scratch_.as<float>(), stream_);
    } else {
      g::paged_attention(out, q, kv, tokens, n_q_heads, q_per_kv, window, scale, stream_);
    }
  }
  void index_select_blocks(uint8_t* block_mask, int mask_stride, const float* q_index,
                           const kernels::PagedLayerView& index_view, const kernels::TokenPlacement& tokens,
                           int top_k) override {
    bind();
    g::index_select_blocks(block_mask, mask_stride, q_index, index_view, tokens, top_k, stream_);
  }
  void sample(int* tokens, kernels::RowLogprobs* logprobs, const kernels::ShardedLogits& logits, const kernels::SampleRow* params,
              const kernels::SeenTokens& seen, const kernels::LogitEdits& edits, float* scratch) override {
    bind();
    g::sample(tokens, logprobs, logits, params, seen, edits, scratch, stream_);
  }
  void silu_mul(float* out, const float* gate, const float* up, int rows, int cols, int64_t in_stride) override {
    bind();
    g::silu_mul(out, gate, up, rows, cols, in_stride, stream_);
  }
  void add_inplace(float* x, const float* y, int64_t n) override {
    bind();
    g::add_inplace(x, y, n, stream_);
  }

  bool records_graphs() const override { return true; }
  Status begin_capture() override {
    bind();
    if (recording_thread_.load() == std::this_thread::get_id())
      return absl::FailedPreconditionError("a graph is being recorded already");
    // After other threads' stream calls under way; their next ones wait at the turnstile, so a
    // steady stream of them (a host tier's loads) cannot starve the recording.
    std::lock_guard turn(capture_turnstile_);
    std::unique_lock held(capture_mu_);
    if (gpuError_t e = gpuStreamBeginCapture(stream_, gpuStreamCaptureModeThreadLocal); e != gpuSuccess) {
      (void)gpuGetLastError();  // Returned here: the caller runs eagerly, and its step must not fail of it.
      return gpu_status(e, "begin capture");
    }
    capture_held_ = std::move(held);
    recording_thread_.store(std::this_thread::get_id());
    capture_spoiled_ = false;
    return absl::OkStatus();
  }
  StatusOr<std::unique_ptr<StepGraph>> end_capture() override {
    bind();
    if (recording_thread_.load() != std::this_thread::get_id())
      return absl::FailedPreconditionError("no graph is being recorded on this thread");
    const std::unique_lock held = std::move(capture_held_);  // Released on return.
    recording_thread_.store(std::thread::id());
    gpuGraph_t graph = nullptr;
    const gpuError_t ended = gpuStreamEndCapture(stream_, &graph);
    if (ended != gpuSuccess) (void)gpuGetLastError();  // Returned here; the stream works on.
    // A GEMM the BLAS refused while recording is missing from the graph; the failure is the
    // recording's, whichever way it ends, not the next eager step's.
    const bool gemm_failed = gemm_failed_.exchange(false);
    for (void* p : deferred_frees_) (void)gpuFree(p);
    deferred_frees_.clear();
    if (capture_spoiled_ || ended != gpuSuccess) {
      if (graph != nullptr) (void)gpuGraphDestroy(graph);
      return capture_spoiled_ ? absl::FailedPreconditionError("a call a graph cannot hold spoiled its recording")
                              : gpu_status(ended, "graph capture");
    }
    gpuGraphExec_t exec = nullptr;
    const gpuError_t e = gpuGraphInstantiate(&exec, graph, 0);
    (void)gpuGraphDestroy(graph);
    if (e != gpuSuccess) {
      (void)gpuGetLastError();
      return gpu_status(e, "graph instantiate");
    }
    auto recorded = std::make_unique<Graph>(this, exec);
    if (gemm_failed) return absl::InternalError("vendor GEMM failed while recording a graph");
    return std::unique_ptr<StepGraph>(std::move(recorded));
  }

 private:
  // A recorded step: an instantiated graph, launched on the backend's stream.
  class Graph final : public StepGraph {
   public:
    Graph(GpuBackend* backend, gpuGraphExec_t exec) : backend_(backend), exec_(exec) { ++backend_->live_graphs_; }
    ~Graph() override {
      backend_->bind();
      (void)gpuGraphExecDestroy(exec_);
      if (--backend_->live_graphs_ == 0) backend_->retired_.clear();
    }
    Status replay() override {
      backend_->bind();
      const gpuError_t e = gpuGraphLaunch(exec_, backend_->stream_);
      if (e != gpuSuccess) (void)gpuGetLastError();  // Returned here: the step goes on eagerly.
      return gpu_status(e, "graph launch");
    }

   private:
    GpuBackend* backend_;
    gpuGraphExec_t exec_;
  };

  // An event on the stream.
  class Mark final : public QueueMark {
   public:
    Mark(GpuBackend* backend, gpuEvent_t event) : backend_(backend), event_(event) {}
    ~Mark() override {
      backend_->bind();
      (void)gpuEventDestroy(event_);
    }
    Status record() override {
      backend_->bind();
      PD_ASSIGN_OR_RETURN(auto held, backend_->stream_call("an event"));
      return gpu_status(gpuEventRecord(event_, backend_->stream_), "event record");
    }
    Status wait() override {
      backend_->bind();
      return gpu_status(gpuEventSynchronize(event_), "event wait");
    }

   private:
    GpuBackend* backend_;
    gpuEvent_t event_;
  };

  explicit GpuBackend(int device) : device_(device) {}
  // Errors of calls that returned none: a failed launch, a failed vendor GEMM.
  Status launch_errors() {
    PD_RETURN_IF_ERROR(gpu_status(gpuGetLastError(), "kernel launch"));
    if (gemm_failed_.exchange(false)) return absl::InternalError("vendor GEMM failed");
    return absl::OkStatus();
  }
  // Where a communicator queues its collectives on this stream (adopt_queue), waits for what the
  // stream holds before a call that may synchronize the device inside the driver (an allocation,
  // a free, a copy into pageable memory): NCCL documents that such a call, made while a
  // collective is in flight, can deadlock a process that drives several GPUs. On the rank's own
  // thread (a scratch grown mid-step) nothing is then in flight; another thread's call waits for
  // what was queued when it came. Its errors are the next call's (kernel faults are sticky).
  void drain() {
    if (drains_) (void)gpuStreamSynchronize(stream_);
  }
  // The current device is per thread, and rank threads may call any backend.
  void bind() const { (void)gpuSetDevice(device_); }
  // Grows `buffer`, a scratch of the backend's own, to at least `bytes`. A recorded graph may
  // still read its old allocation: while any lives, that is kept (freed when the last goes).
  Status grow_scratch(BackendBuffer& buffer, size_t bytes) {
    if (buffer.bytes() >= bytes) return absl::OkStatus();
    if (live_graphs_ > 0 && buffer.bytes() > 0) retired_.push_back(std::move(buffer));
    return buffer.reserve(this, bytes);
  }
  // Admits a call on the stream that a graph cannot hold (a wait, copy, allocation or free). From
  // the thread recording a graph it is refused and spoils the recording: the backend says so
  // itself rather than leaving it to the runtime's capture rules, which differ by call and vendor
  // (and a refused allocation would leak). From any other thread (a host-tier load, a lease's
  // copy) it waits until the recording ends and holds the next one off while it runs: a GPU
  // records every thread's work on a capturing stream, and a copy of another request's KV must
  // not end up in a graph.
  StatusOr<std::shared_lock<std::shared_mutex>> stream_call(const char* call) {
    if (recording_thread_.load() == std::this_thread::get_id()) {
      capture_spoiled_ = true;
      return absl::FailedPreconditionError(absl::StrCat(call, " while a graph is being recorded"));
    }
    { std::lock_guard pass(capture_turnstile_); }             // Behind a recording that is waiting to start.
    return std::shared_lock<std::shared_mutex>(capture_mu_);  // Stream calls run side by side.
  }

  int device_;
  std::atomic<bool> drains_{false};  // A communicator's collectives share stream_ (adopt_queue).
  gpuStream_t stream_ = nullptr;
  gpuStream_t staging_stream_ = nullptr;  // kvtransfer staging copies, beside the forward pass.
#if defined(PDSERVE_GPU_BLAS)
  gpublasHandle_t blas_ = nullptr;
#endif
  size_t total_bytes_ = 0;
  BackendBuffer decode_scratch_;  // The splits' softmax states (g::split_decode_attention).
  BackendBuffer gemm_x_;          // The bf16 copy of a vendor bf16 GEMM's activations.
  BackendBuffer blas_workspace_;  // cuBLAS's (cublasSetWorkspace).
  // Scratch grown while recorded graphs lived (grow_scratch), and how many live.
  std::vector<BackendBuffer> retired_;
  int live_graphs_ = 0;
  // Kernel entry points return nothing (as on the CPU); a failed GEMM is reported by the next
  // synchronize().
  std::atomic<bool> gemm_failed_{false};  // Host-tier threads may synchronize() too.
  // Recording: the thread between begin_capture() and end_capture() (none: default id), which
  // holds capture_mu_ (capture_held_) meanwhile; whether a refused call spoiled the recording; the
  // frees it put off.
  std::atomic<std::thread::id> recording_thread_{};
  std::shared_mutex capture_mu_;
  std::mutex capture_turnstile_;  // Taken by begin_capture until it holds capture_mu_.
  std::unique_lock<std::shared_mutex> capture_held_;
  bool capture_spoiled_ = false;
  std::vector<void*> deferred_frees_;
};

}  // namespace

std::string_view gpu_backend_kind() { return kKind; }

int gpu_device_count() {
  int n = 0;
  return gpuGetDeviceCount(&n) == gpuSuccess ? n : 0;
}

std::optional<GpuQueue> gpu_queue_of(const Backend& backend) {
  const auto* gpu = dynamic_cast<const GpuBackend*>(&backend);
  if (gpu == nullptr) return std::nullopt;
  return gpu->queue();
}

void adopt_gpu_queue(Backend& backend) {
  if (auto* gpu = dynamic_cast<GpuBackend*>(&backend)) gpu->adopt_queue();
}

StatusOr<std::unique_ptr<Backend>> make_gpu_backend(int device) {
  const int n = gpu_device_count();
  if (device < 0 || device >= n)
    return absl::UnavailableError(absl::StrCat(kKind, " device ", device, " requested, ", n, " available"));
  return GpuBackend::create(device);
}

}  // namespace pdserve::engine

extern "C" const pdserve::engine::GpuBackendApi* pdserve_gpu_backend_api() {
  using namespace pdserve::engine;
  static const GpuBackendApi api = {GpuBackendApi::kVersion, PDSERVE_GPU_ABI_ID, &gpu_backend_kind,
                                    &gpu_device_count, &make_gpu_backend, &make_gpu_group};
  return &api;
}
