// The filters (engine/jinja/builtins.h), each as jinja2 3.1 defines it; tojson is the one
// transformers installs instead of jinja2's (no HTML escaping, json.dumps' arguments).
#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "absl/strings/str_split.h"
#include "engine/jinja/builtins.h"
#include "engine/jinja/json_value.h"
#include "engine/jinja/py_string.h"

namespace pdserve::jinja {
namespace {

const char* const kFilters[] = {"abs",    "capitalize", "count",      "d",       "default", "dictsort", "first",
                                "float",  "indent",     "int",        "items",   "join",    "last",     "length",
                                "list",   "lower",      "map",        "reject",  "rejectattr", "replace", "reverse",
                                "safe",   "select",     "selectattr", "sort",    "string",  "title",    "tojson",
                                "trim",   "unique",     "upper",      "wordcount"};

StatusOr<size_t> length_of(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined: return size_t(0);
    case Value::Kind::kString: return code_points(v.as_string()).size();
    case Value::Kind::kList: return v.as_list().size();
    case Value::Kind::kDict: return v.as_dict().size();
    default: return absl::InvalidArgumentError(absl::StrCat("object of type '", v.type_name(), "' has no len()"));
  }
}

// jinja2's attribute getter: "a.b.0" looks up a, then b, then index 0.
StatusOr<Value> get_attribute_path(const Value& item, const Value& attribute) {
  if (!attribute.is_string()) return get_item(item, attribute);
  Value v = item;
  for (absl::string_view part : absl::StrSplit(attribute.as_string(), '.')) {
    const std::string p(part);
    const bool digits = !p.empty() && std::all_of(p.begin(), p.end(), [](char c) { return c >= '0' && c <= '9'; });
    PD_ASSIGN_OR_RETURN(v, get_item(v, digits ? Value::integer(std::strtoll(p.c_str(), nullptr, 10)) : Value::string(p)));
  }
  return v;
}

// Sort and unique compare strings case-insensitively unless asked not to.
Value sort_key(const Value& v, bool case_sensitive) {
  if (!case_sensitive && v.is_string()) return Value::string(py_lower(v.as_string()));
  return v;
}

StatusOr<Value> sorted(std::vector<Value> items, bool reverse, bool case_sensitive, const std::optional<Value>& attribute) {
  std::vector<std::pair<Value, Value>> keyed;
  for (Value& item : items) {
    Value key = item;
    if (attribute && !attribute->is_none()) {
      PD_ASSIGN_OR_RETURN(key, get_attribute_path(item, *attribute));
    }
    keyed.emplace_back(sort_key(key, case_sensitive), std::move(item));
  }
  Status error;
  std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& a, const auto& b) {
    if (!error.ok()) return false;
    auto lt = reverse ? less(b.first, a.first) : less(a.first, b.first);
    if (!lt.ok()) {
      error = lt.status();
      return false;
    }
    return *lt;
  });
  PD_RETURN_IF_ERROR(error);
  std::vector<Value> out;
  for (auto& [k, v] : keyed) out.push_back(std::move(v));
  return Value::list(std::move(out));
}

StatusOr<Value> tojson(const Value& v, const CallArgs& args) {
  // transformers' signature: tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False).
  PD_ASSIGN_OR_RETURN(auto p, bind_arguments("tojson", args, {"ensure_ascii", "indent", "separators", "sort_keys"}));
  JsonDumpOptions o;
  o.ensure_ascii = p[0] && p[0]->truthy();
  if (p[1] && !p[1]->is_none()) {
    if (p[1]->is_string()) o.indent = p[1]->as_string();
    else if (p[1]->is_int()) o.indent = std::string(size_t(std::max<int64_t>(0, std::min<int64_t>(p[1]->as_int(), 1024))), ' ');
    else return absl::InvalidArgumentError("tojson: indent must be an integer or a string");
    o.item_separator = ",";
  }
  if (p[2] && !p[2]->is_none()) {
    if (!p[2]->is_list() || p[2]->as_list().size() != 2 || !p[2]->as_list()[0].is_string() || !p[2]->as_list()[1].is_string())
      return absl::InvalidArgumentError("tojson: separators must be a pair of strings");
    o.item_separator = p[2]->as_list()[0].as_string();
    o.key_separator = p[2]->as_list()[1].as_string();
  }
  o.sort_keys = p[3] && p[3]->truthy();
  PD_ASSIGN_OR_RETURN(std::string text, dump_json(v, o));
  return Value::string(std::move(text));
}

