// JSON in and out of template values: request messages and tools (nlohmann::json) become
// Values, and the `tojson` filter writes a Value exactly as Python's json.dumps does with
// transformers' arguments (ensure_ascii off by default, indent, separators, sort_keys), since
// tool definitions reach the prompt through it and must match byte for byte.
#pragma once

#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "engine/jinja/value.h"

namespace pdserve::jinja {

// Objects keep their key order (ordered_json), as Python's json.loads does: tojson writes them back in it.
Value from_json(const nlohmann::ordered_json& j);

struct JsonDumpOptions {
  std::optional<std::string> indent;  // Absent: one line. Python's indent=N is N spaces.
  std::string item_separator = ", ";  // Python's default; "," when indenting.
  std::string key_separator = ": ";
  bool ensure_ascii = false;
  bool sort_keys = false;
};

// json.dumps(value, ...); undefined, namespaces and callables are not serializable (an error
// naming the type, as Python's TypeError does).
StatusOr<std::string> dump_json(const Value& v, const JsonDumpOptions& options);

}  // namespace pdserve::jinja
