#include "engine/gpu_module.h"

#include <dlfcn.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <string>
#include <vector>

#include "absl/strings/str_join.h"

namespace pdserve::engine {
namespace {

constexpr const char* kLibrary = "libpdserve_gpu_backend.so";

std::vector<std::string> candidates() {
  std::vector<std::string> out;
  if (const char* env = std::getenv("PDSERVE_GPU_BACKEND"); env != nullptr && *env != '\0') out.push_back(env);
  out.push_back(kLibrary);
  std::error_code ec;
  const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    out.push_back((exe.parent_path() / kLibrary).string());
    out.push_back((exe.parent_path().parent_path() / "lib" / kLibrary).string());
  }
#if defined(PDSERVE_GPU_BACKEND_BUILD_PATH)
  out.push_back(PDSERVE_GPU_BACKEND_BUILD_PATH);
#endif
  return out;
}

StatusOr<const GpuBackendApi*> load() {
  std::vector<std::string> failures;
  for (const std::string& path : candidates()) {
    void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      const char* why = dlerror();  // Names the path.
      failures.push_back(why != nullptr ? why : absl::StrCat(path, ": not loadable"));
      continue;
    }
    // Kept loaded for the life of the process: backends and communicators made by it live on.
    using ApiFn = const GpuBackendApi* (*)();
    auto api_fn = reinterpret_cast<ApiFn>(dlsym(handle, "pdserve_gpu_backend_api"));
    const GpuBackendApi* api = api_fn != nullptr ? api_fn() : nullptr;
    if (api == nullptr || api->version != GpuBackendApi::kVersion)
      return absl::FailedPreconditionError(absl::StrCat(path, " is not a pdserve GPU backend of this version"));
    return api;
  }
  return absl::UnavailableError(
      absl::StrCat("cannot load the GPU backend library: ", absl::StrJoin(failures, "; ")));
}

}  // namespace

StatusOr<const GpuBackendApi*> load_gpu_module() {
  static std::once_flag once;
  static StatusOr<const GpuBackendApi*> loaded = absl::UnknownError("not loaded");
  std::call_once(once, [] { loaded = load(); });
  return loaded;
}

}  // namespace pdserve::engine
