// make_backend: the engine selects its ranks' backend by name, so that workers and tools take a
// --device flag without knowing which backends this build has. GPU backends come from the
// library engine/gpu_module.h loads on first use.
#include "engine/backend.h"

#include "absl/strings/str_join.h"

#if defined(PDSERVE_GPU_KIND)
#include "engine/gpu_module.h"
#endif

namespace pdserve::engine {

std::vector<std::string> backend_kinds() {
#if defined(PDSERVE_GPU_KIND)
  return {"cpu", PDSERVE_GPU_KIND};
#else
  return {"cpu"};
#endif
}

StatusOr<std::unique_ptr<Backend>> make_backend(std::string_view kind, int device) {
  if (kind == "cpu") return make_cpu_backend();
#if defined(PDSERVE_GPU_KIND)
  if (kind == PDSERVE_GPU_KIND) {
    PD_ASSIGN_OR_RETURN(const GpuBackendApi* gpu, load_gpu_module());
    return gpu->make_backend(device);
  }
#endif
  if (kind == "cuda" || kind == "hip")
    return absl::UnimplementedError(absl::StrCat("this build has no ", std::string(kind), " backend (configure with -DPDSERVE_WITH_",
                                                 kind == "cuda" ? "CUDA" : "HIP", "=ON)"));
  return absl::InvalidArgumentError(absl::StrCat("unknown backend \"", std::string(kind), "\" (known: ",
                                                 absl::StrJoin(backend_kinds(), ", "), ")"));
}

}  // namespace pdserve::engine
