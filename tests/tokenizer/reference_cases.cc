#include "tests/tokenizer/reference_cases.h"

#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

namespace pdserve::engine::testing {
namespace {

StatusOr<std::string> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  std::ostringstream contents;
  contents << in.rdbuf();
  return contents.str();
}

StatusOr<std::string> string_field(const nlohmann::json& j, const char* key) {
  const auto it = j.find(key);
  if (it == j.end() || !it->is_string()) {
    return absl::InvalidArgumentError(absl::StrCat("field \"", key, "\" is missing or not a string"));
  }
  return it->get<std::string>();
}

}  // namespace

StatusOr<ReferenceCase> parse_reference_case(std::string_view line) {
  // A line's strings are valid UTF-8 by construction; strict parsing would catch a corrupt file.
  const nlohmann::json j = nlohmann::json::parse(line.begin(), line.end(), nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return absl::InvalidArgumentError("not a JSON object");
  ReferenceCase c;
  PD_ASSIGN_OR_RETURN(c.text, string_field(j, "text"));
  PD_ASSIGN_OR_RETURN(c.decoded, string_field(j, "decoded"));
  const auto ids = j.find("ids");
  if (ids == j.end() || !ids->is_array()) {
    return absl::InvalidArgumentError("field \"ids\" is missing or not an array");
  }
  for (const nlohmann::json& id : *ids) {
    if (!id.is_number_integer()) return absl::InvalidArgumentError("field \"ids\" holds a non-integer");
    c.ids.push_back(id.get<int>());
  }
  return c;
}

StatusOr<ReferenceManifest> parse_reference_manifest(std::string_view contents) {
  const nlohmann::json j = nlohmann::json::parse(contents.begin(), contents.end(), nullptr, false);
  if (!j.is_object()) return absl::InvalidArgumentError("manifest is not a JSON object");
  ReferenceManifest m;
  PD_ASSIGN_OR_RETURN(m.name, string_field(j, "name"));
  PD_ASSIGN_OR_RETURN(m.package, string_field(j, "package"));
  PD_ASSIGN_OR_RETURN(m.version, string_field(j, "version"));
  PD_ASSIGN_OR_RETURN(m.models_dir, string_field(j, "models_dir"));
  return m;
}

StatusOr<ReferenceManifest> read_reference_manifest(const std::string& dir) {
  const std::string path = dir + "/manifest.json";
  PD_ASSIGN_OR_RETURN(const std::string contents, read_file(path));
  StatusOr<ReferenceManifest> manifest = parse_reference_manifest(contents);
  if (!manifest.ok()) return absl::InvalidArgumentError(absl::StrCat(path, ": ", manifest.status().message()));
  return manifest;
}

StatusOr<std::vector<ReferenceCase>> read_reference_cases(const std::string& dir) {
  const std::string path = dir + "/cases.jsonl";
  PD_ASSIGN_OR_RETURN(const std::string contents, read_file(path));
  std::vector<ReferenceCase> cases;
  std::istringstream lines(contents);
  std::string line;
  for (int number = 1; std::getline(lines, line); ++number) {
    if (line.empty()) continue;
    StatusOr<ReferenceCase> c = parse_reference_case(line);
    if (!c.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(path, ":", number, ": ", c.status().message()));
    }
    cases.push_back(*std::move(c));
  }
  return cases;
}

}  // namespace pdserve::engine::testing
