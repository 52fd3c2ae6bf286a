// The tests (`x is name`, engine/jinja/builtins.h), as jinja2 3.1 defines them. Python's
// rules show through: a bool is a number, and undefined is iterable (as an empty sequence).
#include <cmath>

#include "engine/jinja/builtins.h"

namespace pdserve::jinja {
namespace {

const char* const kTests[] = {"boolean", "callable", "defined", "divisibleby", "eq", "equalto", "even", "false",
                              "float", "ge", "gt", "in", "integer", "iterable", "le", "lt", "mapping", "ne", "none",
                              "number", "odd", "sameas", "sequence", "string", "true", "undefined", "==", "!=",
                              "<", "<=", ">", ">="};

StatusOr<int64_t> integral(const Value& v, const std::string& test) {
  if (v.is_int()) return v.as_int();
  if (v.is_bool()) return int64_t(v.as_bool());
  if (v.is_float() && std::isfinite(v.as_double()) && std::floor(v.as_double()) == v.as_double() &&
      std::fabs(v.as_double()) < 9.2e18)
    return int64_t(v.as_double());
  return absl::InvalidArgumentError(absl::StrCat("test '", test, "' needs an integer, not ", v.type_name()));
}

}  // namespace

bool is_known_test(const std::string& name) {
  for (const char* t : kTests)
    if (name == t) return true;
  return false;
}

StatusOr<bool> apply_test(const std::string& name, const Value& v, const CallArgs& args) {
  const std::string fn = "test '" + name + "'";
  const bool comparison = name == "eq" || name == "equalto" || name == "==" || name == "ne" || name == "!=" ||
                          name == "lt" || name == "<" || name == "le" || name == "<=" || name == "gt" ||
                          name == ">" || name == "ge" || name == ">=" || name == "in" || name == "sameas" ||
                          name == "divisibleby";
  PD_ASSIGN_OR_RETURN(auto p, bind_arguments(fn, args, comparison ? std::vector<std::string>{"other"}
                                                                   : std::vector<std::string>{}));
  if (comparison) {
    if (!p[0]) return absl::InvalidArgumentError(absl::StrCat(fn, " needs an argument"));
    const Value& other = *p[0];
    if (name == "eq" || name == "equalto" || name == "==") return equal(v, other);
    if (name == "ne" || name == "!=") return !equal(v, other);
    if (name == "lt" || name == "<") return less(v, other);
    if (name == "gt" || name == ">") return less(other, v);
    if (name == "le" || name == "<=") {
      PD_ASSIGN_OR_RETURN(bool gt, less(other, v));
      return !gt;
    }
    if (name == "ge" || name == ">=") {
      PD_ASSIGN_OR_RETURN(bool lt, less(v, other));
      return !lt;
    }
    if (name == "sameas") {
      // Python's `is`; object identity is not modelled, so only the singletons compare.
      if (other.is_none()) return v.is_none();
      if (other.is_bool()) return v.is_bool() && v.as_bool() == other.as_bool();
      return absl::InvalidArgumentError("test 'sameas' is supported only against none, true and false");
    }
    if (name == "divisibleby") {
      PD_ASSIGN_OR_RETURN(int64_t a, integral(v, name));
      PD_ASSIGN_OR_RETURN(int64_t b, integral(other, name));
      if (b == 0) return absl::InvalidArgumentError("test 'divisibleby': division by zero");
      return a % b == 0;
    }
    // in
    if (other.is_string()) {
      if (!v.is_string()) return absl::InvalidArgumentError("'in <string>' needs a string on the left");
      return other.as_string().find(v.as_string()) != std::string::npos;
    }
    if (other.is_dict()) return v.is_string() && other.as_dict().find(v.as_string()) != nullptr;
    PD_ASSIGN_OR_RETURN(std::vector<Value> items, iterate(other));
    for (const Value& x : items)
      if (equal(x, v)) return true;
    return false;
  }
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.is_none();
  if (name == "boolean") return v.is_bool();
  if (name == "true") return v.is_bool() && v.as_bool();
  if (name == "false") return v.is_bool() && !v.as_bool();
  if (name == "integer") return v.is_int();
  if (name == "float") return v.is_float();
  if (name == "number") return v.is_number();
  if (name == "string") return v.is_string();
  if (name == "mapping") return v.is_dict();
  if (name == "callable") return v.is_callable();
  if (name == "iterable") return v.is_undefined() || v.is_string() || v.is_list() || v.is_dict();
  if (name == "sequence") return v.is_undefined() || v.is_string() || v.is_list() || v.is_dict();
  if (name == "odd" || name == "even") {
    PD_ASSIGN_OR_RETURN(int64_t i, integral(v, name));
    return (i % 2 != 0) == (name == "odd");
  }
  return absl::InternalError("unreachable test " + name);
}

}  // namespace pdserve::jinja
