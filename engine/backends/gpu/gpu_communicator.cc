// engine::Communicator over NCCL (CUDA) or RCCL (HIP, the same API) for ranks that are GPUs of
// one process (ncclCommInitAll).
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

class GpuCommunicator final : public Communicator {
 public:
  GpuCommunicator(int rank, int size, ncclComm_t comm) : rank_(rank), size_(size), comm_(comm) {
    check_gpu(gpuSetDevice(rank_), "set device");
    check_gpu(gpuStreamCreateWithFlags(&stream_, gpuStreamNonBlocking), "stream create");
    check_gpu(gpuMalloc(reinterpret_cast<void**>(&token_), sizeof(float)), "device allocation");
  }
  ~GpuCommunicator() override {
    (void)gpuSetDevice(rank_);
    ncclCommDestroy(comm_);
    (void)gpuFree(token_);
    (void)gpuStreamDestroy(stream_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void all_reduce_sum(float* buffer, int64_t count) override {
    begin();
    check_nccl(ncclAllReduce(buffer, buffer, size_t(count), ncclFloat, ncclSum, comm_, stream_), "all_reduce");
    end();
  }
  void all_gather(const float* in, int64_t count, float* out) override {
    begin();
    check_nccl(ncclAllGather(in, out, size_t(count), ncclFloat, comm_, stream_), "all_gather");
    end();
  }
  void barrier() override { all_reduce_sum(token_, 1); }

 private:
  // The producer of the buffer may be any stream of the device (the backend's is not known
  // here): wait for the whole device before, and for the collective after.
  void begin() {
    check_gpu(gpuSetDevice(rank_), "set device");
    check_gpu(gpuDeviceSynchronize(), "device synchronize");
  }
  void end() { check_gpu(gpuStreamSynchronize(stream_), "stream synchronize"); }

  int rank_, size_;
  ncclComm_t comm_;
  gpuStream_t stream_ = nullptr;
  float* token_ = nullptr;
};

}  // namespace

StatusOr<std::vector<std::unique_ptr<Communicator>>> make_gpu_group(int size) {
  const int devices = gpu_device_count();
  if (size <= 0 || size > devices)
    return absl::InvalidArgumentError(absl::StrCat("a collective group of ", size, " ranks on ", devices, " GPUs"));
  std::vector<ncclComm_t> comms(size);
  std::vector<int> device_list(size);
  for (int r = 0; r < size; ++r) device_list[r] = r;
  const ncclResult_t r = ncclCommInitAll(comms.data(), size, device_list.data());
  if (r != ncclSuccess) return absl::InternalError(absl::StrCat("ncclCommInitAll: ", ncclGetErrorString(r)));
  std::vector<std::unique_ptr<Communicator>> group;
  for (int i = 0; i < size; ++i) group.push_back(std::make_unique<GpuCommunicator>(i, size, comms[i]));
  return group;
}

#else

StatusOr<std::vector<std::unique_ptr<Communicator>>> make_gpu_group(int size) {
  return absl::UnimplementedError(absl::StrCat("pdserve was built without NCCL/RCCL: TP ", size,
                                               " needs collectives between GPUs"));
}

#endif

}  // namespace pdserve::engine
