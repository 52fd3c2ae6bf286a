// Loading the GPU backend library (pdserve_gpu_backend) on first use, so that processes that
// never ask for a GPU never load the vendor libraries it links (cuBLAS and NCCL take about half
// a second to load; every worker, router and CLI start would pay it).
#pragma once

#include <string_view>

#include "common/status.h"
#include "engine/gpu_backend.h"

namespace pdserve::engine {

// The entry points of the library for backend `kind`, loaded once per process: "cuda" or "hip"
// from libpdserve_gpu_backend.so, "emulated" (the same backend on the CPU emulation of the GPU,
// kernels/gpu/emulation/simt.h: for tests, slow) from libpdserve_gpu_backend_emulated.so. Looked
// for at $PDSERVE_GPU_BACKEND (a path; for cuda/hip), then by name on the loader's path
// (LD_LIBRARY_PATH, ...), then beside the executable and in its ../lib, then where this build
// made it. Unavailable, naming every place tried and the loader's reason, when it is not found or
// does not load; FailedPrecondition when the library is another kind's, another version's, or
// built from other engine headers (GpuBackendApi::abi_id).
StatusOr<const GpuBackendApi*> load_gpu_module(std::string_view kind);

}  // namespace pdserve::engine
