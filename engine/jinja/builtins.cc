// What the filters, tests, methods and the evaluator share: argument binding, value limits,
// iteration and item access (engine/jinja/builtins.h).
#include "engine/jinja/builtins.h"

#include "engine/jinja/py_string.h"

namespace pdserve::jinja {

StatusOr<std::vector<std::optional<Value>>> bind_arguments(const std::string& function, const CallArgs& args,
                                                           const std::vector<std::string>& names) {
  if (args.positional.size() > names.size())
    return absl::InvalidArgumentError(absl::StrCat(function, " takes at most ", names.size(), " argument(s), got ",
                                                   args.positional.size()));
  std::vector<std::optional<Value>> out(names.size());
  for (size_t i = 0; i < args.positional.size(); ++i) out[i] = args.positional[i];
  for (const auto& [key, value] : args.keyword) {
    size_t i = 0;
    while (i < names.size() && names[i] != key) ++i;
    if (i == names.size())
      return absl::InvalidArgumentError(absl::StrCat(function, " got an unexpected keyword argument '", key, "'"));
    if (out[i]) return absl::InvalidArgumentError(absl::StrCat(function, " got multiple values for '", key, "'"));
    out[i] = value;
  }
  return out;
}

Status check_value_size(const Value& v, const ValueLimits& limits) {
  if (v.is_string() && v.as_string().size() > limits.max_string_bytes)
    return absl::ResourceExhaustedError(
        absl::StrCat("a string grew past the template limit of ", limits.max_string_bytes, " bytes"));
  if (v.is_list() && v.as_list().size() > limits.max_list_items)
    return absl::ResourceExhaustedError(
        absl::StrCat("a list grew past the template limit of ", limits.max_list_items, " items"));
  return absl::OkStatus();
}

StatusOr<std::vector<Value>> iterate(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined: return std::vector<Value>{};
    case Value::Kind::kList: return v.as_list();
    case Value::Kind::kDict: {
      std::vector<Value> keys;
      for (const auto& [k, x] : v.as_dict().entries()) keys.push_back(Value::string(k));
      return keys;
    }
    case Value::Kind::kString: {
      std::vector<Value> chars;
      for (std::string& cp : code_points(v.as_string())) chars.push_back(Value::string(std::move(cp)));
      return chars;
    }
    default: return absl::InvalidArgumentError(absl::StrCat("'", v.type_name(), "' object is not iterable"));
  }
}

StatusOr<Value> get_item(const Value& object, const Value& key) {
  if (object.is_undefined())
    return absl::InvalidArgumentError(object.undefined_reason());
  const std::string key_text = key.is_string() ? key.as_string() : to_str(key);
  if (object.is_dict() || object.is_namespace()) {
    const Dict& d = object.is_dict() ? object.as_dict() : object.namespace_attributes();
    if (key.is_string()) {
      if (const Value* found = d.find(key.as_string())) return *found;
    }
  } else if ((object.is_list() || object.is_string()) && (key.is_int() || key.is_bool())) {
    const int64_t i = key.is_bool() ? int64_t(key.as_bool()) : key.as_int();
    if (object.is_list()) {
      const auto& items = object.as_list();
      const int64_t n = int64_t(items.size());
      const int64_t at = i < 0 ? i + n : i;
      if (at >= 0 && at < n) return items[size_t(at)];
    } else {
      const std::vector<std::string> cps = code_points(object.as_string());
      const int64_t n = int64_t(cps.size());
      const int64_t at = i < 0 ? i + n : i;
      if (at >= 0 && at < n) return Value::string(cps[size_t(at)]);
    }
  } else if (object.is_none()) {
    return absl::InvalidArgumentError(absl::StrCat("'None' has no attribute or item '", key_text, "'"));
  }
  if (key.is_string()) {
    if (std::optional<Value> method = method_of(object, key.as_string())) return *method;
  }
  return Value::undefined(absl::StrCat("'", object.type_name(), "' object has no attribute or item '", key_text, "'"));
}

}  // namespace pdserve::jinja
