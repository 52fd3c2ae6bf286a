// The compute backend a TP rank runs on: its memory and its kernels. Shaped for GPUs (memory
// that may live on a device, work queued on a stream and completed by synchronize()) and
// implemented now for the CPU, where "device" memory is host memory and every call completes
// before it returns. Kernels are the free functions of kernels/<backend>/ behind these entry
// points; the forward pass (engine/rank_runner.h) calls only this interface.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "engine/dtype.h"
#include "kernels/cpu/paged_attention.h"
#include "kernels/cpu/sampling.h"

namespace pdserve::engine {

// Where a backend's memory lives: it decides how weights and KV reach it (uploads and staging
// copies, or none) and which device memory a transport may be handed.
enum class MemoryKind {
  kHost,    // Host memory the CPU may use directly (the CPU backend).
  kCuda,    // NVIDIA device memory.
  kRocm,    // AMD device memory.
  kOpaque,  // Device memory no transport understands (the emulated GPU, test doubles): copies only.
};

// A backend's work recorded once (a CUDA or HIP graph) and queued again by replay() with the
// arguments it was recorded with: the same pointers and sizes, the memory they point at read
// anew. What changes between replays must therefore be that memory's contents, never a pointer,
// a size or a host-side argument. It must not outlive its backend or the buffers it reads.
class StepGraph {
 public:
  virtual ~StepGraph() = default;
  // Queues the recorded work on the backend's stream, in the order it was recorded.
  virtual Status replay() = 0;
};

// A point in a backend's queue (a GPU event), so that the host can wait for one step's work
// while the next is queued behind it (asynchronous scheduling).
class QueueMark {
 public:
  virtual ~QueueMark() = default;
  // Marks the end of the work queued so far.
  virtual Status record() = 0;
  // Waits until the work before the last record() has finished (not work queued since); errors of
  // its execution (a fault), not those queued_errors() reports.
  virtual Status wait() = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  // Memory the backend's kernels can use; zero-initialised.
  virtual StatusOr<void*> allocate(size_t bytes) = 0;
  virtual void deallocate(void* ptr) = 0;
  // Copies between host and backend memory (queued on the rank's stream).
  virtual Status copy_to_device(void* dst, const void* src, size_t bytes) = 0;
  virtual Status copy_to_host(void* dst, const void* src, size_t bytes) = 0;
  // Waits until all queued work has finished.
  virtual Status synchronize() = 0;
  // copy_to_host without the wait: `dst` (pinned with pin_host_memory on a device backend, so
  // the copy does not hold up the caller) holds the bytes once a QueueMark recorded after it has
  // been waited for. By default copy_to_host, which waits.
  virtual Status copy_to_host_queued(void* dst, const void* src, size_t bytes) { return copy_to_host(dst, src, bytes); }
  // Errors of the calls queued so far that reported none (a failed launch, a failed vendor
  // GEMM), without waiting; each reported once, here or by synchronize(). So a queued step's
  // errors are its own, not the next one's. None by default.
  virtual Status queued_errors() { return absl::OkStatus(); }
  // A mark in this backend's queue. By default one whose wait() is synchronize(): right, if it
  // waits for more than it must; backends whose calls complete as they return need no more.
  // (Inline, as every default here: the GPU library has no key function to link against.)
  virtual StatusOr<std::unique_ptr<QueueMark>> create_mark() {
    struct WholeQueueMark final : QueueMark {
      explicit WholeQueueMark(Backend* b) : backend(b) {}
      Status record() override { return absl::OkStatus(); }
      Status wait() override { return backend->synchronize(); }
      Backend* backend;
    };
    return std::unique_ptr<QueueMark>(new WholeQueueMark(this));
  }
  // Total memory of the device (physical RAM for the CPU backend).
  virtual uint64_t memory_bytes() const = 0;
  // Copies of KV between this backend's memory and host memory outside the forward pass
  // (kvtransfer staging through a host mirror of the arena), queued on a channel of their own:
  // ordered among themselves only, and safe from any thread. Callers order them with the
  // forward pass: a layer hook runs once its layer is written; blocks being filled belong to
  // no running sequence.
  virtual Status staging_copy(void* dst, const void* src, size_t bytes) = 0;
  // Waits until every staging copy queued so far has finished.
  virtual Status staging_wait() = 0;
  // Page-locks host memory that staging copies use, for full-speed DMA (a no-op where host
  // memory needs no pinning); unpin_host_memory undoes it.
  virtual Status pin_host_memory(void* ptr, size_t bytes) = 0;
  virtual void unpin_host_memory(void* ptr) = 0;
  // Where the backend's memory lives. A device backend's is not host memory: weights are
  // uploaded, and the KV arena is reached through copies or a transport that understands it.
  virtual MemoryKind memory_kind() const = 0;
  // Whether the backend's memory is host memory the CPU may use directly.
  bool host_memory() const { return memory_kind() == MemoryKind::kHost; }