// jinja2's title filter: upper-cases the first letter of each word, words starting after
// spaces, hyphens and opening brackets.
std::string title_filter(const std::string& s) {
  std::string out;
  bool word_start = true;
  for (const std::string& cp : code_points(s)) {
    const bool boundary = cp == "-" || cp == "(" || cp == "{" || cp == "[" || cp == "<" || leading_space_bytes(cp) == cp.size();
    if (boundary) {
      out += cp;
      word_start = true;
    } else {
      out += word_start ? py_upper(cp) : py_lower(cp);
      word_start = false;
    }
  }
  return out;
}

std::string indent_filter(std::string s, const std::string& indention, bool first, bool blank) {
  s += "\n";  // jinja2 appends one so that splitlines keeps a trailing empty line.
  const std::vector<std::string> lines = py_splitlines(s);
  std::string out;
  if (blank) {
    for (size_t i = 0; i < lines.size(); ++i) out += (i ? "\n" + indention : "") + lines[i];
  } else {
    out = lines.empty() ? "" : lines[0];
    for (size_t i = 1; i < lines.size(); ++i) out += "\n" + (lines[i].empty() ? "" : indention + lines[i]);
  }
  return first ? indention + out : out;
}

// Python's int(text): optional sign, digits with single underscores, surrounding whitespace.
std::optional<int64_t> parse_int(const std::string& text) {
  std::string t = py_strip(text, StripSide::kBoth, std::nullopt);
  t.erase(std::remove(t.begin(), t.end(), '_'), t.end());
  if (t.empty()) return std::nullopt;
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(t.c_str(), &end, 10);
  if (errno == ERANGE || *end != '\0') return std::nullopt;
  return int64_t(v);
}

std::optional<double> parse_float(const std::string& text) {
  const std::string t = py_strip(text, StripSide::kBoth, std::nullopt);
  if (t.empty()) return std::nullopt;
  char* end = nullptr;
  const double v = std::strtod(t.c_str(), &end);
  if (*end != '\0') return std::nullopt;
  return v;
}

// select/reject/selectattr/rejectattr: keep the items whose test (or truth) is `keep`.
StatusOr<Value> select_items(const std::string& name, const Value& subject, const CallArgs& args, bool by_attribute,
                             bool keep) {
  PD_ASSIGN_OR_RETURN(std::vector<Value> items, iterate(subject));
  if (!args.keyword.empty()) return absl::InvalidArgumentError(absl::StrCat(name, " takes no keyword arguments"));
  size_t next = 0;
  std::optional<Value> attribute;
  if (by_attribute) {
    if (args.positional.empty()) return absl::InvalidArgumentError(absl::StrCat(name, " needs an attribute"));
    attribute = args.positional[next++];
  }
  std::optional<std::string> test;
  if (next < args.positional.size()) {
    if (!args.positional[next].is_string()) return absl::InvalidArgumentError(absl::StrCat(name, ": the test must be a name"));
    test = args.positional[next++].as_string();
    if (!is_known_test(*test)) return absl::InvalidArgumentError(absl::StrCat("no test named '", *test, "'"));
  }
  CallArgs test_args;
  test_args.positional.assign(args.positional.begin() + long(next), args.positional.end());
  std::vector<Value> out;
  for (const Value& item : items) {
    Value x = item;
    if (attribute) {
      PD_ASSIGN_OR_RETURN(x, get_attribute_path(item, *attribute));
    }
    bool passes = x.truthy();
    if (test) {
      PD_ASSIGN_OR_RETURN(passes, apply_test(*test, x, test_args));
    }
    if (passes == keep) out.push_back(item);
  }
  return Value::list(std::move(out));
}

