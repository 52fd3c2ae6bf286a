// make_backend: the engine selects its ranks' backend by name, so that workers and tools take a
// --device flag without knowing which backends this build has.
#include "engine/backend.h"

#include "absl/strings/str_join.h"

#if defined(PDSERVE_HAVE_CUDA_BACKEND)
#include "engine/cuda_backend.h"
#endif

namespace pdserve::engine {

std::vector<std::string> backend_kinds() {
#if defined(PDSERVE_HAVE_CUDA_BACKEND)
  return {"cpu", "cuda"};
#else
  return {"cpu"};
#endif
}

StatusOr<std::unique_ptr<Backend>> make_backend(std::string_view kind, int device) {
  if (kind == "cpu") return make_cpu_backend();
  if (kind == "cuda") {
#if defined(PDSERVE_HAVE_CUDA_BACKEND)
    return make_cuda_backend(device);
#else
    return absl::UnimplementedError("this build has no CUDA backend (configure with -DPDSERVE_WITH_CUDA=ON)");
#endif
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown backend \"", std::string(kind), "\" (known: ",
                                                 absl::StrJoin(backend_kinds(), ", "), ")"));
}

}  // namespace pdserve::engine