  // out[t] = table[token t]. A negative tokens[t] stands for sampled[-1 - tokens[t]]: the token
  // a step sampled into backend memory, fed to the next step before the host has read it
  // (asynchronous scheduling). `sampled` may be null when no token is negative.
  virtual void embed(float* out, const float* table, const int* tokens, int n, int dim, const int* sampled) = 0;
  virtual void rms_norm(float* out, const float* in, const float* w, int rows, int dim, float eps) = 0;
  // out[r] = rms_norm(in[row_ids[r]]) (row_ids in backend memory): a step's logits rows picked
  // out of its hidden states and normed in one call, not a copy per row.
  virtual void gather_rms_norm(float* out, const float* in, const int* row_ids, const float* w, int rows, int dim,
                               float eps) = 0;
  // x += residual, then out = rms_norm(x) (one launch where two were: the residual add and the
  // next norm); the same results as add_inplace then rms_norm.
  virtual void add_rms_norm(float* out, float* x, const float* residual, const float* w, int rows, int dim,
                            float eps) = 0;
  virtual void matmul_xwt(float* y, const float* x, const float* w, int rows, int out, int in,
                          int64_t ldw) = 0;
  // Whether the backend keeps GEMM weights as bf16 (half the bytes a decode step reads), with
  // matmul_xwt_bf16; the CPU backend computes with f32 weights only.
  virtual bool bf16_weights() const = 0;
  // matmul_xwt with w's elements bf16 (raw bits), products accumulated in f32; x as f32
  // (kExact) or each element rounded to bf16 first (kBf16, engine/dtype.h). Only on backends
  // whose bf16_weights() is true.
  virtual void matmul_xwt_bf16(float* y, const float* x, const uint16_t* w, int rows, int out, int in, int64_t ldw,
                               GemmPrecision precision) = 0;
  // SwiGLU's input: act[r][h] = silu(g) · u where [g | u] = x · wᵀ (bf16 weights, `precision` as
  // matmul_xwt_bf16), w's first `hidden` rows the gate projection's and the next `hidden` the up
  // projection's. By default matmul_xwt_bf16 into `gate_up` (rows × 2·hidden floats) then
  // silu_mul; a backend may fuse the two where that gives the same results (the GPU's GEMV up to
  // 8 rows — decode, or a short prompt — which then leaves gate_up untouched).
  virtual void gate_up_silu_bf16(float* act, float* gate_up, const float* x, const uint16_t* w, int rows, int hidden,
                                 int in, int64_t ldw, GemmPrecision precision) {
    matmul_xwt_bf16(gate_up, x, w, rows, 2 * hidden, in, ldw, precision);
    silu_mul(act, gate_up, gate_up + hidden, rows, hidden, 2 * hidden);
  }
  // Makes room for what matmul_xwt_bf16 with `precision` needs beyond its operands for up to
  // `max_rows` rows of up to `max_in` columns (a device's bf16 copy of x for the vendor GEMM), so
  // that the forward pass allocates nothing; a backend needing nothing returns OK.
  virtual Status reserve_gemm_scratch(GemmPrecision precision, int max_rows, int max_in) = 0;
  // Whether the paged-KV entry points below take views of bf16 storage (half the bytes a decode
  // step's attention reads and the cache holds); the CPU backend keeps its KV in f32.
  virtual bool bf16_kv() const = 0;
  virtual void paged_kv_write(const kernels::PagedLayerView& kv,
                              const kernels::TokenPlacement& tokens, const float* k,
                              int64_t k_row_stride, const float* v, int64_t v_row_stride,
                              int n_kv_heads) = 0;
  // Attention's input stage of a layer (kernels::cpu::qkv_rope_write): the Q and K rows' biases,
  // head norms and RoPE, roped Q into q_out (compact), K and V into the paged cache; one pass
  // where separate bias, norm, rope and KV-write calls took up to eight. `rope.inv_freq` is the
  // head dim's table (engine/rope_scaling.h) in backend memory.
  virtual void qkv_rope_write(float* q_out, const kernels::QkvRows& rows, const kernels::RopeTable& rope,
                              const kernels::PagedLayerView& kv, const kernels::TokenPlacement& tokens) = 0;
  // kernels::cpu::paged_attention. With `precision` kBf16 (bf16 weights only, as for the
  // GEMMs) a backend with tensor cores runs a prefill chunk's two products, Q·Kᵀ and P·V, on
  // bf16 operands with f32 accumulation (kernels/gpu/ops.h: prefill_attention_bf16).
  virtual void paged_attention(float* out, const float* q, const kernels::PagedLayerView& kv,
                               const kernels::TokenPlacement& tokens, int n_q_heads, int q_per_kv, int window,
                               float scale, GemmPrecision precision) = 0;
  virtual void index_select_blocks(uint8_t* block_mask, int mask_stride, const float* q_index,
                                   const kernels::PagedLayerView& index_view,
                                   const kernels::TokenPlacement& tokens, int top_k) = 0;
  // tokens[r] (and logprobs[r] for rows asking) = what kernels::cpu::sample_rows gives for row
  // r of `logits` with params[r], the penalties' state `seen` (updated in place) and the step's
  // `edits`, so that only tokens and log-probabilities leave the device. Every pointer (logits.data,
  // seen's and edits' too) is backend memory; `logprobs` may be null when no row asks;
  // `scratch` holds kernels::sample_scratch_floats(logits.rows, logits.vocab) floats.
  virtual void sample(int* tokens, kernels::RowLogprobs* logprobs, const kernels::ShardedLogits& logits,
                      const kernels::SampleRow* params, const kernels::SeenTokens& seen,
                      const kernels::LogitEdits& edits, float* scratch) = 0;
  // out[r][c] = silu(gate[r][c]) * up[r][c]: rows of `cols`, out compact, gate's and up's rows
  // `in_stride` apart (kernels::cpu::silu_mul).
  virtual void silu_mul(float* out, const float* gate, const float* up, int rows, int cols, int64_t in_stride) = 0;
  virtual void add_inplace(float* x, const float* y, int64_t n) = 0;

