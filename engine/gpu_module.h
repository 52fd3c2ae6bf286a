// Loading the GPU backend library (pdserve_gpu_backend) on first use, so that processes that
// never ask for a GPU never load the vendor libraries it links (cuBLAS and NCCL take about half
// a second to load; every worker, router and CLI start would pay it).
#pragma once

#include "common/status.h"
#include "engine/gpu_backend.h"

namespace pdserve::engine {

// The library's entry points, loaded once per process. Looked for at $PDSERVE_GPU_BACKEND (a
// path), then as libpdserve_gpu_backend.so on the loader's path (LD_LIBRARY_PATH, ...), then
// beside the executable and in its ../lib, then where this build made it. Unavailable, naming
// every place tried and the loader's reason, when it is not found or does not load.
StatusOr<const GpuBackendApi*> load_gpu_module();

}  // namespace pdserve::engine
