// make_backend: the engine selects its ranks' backend by name, so that workers and tools take a
// --device flag without knowing which backends this build has.
#include "engine/backend.h"

#include "absl/strings/str_join.h"

#if defined(PDSERVE_HAVE_GPU_BACKEND)
#include "engine/gpu_backend.h"
#endif

namespace pdserve::engine {

std::vector<std::string> backend_kinds() {
#if defined(PDSERVE_HAVE_GPU_BACKEND)
  return {"cpu", std::string(gpu_backend_kind())};
#else
  return {"cpu"};
#endif
}

StatusOr<std::unique_ptr<Backend>> make_backend(std::string_view kind, int device) {
  if (kind == "cpu") return make_cpu_backend();
#if defined(PDSERVE_HAVE_GPU_BACKEND)
  if (kind == gpu_backend_kind()) return make_gpu_backend(device);
#endif
  if (kind == "cuda" || kind == "hip")
    return absl::UnimplementedError(absl::StrCat("this build has no ", std::string(kind), " backend (configure with -DPDSERVE_WITH_",
                                                 kind == "cuda" ? "CUDA" : "HIP", "=ON)"));
  return absl::InvalidArgumentError(absl::StrCat("unknown backend \"", std::string(kind), "\" (known: ",
                                                 absl::StrJoin(backend_kinds(), ", "), ")"));
}

}  // namespace pdserve::engine
