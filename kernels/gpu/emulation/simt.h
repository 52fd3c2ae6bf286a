// A CPU emulation of the CUDA names the kernels of kernels/gpu use, so that machines without a GPU
// (CI) run the kernels' own code against the CPU reference. gpu_compat.h includes it instead of a
// vendor runtime when PDSERVE_GPU_EMULATION is defined; nothing in a product build does.
//
// A block's threads are coroutines that one host thread runs in turn, each until its next
// synchronization point: __syncthreads (the block), or a warp shuffle (its 32 lanes exchange
// values). Blocks run one after another, so __shared__ variables are function statics. Memory is
// host memory and streams are empty: every launch completes before it returns — except on a
// stream capturing a graph (gpuStreamBeginCapture), whose launches are recorded to run at each
// gpuGraphLaunch, as on a GPU (below).
//
// It also checks what a GPU leaves undefined: a __syncthreads or shuffle that some of the threads
// it waits for never reach (they returned) aborts the run with a message. And with the
// environment variable PDSERVE_SIMT_REVERSE set, threads run last to first within every phase
// between barriers: a kernel whose threads read what another writes in the same phase (a missing
// barrier) computes something else in one of the two orders, which its tests see.
#pragma once

#include <math.h>

#include <atomic>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <vector>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static
#define PDSERVE_DYNAMIC_SHARED(type, name) \
  type* name = static_cast<type*>(::pdserve::kernels::gpu::simt::dynamic_shared())

