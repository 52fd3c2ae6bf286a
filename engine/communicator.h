// Collective operations between the tensor-parallel ranks of one engine. The CPU engine's
// ranks are threads of one process and share memory; NCCL/RCCL implementations come with the
// GPU backends. Every rank of a group calls each collective in the same order.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

namespace pdserve::engine {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Sums `count` floats element-wise over all ranks; every rank gets the same result (summed
  // in rank order, so it is bit-identical on every rank and from run to run).
  virtual void all_reduce_sum(float* buffer, int64_t count) = 0;
  // Concatenates each rank's `count` floats (rank order) into `out` on every rank.
  virtual void all_gather(const float* in, int64_t count, float* out) = 0;
  // Copies `count` ints from `root`'s buffer into every other rank's (each passes its own).
  virtual void broadcast(int* buffer, int64_t count, int root) = 0;
  // Ends the process with the reason if a collective queued so far failed where the caller could
  // not see it (NCCL's asynchronous errors); barrier() checks as well. Does not wait.
  virtual void check_async_errors() = 0;
  // Waits until every rank has arrived.
  virtual void barrier() = 0;
};

// A group of `size` in-process communicators (one per rank thread) over shared memory.
std::vector<std::unique_ptr<Communicator>> make_shared_memory_group(int size);

}  // namespace pdserve::engine