  // Whether begin_capture() can record (a GPU backend's stream capture).
  virtual bool records_graphs() const { return false; }
  // Until end_capture(), records the calling thread's kernel entry points instead of running
  // them (a GPU's stream capture: launching one recorded step costs one call, not one a kernel).
  // Only kernel entry points may be called from that thread meanwhile: a wait, copy, allocation
  // or free spoils the recording. Other threads' waits and copies wait for the recording to end,
  // and stay out of it. Unimplemented on backends without graphs (the CPU's), whose callers run
  // eagerly.
  virtual Status begin_capture() { return absl::UnimplementedError(absl::StrCat(name(), " records no graphs")); }
  // Ends the recording: the graph, or why there is none (a spoiling call). Either way the
  // backend runs calls again.
  virtual StatusOr<std::unique_ptr<StepGraph>> end_capture() {
    return absl::UnimplementedError(absl::StrCat(name(), " records no graphs"));
  }
};

// How many threads a CPU backend computes with: `threads` (the rank's own and threads - 1
// helpers of the backend, which split its GEMMs' columns and attention's tokens), and how many
// compute threads the whole process runs (TP × threads for an engine), so that waits spin only
// while each has a core (spin_barrier.h). The results are the same bits whatever the count.
struct CpuThreading {
  int threads = 1;
  int threads_in_process = 1;
};
inline constexpr int kMaxCpuThreads = 1024;
// InvalidArgument unless 1 <= threads <= kMaxCpuThreads (--cpu-threads, EngineOptions::cpu_threads).
Status check_cpu_threads(int threads);

// The fp32 CPU backend (kernels/cpu, whose GEMM is batch-invariant); threading.threads in
// [1, kMaxCpuThreads] (make_backend checks; this aborts).
std::unique_ptr<Backend> make_cpu_backend(CpuThreading threading = {});

// The backend named `kind` on device `device`: "cpu" (device ignored), "cuda" in builds with
// PDSERVE_WITH_CUDA, "hip" in builds with PDSERVE_WITH_HIP, and in every build "emulated": the GPU
// backend's code on a CPU emulation of a GPU (kernels/gpu/emulation/simt.h), eight devices of
// host memory, for tests — orders of magnitude slower than the CPU backend. Unimplemented for a
// kind this build lacks, Unavailable without the device; InvalidArgument for more than one CPU
// thread with a GPU kind (its kernels run on the device).
StatusOr<std::unique_ptr<Backend>> make_backend(std::string_view kind, int device, CpuThreading cpu = {});
// The kinds make_backend knows in this build.
std::vector<std::string> backend_kinds();

}  // namespace pdserve::engine
