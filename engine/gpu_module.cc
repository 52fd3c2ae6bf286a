#include "engine/gpu_module.h"

#include <dlfcn.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "absl/strings/str_join.h"
#include "engine/backends/gpu/gpu_abi_id.h"

namespace pdserve::engine {
namespace {

std::vector<std::string> candidates(std::string_view kind) {
  const bool emulated = kind == "emulated";
  const std::string library = emulated ? "libpdserve_gpu_backend_emulated.so" : "libpdserve_gpu_backend.so";
  std::vector<std::string> out;
  if (const char* env = std::getenv("PDSERVE_GPU_BACKEND"); !emulated && env != nullptr && *env != '\0')
    out.push_back(env);
  out.push_back(library);
  std::error_code ec;
  const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    out.push_back((exe.parent_path() / library).string());
    out.push_back((exe.parent_path().parent_path() / "lib" / library).string());
  }
#if defined(PDSERVE_GPU_BACKEND_BUILD_PATH)
  if (!emulated) out.push_back(PDSERVE_GPU_BACKEND_BUILD_PATH);
#endif
#if defined(PDSERVE_EMULATED_GPU_BACKEND_BUILD_PATH)
  if (emulated) out.push_back(PDSERVE_EMULATED_GPU_BACKEND_BUILD_PATH);
#endif
  return out;
}

StatusOr<const GpuBackendApi*> load(std::string_view kind) {
  std::vector<std::string> failures;
  for (const std::string& path : candidates(kind)) {
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
    if (api->abi_id == nullptr || std::string_view(api->abi_id) != PDSERVE_GPU_ABI_ID)
      return absl::FailedPreconditionError(absl::StrCat(
          path, " was built from other engine headers (ABI id ", api->abi_id ? api->abi_id : "none",
          ", this engine's ", PDSERVE_GPU_ABI_ID, "): rebuild it with this engine"));
    if (api->kind() != kind)
      return absl::FailedPreconditionError(
          absl::StrCat(path, " is the ", std::string(api->kind()), " backend, not ", std::string(kind)));
    return api;
  }
  return absl::UnavailableError(absl::StrCat("cannot load the ", std::string(kind),
                                             " backend library: ", absl::StrJoin(failures, "; ")));
}

}  // namespace

StatusOr<const GpuBackendApi*> load_gpu_module(std::string_view kind) {
  static std::mutex mu;
  static std::map<std::string, StatusOr<const GpuBackendApi*>, std::less<>> loaded;
  std::lock_guard lock(mu);
  auto it = loaded.find(kind);
  if (it == loaded.end()) it = loaded.emplace(std::string(kind), load(kind)).first;
  return it->second;
}

}  // namespace pdserve::engine
