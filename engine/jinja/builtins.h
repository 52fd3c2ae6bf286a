// The built-in filters, tests, methods and global functions a chat template may use, with
// jinja2's (and, for tojson, transformers') semantics. Anything not listed here is refused: an
// unknown filter or test when the template is parsed, an unknown method when it is called.
//   filters: abs capitalize count d default dictsort first float indent int items join last
//            length list lower map reject rejectattr replace reverse safe select selectattr
//            sort string title tojson trim unique upper wordcount
//   tests:   boolean callable defined divisibleby eq equalto even false float ge gt in
//            integer iterable le lt mapping ne none number odd sameas sequence string true
//            undefined (and the operator spellings == != < <= > >=)
//   methods: str.{strip lstrip rstrip split splitlines startswith endswith replace upper lower
//            title capitalize find count join}, dict.{items keys values get}
//   globals: range namespace dict raise_exception strftime_now
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "engine/jinja/value.h"

namespace pdserve::jinja {

bool is_known_filter(const std::string& name);
bool is_known_test(const std::string& name);

// `subject | name(args)`.
StatusOr<Value> apply_filter(const std::string& name, const Value& subject, const CallArgs& args);
// `subject is name(args)`.
StatusOr<bool> apply_test(const std::string& name, const Value& subject, const CallArgs& args);

// The bound method `object.name` (callable), or nullopt when `object` has no such method.
std::optional<Value> method_of(const Value& object, const std::string& name);

// Python's iter(): a list's items, a dict's keys, a string's code points; undefined is
// empty. Other values are not iterable (an error naming the type).
StatusOr<std::vector<Value>> iterate(const Value& v);

// jinja2's getitem (`object[key]`, and `object.key` for data): a dict's or namespace's entry,
// a list's or string's element (negative indexes count from the end), else a method of that
// name; missing is undefined. Undefined and None objects cannot be subscripted (an error).
StatusOr<Value> get_item(const Value& object, const Value& key);

// Values a template computes are bounded so that no template can exhaust memory.
struct ValueLimits {
  size_t max_string_bytes = 16 << 20;
  size_t max_list_items = 1 << 20;
};
// ResourceExhausted when `v` is a string or list past the limits.
Status check_value_size(const Value& v, const ValueLimits& limits);

// The global functions: range, namespace, dict, raise_exception and strftime_now (formatting
// `now` in local time, as transformers' datetime.now().strftime does).
Dict global_functions(std::chrono::system_clock::time_point now, const ValueLimits& limits);

// Python-style binding of a call's arguments to named parameters (positional first, then by
// keyword); an unknown keyword or too many arguments is an error naming `function`.
StatusOr<std::vector<std::optional<Value>>> bind_arguments(const std::string& function, const CallArgs& args,
                                                           const std::vector<std::string>& names);

}  // namespace pdserve::jinja