StatusOr<Value> map_items(const Value& subject, const CallArgs& args) {
  PD_ASSIGN_OR_RETURN(std::vector<Value> items, iterate(subject));
  std::vector<Value> out;
  if (args.positional.empty()) {
    PD_ASSIGN_OR_RETURN(auto p, bind_arguments("map", args, {"attribute", "default"}));
    if (!p[0]) return absl::InvalidArgumentError("map needs a filter name or attribute=");
    for (const Value& item : items) {
      PD_ASSIGN_OR_RETURN(Value v, get_attribute_path(item, *p[0]));
      if (v.is_undefined() && p[1]) v = *p[1];
      out.push_back(std::move(v));
    }
    return Value::list(std::move(out));
  }
  if (!args.positional[0].is_string()) return absl::InvalidArgumentError("map: the filter must be a name");
  const std::string filter = args.positional[0].as_string();
  if (!is_known_filter(filter)) return absl::InvalidArgumentError(absl::StrCat("no filter named '", filter, "'"));
  CallArgs rest{{args.positional.begin() + 1, args.positional.end()}, args.keyword};
  for (const Value& item : items) {
    PD_ASSIGN_OR_RETURN(Value v, apply_filter(filter, item, rest));
    out.push_back(std::move(v));
  }
  return Value::list(std::move(out));
}

}  // namespace

bool is_known_filter(const std::string& name) {
  for (const char* f : kFilters)
    if (name == f) return true;
  return false;
}

