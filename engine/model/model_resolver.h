// Turning a model name ("stories260K") into a local directory: the directories in
// PDSERVE_MODEL_PATH, then the user cache, then a download from the model's public home
// (checked against published SHA-256 digests) into the cache.
#pragma once

#include <string>
#include <vector>

#include "common/status.h"

namespace pdserve::engine {

struct RemoteFile {
  std::string name;    // File name inside the model directory.
  std::string sha256;  // Lowercase hex digest the download must match.
};

struct KnownModel {
  std::string name;
  std::string home_url;  // Each file is fetched from home_url + "/" + file name.
  std::vector<RemoteFile> files;
};

// The models that can be fetched by name. Tests build their own to point at a local server.
class ModelRegistry {
 public:
  // The built-in registry: stories260K.
  static const ModelRegistry& builtin();

  void add(KnownModel model) { models_.push_back(std::move(model)); }
  const KnownModel* find(const std::string& name) const;
  std::vector<std::string> names() const;

 private:
  std::vector<KnownModel> models_;
};

struct ResolveOptions {
  bool allow_download = true;
  const ModelRegistry* registry = nullptr;  // nullptr: ModelRegistry::builtin().
};

// The directory holding model `name`, searched in order:
//  1. `<dir>/<name>/` for each dir in PDSERVE_MODEL_PATH (colon-separated), any name;
//  2. the cache, `$XDG_CACHE_HOME/pdserve/models/<name>` (default `~/.cache/...`), when it
//     holds every file of a registered model;
//  3. a download of each missing file of a registered model into the cache. The URL is
//     `<home_url>/<file>`, or `$PDSERVE_MODEL_BASE_URL/<name>/<file>` when that is set.
// NotFound for unknown names (listing the known ones); Unavailable when the download fails
// (connection timeout of a few seconds); DataLoss on a checksum mismatch (the file is deleted).
StatusOr<std::string> resolve_model(const std::string& name, const ResolveOptions& options = {});

// The cache root: `$XDG_CACHE_HOME/pdserve/models` or `$HOME/.cache/pdserve/models`.
std::string model_cache_dir();

}  // namespace pdserve::engine
