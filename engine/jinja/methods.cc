// The str and dict methods templates call (engine/jinja/builtins.h), with Python's
// signatures. Lists have none: the sandbox transformers renders in forbids mutating them.
#include "engine/jinja/builtins.h"

#include "engine/jinja/py_string.h"

namespace pdserve::jinja {
namespace {

StatusOr<std::optional<std::string>> optional_string(const std::optional<Value>& v, const std::string& what) {
  if (!v || v->is_none()) return std::optional<std::string>();
  if (!v->is_string()) return absl::InvalidArgumentError(absl::StrCat(what, " must be a string or None"));
  return std::optional<std::string>(v->as_string());
}

StatusOr<int64_t> optional_int(const std::optional<Value>& v, int64_t fallback, const std::string& what) {
  if (!v || v->is_none()) return fallback;
  if (!v->is_int()) return absl::InvalidArgumentError(absl::StrCat(what, " must be an integer"));
  return v->as_int();
}

// startswith/endswith take a string or a tuple of strings.
StatusOr<bool> affix_matches(const std::string& s, const Value& affix, bool prefix, const std::string& what) {
  std::vector<Value> options;
  if (affix.is_list()) options = affix.as_list();
  else options.push_back(affix);
  for (const Value& o : options) {
    if (!o.is_string()) return absl::InvalidArgumentError(absl::StrCat(what, " takes a string or a tuple of strings"));
    const std::string& a = o.as_string();
    if (a.size() <= s.size() && (prefix ? s.compare(0, a.size(), a) == 0 : s.compare(s.size() - a.size(), a.size(), a) == 0))
      return true;
  }
  return false;
}

StatusOr<Value> string_method(const std::string& s, const std::string& name, const CallArgs& args) {
  const std::string fn = "str." + name + "()";
  auto strings = [](std::vector<std::string> parts) {
    std::vector<Value> out;
    for (std::string& p : parts) out.push_back(Value::string(std::move(p)));
    return Value::list(std::move(out));
  };
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    PD_ASSIGN_OR_RETURN(auto p, bind_arguments(fn, args, {"chars"}));
    PD_ASSIGN_OR_RETURN(auto chars, optional_string(p[0], fn));
    const StripSide side = name == "strip" ? StripSide::kBoth : name == "lstrip" ? StripSide::kLeft : StripSide::kRight;
    return Value::string(py_strip(s, side, chars));
  }
  if (name == "split") {
    PD_ASSIGN_OR_RETURN(auto p, bind_arguments(fn, args, {"sep", "maxsplit"}));
    PD_ASSIGN_OR_RETURN(auto sep, optional_string(p[0], fn));
    PD_ASSIGN_OR_RETURN(int64_t maxsplit, optional_int(p[1], -1, fn));
    if (sep && sep->empty()) return absl::InvalidArgumentError("str.split(): empty separator");
    return strings(py_split(s, sep, maxsplit));
  }
  if (name == "splitlines") {
    PD_ASSIGN_OR_RETURN(auto p, bind_arguments(fn, args, {}));
    return strings(py_splitlines(s));
  }
  if (name == "startswith" || name == "endswith") {
    PD_ASSIGN_OR_RETURN(auto p, bind_arguments(fn, args, {"affix"}));
    if (!p[0]) return absl::InvalidArgumentError(absl::StrCat(fn, " needs an argument"));
    PD_ASSIGN_OR_RETURN(bool match, affix_matches(s, *p[0], name == "startswith", fn));
    return Value::boolean(match);
  }
  if (name == "replace") {
    PD_ASSIGN_OR_RETURN(auto p, bind_arguments(fn, args, {"old", "new", "count"}));
    if (!p[0] || !p[1] || !p[0]->is_string() || !p[1]->is_string())
      return absl::InvalidArgumentError(absl::StrCat(fn, " takes two strings"));
    PD_ASSIGN_OR_RETURN(int64_t count, optional_int(p[2], -1, fn));
    return Value::string(py_replace(s, p[0]->as_string(), p[1]->as_string(), count));
  }
  if (name == "upper" || name == "lower" || name == "title" || name == "capitalize") {
    PD_ASSIGN_OR_RETURN(auto p, bind_arguments(fn, args, {}));
    if (name == "upper") return Value::string(py_upper(s));
    if (name == "lower") return Value::string(py_lower(s));
    if (name == "title") return Value::string(py_title(s));
    return Value::string(py_capitalize(s));
  }
  if (name == "find" || name == "count") {
    PD_ASSIGN_OR_RETURN(auto p, bind_arguments(fn, args, {"sub"}));
    if (!p[0] || !p[0]->is_string()) return absl::InvalidArgumentError(absl::StrCat(fn, " takes a string"));
    return Value::integer(name == "find" ? py_find(s, p[0]->as_string()) : py_count(s, p[0]->as_string()));
  }
  if (name == "join") {
    PD_ASSIGN_OR_RETURN(auto p, bind_arguments(fn, args, {"iterable"}));
    if (!p[0]) return absl::InvalidArgumentError(absl::StrCat(fn, " needs an argument"));
    PD_ASSIGN_OR_RETURN(std::vector<Value> items, iterate(*p[0]));
    std::string out;
    for (size_t i = 0; i < items.size(); ++i) {
      if (!items[i].is_string())
        return absl::InvalidArgumentError(absl::StrCat(fn, ": item ", i, " is a ", items[i].type_name(), ", not a str"));
      if (i) out += s;
      out += items[i].as_string();
    }
    return Value::string(std::move(out));
  }
  return absl::InternalError("unreachable string method " + name);
}

StatusOr<Value> dict_method(const Dict& d, const std::string& name, const CallArgs& args) {
  const std::string fn = "dict." + name + "()";
  if (name == "get") {
    PD_ASSIGN_OR_RETURN(auto p, bind_arguments(fn, args, {"key", "default"}));
    if (!p[0]) return absl::InvalidArgumentError(absl::StrCat(fn, " needs a key"));
    if (p[0]->is_string()) {
      if (const Value* v = d.find(p[0]->as_string())) return *v;
    }
    return p[1] ? *p[1] : Value::none();
  }
  PD_ASSIGN_OR_RETURN(auto p, bind_arguments(fn, args, {}));
  std::vector<Value> out;
  for (const auto& [k, v] : d.entries()) {
    if (name == "keys") out.push_back(Value::string(k));
    else if (name == "values") out.push_back(v);
    else out.push_back(Value::list({Value::string(k), v}, /*tuple=*/true));
  }
  return Value::list(std::move(out));
}

bool is_string_method(const std::string& name) {
  static const char* const kNames[] = {"strip", "lstrip",  "rstrip", "split", "splitlines", "startswith", "endswith",
                                       "replace", "upper", "lower", "title", "capitalize", "find", "count", "join"};
  for (const char* n : kNames)
    if (name == n) return true;
  return false;
}

}  // namespace

std::optional<Value> method_of(const Value& object, const std::string& name) {
  if (object.is_string() && is_string_method(name)) {
    const std::string s = object.as_string();
    return Value::callable("str." + name, [s, name](const CallArgs& args) { return string_method(s, name, args); });
  }
  if (object.is_dict() && (name == "items" || name == "keys" || name == "values" || name == "get")) {
    const Value d = object;
    return Value::callable("dict." + name, [d, name](const CallArgs& args) { return dict_method(d.as_dict(), name, args); });
  }
  return std::nullopt;
}

}  // namespace pdserve::jinja