StatusOr<Value> apply_filter(const std::string& name, const Value& subject, const CallArgs& args) {
  const std::string fn = "filter '" + name + "'";
  if (name == "tojson") return tojson(subject, args);
  if (name == "map") return map_items(subject, args);
  if (name == "select" || name == "reject") return select_items(fn, subject, args, false, name == "select");
  if (name == "selectattr" || name == "rejectattr") return select_items(fn, subject, args, true, name == "selectattr");
  if (name == "trim") {
    PD_ASSIGN_OR_RETURN(auto p, bind_arguments(fn, args, {"chars"}));
    std::optional<std::string> chars;
    if (p[0] && !p[0]->is_none()) chars = to_str(*p[0]);
    return Value::string(py_strip(to_str(subject), StripSide::kBoth, chars));
  }
  if (name == "length" || name == "count") {
    PD_ASSIGN_OR_RETURN(auto p, bind_arguments(fn, args, {}));
    PD_ASSIGN_OR_RETURN(size_t n, length_of(subject));
    return Value::integer(int64_t(n));
  }
  if (name == "upper" || name == "lower" || name == "capitalize" || name == "title" || name == "string" ||
      name == "wordcount") {
    PD_ASSIGN_OR_RETURN(auto p, bind_arguments(fn, args, {}));
    const std::string s = to_str(subject);
    if (name == "upper") return Value::string(py_upper(s));
    if (name == "lower") return Value::string(py_lower(s));
    if (name == "capitalize") return Value::string(py_capitalize(s));
    if (name == "title") return Value::string(title_filter(s));
    if (name == "string") return Value::string(s);
    return Value::integer(py_word_count(s));
  }
  if (name == "replace") {
    PD_ASSIGN_OR_RETURN(auto p, bind_arguments(fn, args, {"old", "new", "count"}));
    if (!p[0] || !p[1]) return absl::InvalidArgumentError(absl::StrCat(fn, " needs the old and the new text"));
    int64_t count = -1;
    if (p[2] && !p[2]->is_none()) {
      if (!p[2]->is_int()) return absl::InvalidArgumentError(absl::StrCat(fn, ": count must be an integer"));
      count = p[2]->as_int();
    }
    return Value::string(py_replace(to_str(subject), to_str(*p[0]), to_str(*p[1]), count));
  }
  if (name == "first" || name == "last") {
    PD_ASSIGN_OR_RETURN(auto p, bind_arguments(fn, args, {}));
    PD_ASSIGN_OR_RETURN(std::vector<Value> items, iterate(subject));
    if (items.empty()) return Value::undefined(absl::StrCat("the ", name, " item of an empty sequence is undefined"));
    return name == "first" ? items.front() : items.back();
  }
  if (name == "join") {
    PD_ASSIGN_OR_RETURN(auto p, bind_arguments(fn, args, {"d", "attribute"}));
    PD_ASSIGN_OR_RETURN(std::vector<Value> items, iterate(subject));
    const std::string sep = p[0] ? to_str(*p[0]) : "";
    std::string out;
    for (size_t i = 0; i < items.size(); ++i) {
      Value x = items[i];
      if (p[1] && !p[1]->is_none()) {
        PD_ASSIGN_OR_RETURN(x, get_attribute_path(items[i], *p[1]));
      }
      if (i) out += sep;
      out += to_str(x);
    }
    return Value::string(std::move(out));
  }
  if (name == "default" || name == "d") {
    PD_ASSIGN_OR_RETURN(auto p, bind_arguments(fn, args, {"default_value", "boolean"}));
    const bool boolean = p[1] && p[1]->truthy();
    if (subject.is_undefined() || (boolean && !subject.truthy())) return p[0] ? *p[0] : Value::string("");
    return subject;
  }
  if (name == "list") {
    PD_ASSIGN_OR_RETURN(auto p, bind_arguments(fn, args, {}));
    PD_ASSIGN_OR_RETURN(std::vector<Value> items, iterate(subject));
    return Value::list(std::move(items));
  }
  if (name == "int") {
    PD_ASSIGN_OR_RETURN(auto p, bind_arguments(fn, args, {"default", "base"}));
    if (p[1] && !(p[1]->is_int() && p[1]->as_int() == 10)) return absl::InvalidArgumentError("filter 'int': only base 10 is supported");
    const Value fallback = p[0] ? *p[0] : Value::integer(0);
    if (subject.is_bool()) return Value::integer(subject.as_bool() ? 1 : 0);
    if (subject.is_int()) return subject;
    if (subject.is_float()) {
      const double d = subject.as_double();
      if (!std::isfinite(d) || std::fabs(d) >= 9.2e18) return fallback;
      return Value::integer(int64_t(d));
    }
    if (subject.is_string()) {
      if (auto i = parse_int(subject.as_string())) return Value::integer(*i);
      if (auto f = parse_float(subject.as_string()); f && std::isfinite(*f) && std::fabs(*f) < 9.2e18)
        return Value::integer(int64_t(*f));
    }
    return fallback;
  }
  if (name == "float") {
    PD_ASSIGN_OR_RETURN(auto p, bind_arguments(fn, args, {"default"}));
    const Value fallback = p[0] ? *p[0] : Value::number(0.0);
    if (subject.is_number()) return Value::number(subject.as_double());
    if (subject.is_string()) {
      if (auto f = parse_float(subject.as_string())) return Value::number(*f);
    }
    return fallback;
  }
  if (name == "abs") {
    PD_ASSIGN_OR_RETURN(auto p, bind_arguments(fn, args, {}));
    if (subject.is_int()) {
      if (subject.as_int() == INT64_MIN) return absl::OutOfRangeError("filter 'abs': integer overflow");
      return Value::integer(std::llabs(subject.as_int()));
    }
    if (subject.is_bool()) return Value::integer(subject.as_bool() ? 1 : 0);
    if (subject.is_float()) return Value::number(std::fabs(subject.as_double()));
    return absl::InvalidArgumentError(absl::StrCat("bad operand type for abs(): '", subject.type_name(), "'"));
  }
  if (name == "items") {
    PD_ASSIGN_OR_RETURN(auto p, bind_arguments(fn, args, {}));
    if (subject.is_undefined()) return Value::list({});
    if (!subject.is_dict()) return absl::InvalidArgumentError(absl::StrCat("filter 'items' needs a mapping, not ", subject.type_name()));
    std::vector<Value> out;
    for (const auto& [k, v] : subject.as_dict().entries()) out.push_back(Value::list({Value::string(k), v}, true));
    return Value::list(std::move(out));
  }
  if (name == "dictsort") {
    PD_ASSIGN_OR_RETURN(auto p, bind_arguments(fn, args, {"case_sensitive", "by", "reverse"}));
    if (!subject.is_dict()) return absl::InvalidArgumentError(absl::StrCat("filter 'dictsort' needs a mapping, not ", subject.type_name()));
    const std::string by = p[1] ? to_str(*p[1]) : "key";
    if (by != "key" && by != "value") return absl::InvalidArgumentError("filter 'dictsort': by must be 'key' or 'value'");
    std::vector<Value> pairs;
    for (const auto& [k, v] : subject.as_dict().entries()) pairs.push_back(Value::list({Value::string(k), v}, true));
    return sorted(std::move(pairs), p[2] && p[2]->truthy(), p[0] && p[0]->truthy(), Value::integer(by == "key" ? 0 : 1));
  }
  if (name == "unique") {
    PD_ASSIGN_OR_RETURN(auto p, bind_arguments(fn, args, {"case_sensitive", "attribute"}));
    PD_ASSIGN_OR_RETURN(std::vector<Value> items, iterate(subject));
    const bool case_sensitive = p[0] && p[0]->truthy();
    std::vector<Value> seen, out;
    for (const Value& item : items) {
      Value key = item;
      if (p[1] && !p[1]->is_none()) {
        PD_ASSIGN_OR_RETURN(key, get_attribute_path(item, *p[1]));
      }
      key = sort_key(key, case_sensitive);
      if (std::any_of(seen.begin(), seen.end(), [&](const Value& s) { return equal(s, key); })) continue;
      seen.push_back(key);
      out.push_back(item);
    }
    return Value::list(std::move(out));
  }
  if (name == "reverse") {
    PD_ASSIGN_OR_RETURN(auto p, bind_arguments(fn, args, {}));
    if (subject.is_string()) {
      std::vector<std::string> cps = code_points(subject.as_string());
      std::reverse(cps.begin(), cps.end());
      std::string out;
      for (const std::string& cp : cps) out += cp;
      return Value::string(std::move(out));
    }
    PD_ASSIGN_OR_RETURN(std::vector<Value> items, iterate(subject));
    std::reverse(items.begin(), items.end());
    return Value::list(std::move(items));
  }
  if (name == "sort") {
    PD_ASSIGN_OR_RETURN(auto p, bind_arguments(fn, args, {"reverse", "case_sensitive", "attribute"}));
    PD_ASSIGN_OR_RETURN(std::vector<Value> items, iterate(subject));
    return sorted(std::move(items), p[0] && p[0]->truthy(), p[1] && p[1]->truthy(), p[2]);
  }
  if (name == "safe") {
    PD_ASSIGN_OR_RETURN(auto p, bind_arguments(fn, args, {}));
    return subject;
  }
  if (name == "indent") {
    PD_ASSIGN_OR_RETURN(auto p, bind_arguments(fn, args, {"width", "first", "blank"}));
    std::string indention = "    ";
    if (p[0]) {
      if (p[0]->is_string()) indention = p[0]->as_string();
      else if (p[0]->is_int()) indention = std::string(size_t(std::clamp<int64_t>(p[0]->as_int(), 0, 1024)), ' ');
      else return absl::InvalidArgumentError("filter 'indent': width must be an integer or a string");
    }
    return Value::string(indent_filter(to_str(subject), indention, p[1] && p[1]->truthy(), p[2] && p[2]->truthy()));
  }
  return absl::InternalError("unreachable filter " + name);
}

}  // namespace pdserve::jinja