struct dim3 {
  unsigned x = 1, y = 1, z = 1;
  constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
inline dim3 threadIdx{0, 0, 0}, blockIdx{0, 0, 0}, blockDim, gridDim;

namespace pdserve::kernels::gpu::simt {

inline constexpr unsigned kWarpLanes = 32;

// Runs `body` as a grid of `grid` blocks of `block` threads with `shared_bytes` of dynamic shared
// memory (kernels/gpu/emulation/simt.cc). Launches from several host threads (an engine's rank
// and staging threads) take turns: kernels' __shared__ statics are one per process.
void launch(dim3 grid, dim3 block, size_t shared_bytes, const std::function<void()>& body);
// This block's dynamic shared memory, 128-byte aligned as on a GPU.
void* dynamic_shared();
// Waits until every lane of the calling thread's warp is here.
void warp_barrier();
// Waits until every thread of the block is here.
void block_barrier();
// The calling thread's index in its block, x fastest.
unsigned linear_thread();
// Lane values for shuffles, one slot per thread of the running block.
uint64_t* lane_slots();
// Dynamic shared memory a launch may take without an opt-in, and the most an opt-in may grant
// (sm_90's), as on a GPU.
inline constexpr size_t kDefaultDynamicShared = size_t(48) << 10, kMaxDynamicShared = size_t(227) << 10;
// Records an opt-in (allow_dynamic_shared) of `bytes` for `kernel`, on the calling host thread
// (standing for the device it drives).
void allow_shared(const void* kernel, size_t bytes);
// Aborts with a message when a launch of `kernel` asks for more dynamic shared memory than it
// may take: a GPU refuses such a launch.
void check_shared(const void* kernel, size_t bytes);

}  // namespace pdserve::kernels::gpu::simt

inline void __syncthreads() { pdserve::kernels::gpu::simt::block_barrier(); }

// CUDA's __shfl_xor_sync: the value of lane (lane ^ lane_mask) within groups of `width` lanes.
template <typename T>
T __shfl_xor_sync(unsigned, T value, int lane_mask, int width = 32) {
  namespace simt = pdserve::kernels::gpu::simt;
  static_assert(sizeof(T) <= sizeof(uint64_t));
  const unsigned t = simt::linear_thread(), lane = t % simt::kWarpLanes, base = t - lane;
  std::memcpy(&simt::lane_slots()[t], &value, sizeof(T));
  simt::warp_barrier();
  unsigned source = lane ^ unsigned(lane_mask);
  if (source / unsigned(width) != lane / unsigned(width)) source = lane;
  T out;
  std::memcpy(&out, &simt::lane_slots()[base + source], sizeof(T));
  simt::warp_barrier();  // Every lane has read before any lane's next shuffle writes.
  return out;
}

inline int atomicMax(int* address, int value) {
  std::atomic_ref<int> a(*address);
  int old = a.load();
  while (old < value && !a.compare_exchange_weak(old, value)) {
  }
  return old;
}
inline unsigned atomicOr(unsigned* address, unsigned value) { return std::atomic_ref<unsigned>(*address).fetch_or(value); }
inline unsigned atomicAdd(unsigned* address, unsigned value) {
  return std::atomic_ref<unsigned>(*address).fetch_add(value);
}
inline unsigned long long atomicAdd(unsigned long long* address, unsigned long long value) {
  return std::atomic_ref<unsigned long long>(*address).fetch_add(value);
}
inline float __uint_as_float(unsigned bits) { return std::bit_cast<float>(bits); }
inline unsigned __float_as_uint(float x) { return std::bit_cast<unsigned>(x); }
template <typename T>
T min(T a, T b) {
  return b < a ? b : a;
}
template <typename T>
T max(T a, T b) {
  return a < b ? b : a;
}

// CUDA's and HIP's 16-byte vector type, for 16-byte loads.
struct alignas(16) uint4 {
  unsigned x, y, z, w;
};

// 16-bit storage types with CUDA's conversion functions (round to nearest even).
struct gpu_emulated_bf16 {
  uint16_t bits;
};
struct gpu_emulated_f16 {
  _Float16 value;
};
inline float __bfloat162float(gpu_emulated_bf16 b) { return std::bit_cast<float>(uint32_t(b.bits) << 16); }
inline gpu_emulated_bf16 __float2bfloat16(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  if (std::isnan(f)) return {uint16_t((u >> 16) | 0x40)};
  return {uint16_t((u + 0x7fff + ((u >> 16) & 1)) >> 16)};
}
inline float __half2float(gpu_emulated_f16 h) { return float(h.value); }
inline gpu_emulated_f16 __float2half(float f) { return {_Float16(f)}; }

// The runtime calls the kernels' launchers, tests and the GPU backend (engine/backends/gpu/gpu_backend.cc)
// use, for kEmulatedDevices devices of host memory (so the engine's shared-memory collectives
// serve their TP ranks) whose streams have always completed everything already.
enum gpuError_t {
  gpuSuccess = 0,
  gpuErrorMemoryAllocation = 2,
  gpuErrorInvalidValue = 1,
  gpuErrorInvalidDevice = 101,
  gpuErrorStreamCaptureUnsupported = 900,
  gpuErrorStreamCaptureInvalidated = 901,
};
enum gpuMemcpyKind { gpuMemcpyHostToDevice, gpuMemcpyDeviceToHost, gpuMemcpyDeviceToDevice, gpuMemcpyDefault };
enum gpuStreamCaptureMode { gpuStreamCaptureModeThreadLocal };

// A stream, and a graph: the launches a stream recorded between gpuStreamBeginCapture and
// gpuStreamEndCapture, each with its arguments as they were at the call (a GPU's graph keeps
// kernel parameters by value: what a replay reads anew is only the memory they point at). While
// a stream captures, a call of its host thread that would wait, copy or allocate fails and spoils
// the capture (CUDA's thread-local capture mode refuses them so; stricter for copies, which a
// GPU records between device buffers and which nothing here records), so the emulation catches
// what a GPU's capture would not survive.
struct gpu_emulated_graph {
  std::vector<std::function<void()>> nodes;
};
struct gpu_emulated_stream {
  gpu_emulated_graph* capture = nullptr;  // Recording into it.
  bool spoiled = false;                   // A refused call during the capture.
};
using gpuStream_t = gpu_emulated_stream*;
using gpuGraph_t = gpu_emulated_graph*;
using gpuGraphExec_t = gpu_emulated_graph*;
namespace pdserve::kernels::gpu::simt {
// The stream this host thread captures on, if any.
inline thread_local gpu_emulated_stream* capturing = nullptr;
// Whether a call that a capture refuses may run now; if not, spoils the capture.
inline bool capture_allows_call() {
  if (capturing == nullptr) return true;
  capturing->spoiled = true;
  return false;
}
}  // namespace pdserve::kernels::gpu::simt
inline constexpr unsigned gpuStreamNonBlocking = 1;
inline constexpr unsigned gpuHostRegisterDefault = 0;
inline constexpr int kEmulatedDevices = 8;
inline constexpr size_t kEmulatedDeviceBytes = size_t(16) << 30;
inline const char* gpuGetErrorString(gpuError_t e) {
  switch (e) {
    case gpuSuccess: return "no error";
    case gpuErrorInvalidValue: return "invalid argument";
    case gpuErrorInvalidDevice: return "invalid device";
    case gpuErrorStreamCaptureUnsupported: return "operation not permitted when stream is capturing";
    case gpuErrorStreamCaptureInvalidated: return "operation failed due to a previous error during capture";
    default: return "out of memory";
  }
}
inline gpuError_t gpuGetLastError() { return gpuSuccess; }
inline gpuError_t gpuDeviceSynchronize() {
  return pdserve::kernels::gpu::simt::capture_allows_call() ? gpuSuccess : gpuErrorStreamCaptureUnsupported;
}
inline gpuError_t gpuGetDeviceCount(int* count) {
  *count = kEmulatedDevices;
  return gpuSuccess;
}
inline gpuError_t gpuSetDevice(int device) {
  return device >= 0 && device < kEmulatedDevices ? gpuSuccess : gpuErrorInvalidDevice;
}
inline gpuError_t gpuMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
  *free_bytes = *total_bytes = kEmulatedDeviceBytes;
  return gpuSuccess;
}
inline gpuError_t gpuStreamCreateWithFlags(gpuStream_t* stream, unsigned) {
  *stream = new gpu_emulated_stream();
  return gpuSuccess;
}
inline gpuError_t gpuStreamDestroy(gpuStream_t stream) {
  delete stream;
  return gpuSuccess;
}
inline gpuError_t gpuStreamSynchronize(gpuStream_t) {
  return pdserve::kernels::gpu::simt::capture_allows_call() ? gpuSuccess : gpuErrorStreamCaptureUnsupported;
}
inline gpuError_t gpuStreamBeginCapture(gpuStream_t stream, gpuStreamCaptureMode) {
  namespace simt = pdserve::kernels::gpu::simt;
  if (stream == nullptr || stream->capture != nullptr || simt::capturing != nullptr) return gpuErrorInvalidValue;
  stream->capture = new gpu_emulated_graph();
  stream->spoiled = false;
  simt::capturing = stream;
  return gpuSuccess;
}
// The recorded graph, or (after a refused call) none and gpuErrorStreamCaptureInvalidated.
inline gpuError_t gpuStreamEndCapture(gpuStream_t stream, gpuGraph_t* graph) {
  namespace simt = pdserve::kernels::gpu::simt;
  if (stream == nullptr || stream->capture == nullptr || simt::capturing != stream) return gpuErrorInvalidValue;
  simt::capturing = nullptr;
  *graph = stream->capture;
  stream->capture = nullptr;
  if (!stream->spoiled) return gpuSuccess;
  delete *graph;
  *graph = nullptr;
  return gpuErrorStreamCaptureInvalidated;
}
inline gpuError_t gpuGraphInstantiate(gpuGraphExec_t* exec, gpuGraph_t graph, unsigned long long) {
  *exec = new gpu_emulated_graph(*graph);
  return gpuSuccess;
}
inline gpuError_t gpuGraphLaunch(gpuGraphExec_t exec, gpuStream_t stream) {
  if (stream != nullptr && stream->capture != nullptr) return gpuErrorStreamCaptureUnsupported;
  for (const std::function<void()>& node : exec->nodes) node();
  return gpuSuccess;
}
inline gpuError_t gpuGraphDestroy(gpuGraph_t graph) {
  delete graph;
  return gpuSuccess;
}
inline gpuError_t gpuGraphExecDestroy(gpuGraphExec_t exec) {
  delete exec;
  return gpuSuccess;
}
// Every call completes before it returns: an event marks nothing still to wait for.
struct gpu_emulated_event {};
using gpuEvent_t = gpu_emulated_event*;
inline constexpr unsigned gpuEventDisableTiming = 2;
inline gpuError_t gpuEventCreateWithFlags(gpuEvent_t* event, unsigned) {
  *event = new gpu_emulated_event();
  return gpuSuccess;
}
inline gpuError_t gpuEventDestroy(gpuEvent_t event) {
  delete event;
  return gpuSuccess;
}
inline gpuError_t gpuEventRecord(gpuEvent_t event, gpuStream_t) {
  if (event == nullptr) return gpuErrorInvalidValue;
  return pdserve::kernels::gpu::simt::capture_allows_call() ? gpuSuccess : gpuErrorStreamCaptureUnsupported;
}
inline gpuError_t gpuEventSynchronize(gpuEvent_t event) { return event != nullptr ? gpuSuccess : gpuErrorInvalidValue; }
inline gpuError_t gpuHostRegister(void*, size_t, unsigned) { return gpuSuccess; }
inline gpuError_t gpuHostUnregister(void*) { return gpuSuccess; }
template <typename T>
gpuError_t gpuMalloc(T** ptr, size_t bytes) {
  if (!pdserve::kernels::gpu::simt::capture_allows_call()) return gpuErrorStreamCaptureUnsupported;
  *ptr = static_cast<T*>(std::calloc(1, bytes > 0 ? bytes : 1));
  return *ptr != nullptr ? gpuSuccess : gpuErrorMemoryAllocation;
}
inline gpuError_t gpuFree(void* ptr) {
  std::free(ptr);
  return gpuSuccess;
}
inline gpuError_t gpuMemset(void* ptr, int value, size_t bytes) {
  if (!pdserve::kernels::gpu::simt::capture_allows_call()) return gpuErrorStreamCaptureUnsupported;
  std::memset(ptr, value, bytes);
  return gpuSuccess;
}
inline gpuError_t gpuMemcpy(void* dst, const void* src, size_t bytes, gpuMemcpyKind) {
  if (!pdserve::kernels::gpu::simt::capture_allows_call()) return gpuErrorStreamCaptureUnsupported;
  std::memmove(dst, src, bytes);
  return gpuSuccess;
}
// `rows` rows of `width` bytes, each `src_pitch` apart in the source and `dst_pitch` in the
// destination (cudaMemcpy2D).
inline gpuError_t gpuMemcpy2D(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t width,
                              size_t rows, gpuMemcpyKind) {
  if (!pdserve::kernels::gpu::simt::capture_allows_call()) return gpuErrorStreamCaptureUnsupported;
  for (size_t r = 0; r < rows; ++r)
    std::memmove(static_cast<char*>(dst) + r * dst_pitch, static_cast<const char*>(src) + r * src_pitch, width);
  return gpuSuccess;
}
// On a stream another thread captures, recorded, as a GPU records every thread's work there (the
// capturing thread's own are refused above).
inline bool gpu_emulated_records_for_another_thread(gpuStream_t stream) {
  return stream != nullptr && stream->capture != nullptr && pdserve::kernels::gpu::simt::capturing != stream;
}
inline gpuError_t gpuMemsetAsync(void* ptr, int value, size_t bytes, gpuStream_t stream) {
  if (gpu_emulated_records_for_another_thread(stream)) {
    stream->capture->nodes.push_back([=] { std::memset(ptr, value, bytes); });
    return gpuSuccess;
  }
  return gpuMemset(ptr, value, bytes);
}
inline gpuError_t gpuMemcpyAsync(void* dst, const void* src, size_t bytes, gpuMemcpyKind kind, gpuStream_t stream) {
  if (gpu_emulated_records_for_another_thread(stream)) {
    stream->capture->nodes.push_back([=] { std::memmove(dst, src, bytes); });
    return gpuSuccess;
  }
  return gpuMemcpy(dst, src, bytes, kind);
}

// Lets `kernel` launch with `bytes` of dynamic shared memory, up to a GPU's most.
template <typename... Params>
gpuError_t allow_dynamic_shared(void (*kernel)(Params...), size_t bytes) {
  namespace simt = pdserve::kernels::gpu::simt;
  if (bytes > simt::kMaxDynamicShared) return gpuErrorInvalidValue;
  simt::allow_shared(reinterpret_cast<const void*>(kernel), bytes);
  return gpuSuccess;
}

// kernel<<<grid, block, shared_bytes, stream>>>(args...): run now, or recorded on a capturing
// stream with copies of its arguments.
template <typename... Params, typename... Args>
void gpu_launch(void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared_bytes, gpuStream_t stream,
                Args&&... args) {
  pdserve::kernels::gpu::simt::check_shared(reinterpret_cast<const void*>(kernel), shared_bytes);
  if (stream != nullptr && stream->capture != nullptr) {
    stream->capture->nodes.push_back(
        [=, ... a = args] { pdserve::kernels::gpu::simt::launch(grid, block, shared_bytes, [&] { kernel(a...); }); });
    return;
  }
  pdserve::kernels::gpu::simt::launch(grid, block, shared_bytes, [&] { kernel(args...); });
}
