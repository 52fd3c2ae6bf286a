// The GPU backend (kernels/gpu through engine::Backend, the vendor BLAS for the GEMMs) and the
// vendor collectives for tensor-parallel ranks on GPUs, from one source for NVIDIA (CUDA,
// cuBLAS, NCCL) and AMD (HIP, hipBLAS, RCCL). Declared here without any vendor header; defined
// in the shared library pdserve_gpu_backend (builds with PDSERVE_WITH_CUDA or PDSERVE_WITH_HIP),
// which the engine loads only when a GPU backend is asked for (engine/gpu_module.h): the vendor
// libraries take half a second to load, which every process would otherwise pay.
#pragma once

#include <memory>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "engine/backend.h"
#include "engine/communicator.h"

namespace pdserve::engine {

// make_backend's name for this build's GPU backend: "cuda" or "hip" ("emulated" in the CPU
// emulation of the GPU that tests link, kernels/gpu/emulation/simt.h).
std::string_view gpu_backend_kind();

// Number of GPUs this process can use (0 when there is no driver or no device).
int gpu_device_count();

// A backend on GPU `device`: zeroed device memory, work queued on a stream of its own
// (non-blocking), f32 GEMMs through cuBLAS or hipBLAS in full fp32 (no TF32), or the portable
// GEMM (kernels/gpu/gemm.cu) where the build has no hipBLAS. Every pointer given to its kernels
// must be device memory, including TokenPlacement's positions, block tables (an array of device
// pointers) and block mask, and embed's tokens and rope's positions. The backend may be used
// from any thread; it makes its device current on each call.
StatusOr<std::unique_ptr<Backend>> make_gpu_backend(int device);

// One communicator per rank for the backends `ranks`, rank r a make_gpu_backend(r) backend
// (devices 0..size-1 of this process; ncclCommInitAll, RCCL's is the same API). Buffers are device
// memory. A collective is queued on its rank backend's stream — after the kernels queued there
// before it, before those queued after — and returns without waiting for it (no host round trip
// per collective); barrier() returns once every rank has reached it and its stream has run what
// was queued before. Unimplemented in builds without nccl.h / rccl.h; InvalidArgument for a rank
// that is not such a backend (a decorator, another device). Unlike the shared-memory group, sums
// are in the library's order (identical on every rank, not necessarily run to run across
// versions).
StatusOr<std::vector<std::unique_ptr<Communicator>>> make_gpu_group(const std::vector<Backend*>& ranks);

// The library's entry points, as the engine finds them after dlopen. `version` stays the first
// member, so that a library of another layout is told apart before anything else is read.
struct GpuBackendApi {
  static constexpr int kVersion = 4;
  int version = kVersion;
  // PDSERVE_GPU_ABI_ID of the build (engine/backends/gpu/gpu_abi_id.h): the hash of the headers
  // whose types cross this boundary. The engine loads only a library built from its own.
  const char* abi_id = nullptr;
  std::string_view (*kind)() = nullptr;
  int (*device_count)() = nullptr;
  StatusOr<std::unique_ptr<Backend>> (*make_backend)(int device) = nullptr;
  StatusOr<std::vector<std::unique_ptr<Communicator>>> (*make_group)(const std::vector<Backend*>& ranks) = nullptr;
};

}  // namespace pdserve::engine

// The one symbol the engine looks up in the library.
extern "C" const pdserve::engine::GpuBackendApi* pdserve_gpu_backend_api();
