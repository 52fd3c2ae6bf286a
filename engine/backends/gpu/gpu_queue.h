// What the GPU backend library's communicators need of its backends: the device and stream that
// a backend of make_gpu_backend queues its work on, so that a rank's collectives join that stream
// and are ordered with its kernels by the stream alone, with no host wait (issue 18's R9).
#pragma once

#include <optional>

#include "engine/backend.h"
#include "kernels/gpu/gpu_compat.h"

namespace pdserve::engine {

struct GpuQueue {
  int device = 0;
  gpuStream_t stream = nullptr;
};

// `backend`'s queue; nullopt where it is not a backend of make_gpu_backend (a decorator's, a CPU
// backend's). Marks nothing: a group checks all its ranks before it adopts any.
std::optional<GpuQueue> gpu_queue_of(const Backend& backend);
// Makes `backend` (one gpu_queue_of answers for) the home of a communicator's collectives: from
// then on it waits for its queue before its calls that may synchronize the device inside the
// driver (an allocation, a free, a copy to the host), which a collective in flight could deadlock.
void adopt_gpu_queue(Backend& backend);

}  // namespace pdserve::engine
