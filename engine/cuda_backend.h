// The CUDA backend (kernels/gpu through engine::Backend, cuBLAS for the GEMMs) and NCCL
// collectives for tensor-parallel ranks on GPUs. Declared here without any CUDA header so that
// engine code can select the backend by name; defined in pdserve_gpu_backend, which exists only
// in builds with PDSERVE_WITH_CUDA.
#pragma once

#include <memory>
#include <vector>

#include "common/status.h"
#include "engine/backend.h"
#include "engine/communicator.h"

namespace pdserve::engine {

// Number of CUDA devices this process can use (0 when there is no driver or no device).
int cuda_device_count();

// A backend on CUDA device `device`: memory from cudaMalloc, work queued on a stream of its own
// (non-blocking), SGEMM through cuBLAS in full fp32 (no TF32). Every pointer given to its
// kernels must be device memory, including TokenPlacement's positions, block tables (an array
// of device pointers) and block mask, and embed's tokens and rope's positions. The backend may
// be used from any thread; it makes its device current on each call.
StatusOr<std::unique_ptr<Backend>> make_cuda_backend(int device);

// One communicator per rank for `size` ranks on devices 0..size-1 of this process
// (ncclCommInitAll). Buffers are device memory. Each collective waits for the rank's device to
// be idle before it starts and returns when it has finished, so it is ordered with any stream.
// Unimplemented in builds without nccl.h. Unlike the shared-memory group, sums are in NCCL's
// order (identical on every rank, not necessarily run to run across NCCL versions).
StatusOr<std::vector<std::unique_ptr<Communicator>>> make_nccl_group(int size);

}  // namespace pdserve::engine
