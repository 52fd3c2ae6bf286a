// make_backend: the engine selects its ranks' backend by name, so that workers and tools take a
// --device flag without knowing which backends this build has. GPU backends (and the emulated
// one) come from the library engine/gpu_module.h loads on first use.
#include "engine/backend.h"

#include "absl/strings/str_join.h"
#include "engine/gpu_module.h"

namespace pdserve::engine {

std::vector<std::string> backend_kinds() {
#if defined(PDSERVE_GPU_KIND)
  return {"cpu", PDSERVE_GPU_KIND, "emulated"};
#else
  return {"cpu", "emulated"};
#endif
}

Status check_cpu_threads(int threads) {
  if (threads >= 1 && threads <= kMaxCpuThreads) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("--cpu-threads must be in [1, ", kMaxCpuThreads, "], not ", threads));
}

StatusOr<std::unique_ptr<Backend>> make_backend(std::string_view kind, int device, CpuThreading cpu) {
  PD_RETURN_IF_ERROR(check_cpu_threads(cpu.threads));
  if (kind == "cpu") return make_cpu_backend(cpu);
  if (cpu.threads != 1)
    return absl::InvalidArgumentError(absl::StrCat("--cpu-threads ", cpu.threads, " is for the cpu backend: the ",
                                                   std::string(kind), " backend's kernels run on its device"));
#if defined(PDSERVE_GPU_KIND)
  const bool from_module = kind == PDSERVE_GPU_KIND || kind == "emulated";
#else
  const bool from_module = kind == "emulated";
#endif
  if (from_module) {
    PD_ASSIGN_OR_RETURN(const GpuBackendApi* gpu, load_gpu_module(kind));
    return gpu->make_backend(device);
  }
  if (kind == "cuda" || kind == "hip")
    return absl::UnimplementedError(absl::StrCat("this build has no ", std::string(kind), " backend (configure with -DPDSERVE_WITH_",
                                                 kind == "cuda" ? "CUDA" : "HIP", "=ON)"));
  return absl::InvalidArgumentError(absl::StrCat("unknown backend \"", std::string(kind), "\" (known: ",
                                                 absl::StrJoin(backend_kinds(), ", "), ")"));
}

}  // namespace pdserve::engine
