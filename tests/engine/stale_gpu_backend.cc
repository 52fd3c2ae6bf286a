// A GPU backend library of this API version built from other engine headers: its ABI id is not
// this build's, so the engine must refuse it before calling anything in it (gpu_module_test.cc).
#include "engine/gpu_backend.h"

extern "C" const pdserve::engine::GpuBackendApi* pdserve_gpu_backend_api() {
  static const pdserve::engine::GpuBackendApi api = {
      pdserve::engine::GpuBackendApi::kVersion, "built-from-other-headers",
      [] { return std::string_view("hip"); }, nullptr, nullptr, nullptr};
  return &api;
}
