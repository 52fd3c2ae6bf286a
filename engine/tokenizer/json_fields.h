// Typed, checked reads of tokenizer.json fields: each returns InvalidArgument naming the field
// when it has the wrong type, so that a malformed file is an error and never an exception or
// undefined behaviour (nlohmann's get<int>() on 5e102 is). Absent or null optional fields
// take their documented default, as the tokenizers library's serde defaults do.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json_fwd.hpp>

#include "common/status.h"

namespace pdserve::engine::json_fields {

using Json = nlohmann::json;

// The object's "type" string.
StatusOr<std::string> type_of(const Json& node, std::string_view what);
// A required member of any type.
StatusOr<const Json*> member(const Json& node, std::string_view key);
StatusOr<std::string> string_member(const Json& node, std::string_view key);
// Absent or null give nullopt.
StatusOr<std::optional<std::string>> optional_string(const Json& node, std::string_view key);
StatusOr<bool> bool_member(const Json& node, std::string_view key, bool default_value);
StatusOr<int> int_member(const Json& node, std::string_view key, int default_value);
StatusOr<double> number(const Json& value, std::string_view what);
// The bound on token ids: vocabularies index dense tables by id, so a file naming id 2^31 - 1
// would make them allocate gigabytes. 2^22 is 16x the largest real vocabulary (Gemma's 262,144).
inline constexpr int kMaxTokenIds = 1 << 22;
// A token id: an integer in [0, kMaxTokenIds).
StatusOr<int> token_id(const Json& value, std::string_view what);
// A required array member.
StatusOr<const Json*> array_member(const Json& node, std::string_view key);

// An unsupported component: Unimplemented, "unsupported <what> <type>".
Status unsupported(std::string_view what, std::string_view type);

}  // namespace pdserve::engine::json_fields
