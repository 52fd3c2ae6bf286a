#include "engine/model/model_resolver.h"

#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <httplib.h>

#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "engine/model/sha256.h"

namespace pdserve::engine {
namespace {

namespace fs = std::filesystem;

constexpr int kConnectTimeoutSeconds = 3;
constexpr int kReadTimeoutSeconds = 60;

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

// Splits "scheme://host[:port]/path" into "scheme://host[:port]" and "/path".
StatusOr<std::pair<std::string, std::string>> split_url(const std::string& url) {
  size_t scheme_end = url.find("://");
  if (scheme_end == std::string::npos) return absl::InvalidArgumentError(absl::StrCat("bad URL ", url));
  size_t path_start = url.find('/', scheme_end + 3);
  if (path_start == std::string::npos) return std::make_pair(url, std::string("/"));
  return std::make_pair(url.substr(0, path_start), url.substr(path_start));
}

// Downloads `url` to `dest` via a temporary file beside it, checking the SHA-256 first.
Status download(const std::string& url, const std::string& sha256, const fs::path& dest,
                const std::string& model) {
  auto cannot = [&](const std::string& why) {
    return absl::UnavailableError(absl::StrCat(
        "cannot download ", url, " (", why, "); set PDSERVE_MODEL_PATH to a directory holding ",
        model, "/ or put the files in ", dest.parent_path().string()));
  };
  PD_ASSIGN_OR_RETURN(auto parts, split_url(url));
  httplib::Client client(parts.first);
  if (!client.is_valid()) return cannot("unsupported URL");
  client.set_follow_location(true);
  client.set_connection_timeout(kConnectTimeoutSeconds, 0);
  client.set_read_timeout(kReadTimeoutSeconds, 0);
  client.enable_server_certificate_verification(true);

  // A unique temporary name lets concurrent processes download the same file safely; the
  // rename is atomic, so the destination is either absent or complete and verified.
  static std::atomic<int> counter{0};
  const fs::path tmp = dest.parent_path() /
      absl::StrCat(".", dest.filename().string(), ".", ::getpid(), ".", counter++, ".part");
  std::ofstream out(tmp, std::ios::binary);
  if (!out) return absl::PermissionDeniedError(absl::StrCat("cannot create ", tmp.string()));
  Sha256 hash;
  int status = 0;
  httplib::Result res = client.Get(
      parts.second,
      [&](const httplib::Response& r) {
        status = r.status;
        return r.status == 200;
      },
      [&](const char* data, size_t n) {
        hash.update(data, n);
        out.write(data, std::streamsize(n));
        return bool(out);
      });
  out.close();
  auto fail = [&](Status s) {
    std::error_code ec;
    fs::remove(tmp, ec);
    return s;
  };
  if (status != 0 && status != 200) return fail(cannot(absl::StrCat("HTTP status ", status)));
  if (!res) return fail(cannot(absl::StrCat("network error: ", httplib::to_string(res.error()))));
  if (!out) return fail(absl::DataLossError(absl::StrCat("writing ", tmp.string(), " failed")));
  std::string digest = hash.hex_digest();
  if (digest != sha256)
    return fail(absl::DataLossError(absl::StrCat("checksum mismatch for ", url, ": expected sha256 ",
                                                 sha256, ", got ", digest, "; the download was deleted")));
  std::error_code ec;
  fs::rename(tmp, dest, ec);
  if (ec) return fail(absl::PermissionDeniedError(absl::StrCat("cannot move into ", dest.string(), ": ", ec.message())));
  return absl::OkStatus();
}

}  // namespace

const ModelRegistry& ModelRegistry::builtin() {
  static const ModelRegistry* registry = [] {
    auto* r = new ModelRegistry;
    r->add({"stories260K",
            "https://huggingface.co/karpathy/tinyllamas/resolve/main/stories260K",
            {{"stories260K.bin", "b0a507e7ad0f626624f17112325e66691f9076d622e1d3274d103d00299f2696"},
             {"tok512.bin", "037cb335abb25d1fa9e8ecae30ed2a3a8ace9302862ebcdc05d51a6bbb10c312"}}});
    return r;
  }();
  return *registry;
}

const KnownModel* ModelRegistry::find(const std::string& name) const {
  for (const KnownModel& m : models_)
    if (m.name == name) return &m;
  return nullptr;
}

std::vector<std::string> ModelRegistry::names() const {
  std::vector<std::string> out;
  for (const KnownModel& m : models_) out.push_back(m.name);
  return out;
}

std::string model_cache_dir() {
  std::string base = env("XDG_CACHE_HOME");
  if (base.empty()) base = (fs::path(env("HOME").empty() ? "/tmp" : env("HOME")) / ".cache").string();
  return (fs::path(base) / "pdserve" / "models").string();
}

StatusOr<std::string> resolve_model(const std::string& name, const ResolveOptions& options) {
  // A name becomes a path component below; anything that could escape the directory is not a name.
  if (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos)
    return absl::InvalidArgumentError(absl::StrCat("'", name, "' is neither an existing path nor a model name"));
  std::error_code ec;
  for (absl::string_view dir : absl::StrSplit(env("PDSERVE_MODEL_PATH"), ':', absl::SkipEmpty())) {
    fs::path candidate = fs::path(std::string(dir)) / name;
    if (fs::is_directory(candidate, ec)) return candidate.string();
  }
  const ModelRegistry& registry = options.registry ? *options.registry : ModelRegistry::builtin();
  const KnownModel* model = registry.find(name);
  if (!model)
    return absl::NotFoundError(absl::StrCat(
        "no model or file named '", name, "'; known models: ", absl::StrJoin(registry.names(), ", "),
        " (PDSERVE_MODEL_PATH and ", model_cache_dir(), " are searched for <name>/ directories)"));

  const fs::path dir = fs::path(model_cache_dir()) / name;
  std::vector<const RemoteFile*> missing;
  for (const RemoteFile& f : model->files)
    if (!fs::is_regular_file(dir / f.name, ec)) missing.push_back(&f);
  if (missing.empty()) return dir.string();
  if (!options.allow_download)
    return absl::NotFoundError(absl::StrCat("model ", name, " is not in PDSERVE_MODEL_PATH or ",
                                            dir.string(), ", and downloading is disabled"));
  fs::create_directories(dir, ec);
  if (ec) return absl::PermissionDeniedError(absl::StrCat("cannot create ", dir.string(), ": ", ec.message()));
  std::string base = env("PDSERVE_MODEL_BASE_URL");
  while (!base.empty() && base.back() == '/') base.pop_back();
  for (const RemoteFile* f : missing) {
    std::string url = base.empty() ? absl::StrCat(model->home_url, "/", f->name)
                                   : absl::StrCat(base, "/", name, "/", f->name);
    PD_RETURN_IF_ERROR(download(url, f->sha256, dir / f->name, name));
  }
  return dir.string();
}

}  // namespace pdserve::engine
