// engine::Communicator over NCCL (CUDA) or RCCL (HIP, the same API) for ranks that are GPUs of
// one process (ncclCommInitAll), each collective queued on its rank backend's stream.
#include "engine/backends/gpu/gpu_queue.h"
#include "engine/gpu_backend.h"
#include "kernels/gpu/gpu_compat.h"

#if defined(PDSERVE_HAVE_NCCL)
#if defined(PDSERVE_GPU_HIP)
#include <rccl/rccl.h>
#else
#include <nccl.h>
#endif

#include <cstdio>
#include <cstdlib>
#endif

namespace pdserve::engine {

#if defined(PDSERVE_HAVE_NCCL)
namespace {

// Communicator methods return nothing; a failed collective leaves the ranks out of step, which
// nothing can repair, so it ends the process with the reason.
void check(bool ok, const char* what, const char* reason) {
  if (ok) return;
  std::fprintf(stderr, "pdserve collective %s failed: %s\n", what, reason);
  std::abort();
}
void check_nccl(ncclResult_t r, const char* what) { check(r == ncclSuccess, what, ncclGetErrorString(r)); }
void check_gpu(gpuError_t e, const char* what) { check(e == gpuSuccess, what, gpuGetErrorString(e)); }

// The stream is the rank backend's, which outlives the communicator (RankPool's members go
// runners first, then communicators, then backends).
class GpuCommunicator final : public Communicator {
 public:
  GpuCommunicator(int rank, int size, ncclComm_t comm, gpuStream_t stream)
      : rank_(rank), size_(size), comm_(comm), stream_(stream) {
    check_gpu(gpuSetDevice(rank_), "set device");
    check_gpu(gpuMalloc(reinterpret_cast<void**>(&token_), sizeof(float)), "device allocation");
  }
  ~GpuCommunicator() override {
    (void)gpuSetDevice(rank_);
    ncclCommDestroy(comm_);
    (void)gpuFree(token_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  // Queued behind the kernels that produce `buffer` on the same stream; what reads the result
  // is queued behind it (a host read copies through the stream too).
  void all_reduce_sum(float* buffer, int64_t count) override {
    check_gpu(gpuSetDevice(rank_), "set device");
    check_nccl(ncclAllReduce(buffer, buffer, size_t(count), ncclFloat, ncclSum, comm_, stream_), "all_reduce");
  }
  void all_gather(const float* in, int64_t count, float* out) override {
    check_gpu(gpuSetDevice(rank_), "set device");
    check_nccl(ncclAllGather(in, out, size_t(count), ncclFloat, comm_, stream_), "all_gather");
  }
  void broadcast(int* buffer, int64_t count, int root) override {
    check_gpu(gpuSetDevice(rank_), "set device");
    check_nccl(ncclBroadcast(buffer, buffer, size_t(count), ncclInt32, root, comm_, stream_), "broadcast");
  }
  // The communicator's one host wait: an all-reduce no rank's stream passes before every rank has
  // queued it. NCCL's asynchronous errors are checked there too (a collective that hangs is not
  // one of them).
  void barrier() override {
    all_reduce_sum(token_, 1);
    check_gpu(gpuStreamSynchronize(stream_), "stream synchronize");
    check_async_errors();
  }
  void check_async_errors() override {
    ncclResult_t async = ncclSuccess;
    check_nccl(ncclCommGetAsyncError(comm_, &async), "async error query");
    check_nccl(async, "a collective of this step");
  }

 private:
  int rank_, size_;
  ncclComm_t comm_;
  gpuStream_t stream_;
  float* token_ = nullptr;
};

}  // namespace

StatusOr<std::vector<std::unique_ptr<Communicator>>> make_gpu_group(const std::vector<Backend*>& ranks) {
  const int size = int(ranks.size()), devices = gpu_device_count();
  if (size <= 0 || size > devices)
    return absl::InvalidArgumentError(absl::StrCat("a collective group of ", size, " ranks on ", devices, " GPUs"));
  std::vector<gpuStream_t> streams(size);
  for (int r = 0; r < size; ++r) {
    const std::optional<GpuQueue> queue = ranks[r] == nullptr ? std::nullopt : gpu_queue_of(*ranks[r]);
    if (!queue || queue->device != r)
      return absl::InvalidArgumentError(
          absl::StrCat("rank ", r, " of a GPU collective group is not the GPU backend of device ", r));
    streams[r] = queue->stream;
  }
  std::vector<ncclComm_t> comms(size);
  std::vector<int> device_list(size);
  for (int r = 0; r < size; ++r) device_list[r] = r;
  const ncclResult_t r = ncclCommInitAll(comms.data(), size, device_list.data());
  if (r != ncclSuccess) return absl::InternalError(absl::StrCat("ncclCommInitAll: ", ncclGetErrorString(r)));
  // Every rank checked and the communicators made: only now do the backends drain for them.
  for (Backend* rank : ranks) adopt_gpu_queue(*rank);
  std::vector<std::unique_ptr<Communicator>> group;
  for (int i = 0; i < size; ++i) group.push_back(std::make_unique<GpuCommunicator>(i, size, comms[i], streams[i]));
  return group;
}

#else

StatusOr<std::vector<std::unique_ptr<Communicator>>> make_gpu_group(const std::vector<Backend*>& ranks) {
  return absl::UnimplementedError(
      absl::StrCat("pdserve was built without NCCL/RCCL: TP ", ranks.size(), " needs collectives between GPUs"));
}

#endif

}  // namespace pdserve::engine
