#include "engine/tokenizer/json_fields.h"

#include <cstdint>

#include <nlohmann/json.hpp>

namespace pdserve::engine::json_fields {
namespace {

Status malformed(std::string_view key, std::string_view expected, const Json& value) {
  std::string shown = value.dump();
  if (shown.size() > 60) shown = shown.substr(0, 60) + "...";
  return absl::InvalidArgumentError(
      absl::StrCat("\"", std::string(key), "\" must be ", std::string(expected), ", not ", shown));
}

}  // namespace

StatusOr<const Json*> member(const Json& node, std::string_view key) {
  if (!node.is_object()) return malformed(key, "a member of an object", node);
  const auto it = node.find(key);
  if (it == node.end()) return absl::InvalidArgumentError(absl::StrCat("missing \"", std::string(key), "\""));
  return &*it;
}

StatusOr<std::string> type_of(const Json& node, std::string_view what) {
  if (!node.is_object()) return malformed(what, "an object", node);
  const auto it = node.find("type");
  if (it == node.end() || !it->is_string()) {
    return absl::InvalidArgumentError(absl::StrCat(std::string(what), " has no \"type\" string"));
  }
  return it->get<std::string>();
}

StatusOr<std::string> string_member(const Json& node, std::string_view key) {
  PD_ASSIGN_OR_RETURN(const Json* value, member(node, key));
  if (!value->is_string()) return malformed(key, "a string", *value);
  return value->get<std::string>();
}

StatusOr<std::optional<std::string>> optional_string(const Json& node, std::string_view key) {
  if (!node.is_object()) return malformed(key, "a member of an object", node);
  const auto it = node.find(key);
  if (it == node.end() || it->is_null()) return std::optional<std::string>();
  if (!it->is_string()) return malformed(key, "a string or null", *it);
  return std::optional<std::string>(it->get<std::string>());
}

StatusOr<bool> bool_member(const Json& node, std::string_view key, bool default_value) {
  if (!node.is_object()) return malformed(key, "a member of an object", node);
  const auto it = node.find(key);
  if (it == node.end() || it->is_null()) return default_value;
  if (!it->is_boolean()) return malformed(key, "true or false", *it);
  return it->get<bool>();
}

StatusOr<int> int_member(const Json& node, std::string_view key, int default_value) {
  if (!node.is_object()) return malformed(key, "a member of an object", node);
  const auto it = node.find(key);
  if (it == node.end() || it->is_null()) return default_value;
  if (it->is_number_unsigned() && it->get<uint64_t>() <= uint64_t(INT32_MAX)) {
    return int(it->get<uint64_t>());
  }
  if (it->is_number_integer()) {
    const int64_t v = it->get<int64_t>();
    if (v >= INT32_MIN && v <= INT32_MAX) return int(v);
  }
  return malformed(key, "an integer", *it);
}

StatusOr<double> number(const Json& value, std::string_view what) {
  if (!value.is_number()) return malformed(what, "a number", value);
  return value.get<double>();
}

StatusOr<int> token_id(const Json& value, std::string_view what) {
  if (value.is_number_unsigned()) {
    if (value.get<uint64_t>() < uint64_t(kMaxTokenIds)) return int(value.get<uint64_t>());
  } else if (value.is_number_integer()) {
    const int64_t v = value.get<int64_t>();
    if (v >= 0 && v < kMaxTokenIds) return int(v);
  }
  return malformed(what, "an integer in [0, 2^22)", value);
}

StatusOr<const Json*> array_member(const Json& node, std::string_view key) {
  PD_ASSIGN_OR_RETURN(const Json* value, member(node, key));
  if (!value->is_array()) return malformed(key, "an array", *value);
  return value;
}

Status unsupported(std::string_view what, std::string_view type) {
  return absl::UnimplementedError(absl::StrCat("unsupported ", std::string(what), " ", std::string(type)));
}

}  // namespace pdserve::engine::json_fields
