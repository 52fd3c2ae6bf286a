#include "engine/jinja/value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>

namespace pdserve::jinja {

const Value* Dict::find(const std::string& key) const {
  for (const auto& [k, v] : entries_)
    if (k == key) return &v;
  return nullptr;
}

void Dict::set(const std::string& key, Value value) {
  for (auto& [k, v] : entries_)
    if (k == key) {
      v = std::move(value);
      return;
    }
  entries_.emplace_back(key, std::move(value));
}

Value Value::list(std::vector<Value> items, bool tuple) {
  return Value(Data(ListPtr(std::make_shared<const ListData>(ListData{std::move(items), tuple}))));
}
Value Value::dict(Dict d) { return Value(Data(DictPtr(std::make_shared<const Dict>(std::move(d))))); }
Value Value::namespace_of(Dict d) { return Value(Data(NamespacePtr(std::make_shared<Dict>(std::move(d))))); }
Value Value::callable(std::string name, std::function<StatusOr<Value>(const CallArgs&)> call) {
  return Value(Data(CallablePtr(std::make_shared<const Callable>(Callable{std::move(name), std::move(call)}))));
}

double Value::as_double() const {
  if (is_float()) return std::get<double>(data_);
  if (is_bool()) return as_bool() ? 1.0 : 0.0;
  return double(as_int());
}

bool Value::truthy() const {
  switch (kind()) {
    case Kind::kUndefined:
    case Kind::kNone: return false;
    case Kind::kBool: return as_bool();
    case Kind::kInt: return as_int() != 0;
    case Kind::kFloat: return as_double() != 0.0;
    case Kind::kString: return !as_string().empty();
    case Kind::kList: return !as_list().empty();
    case Kind::kDict: return as_dict().size() > 0;
    case Kind::kNamespace:
    case Kind::kCallable: return true;
  }
  return false;
}

std::string Value::type_name() const {
  switch (kind()) {
    case Kind::kUndefined: return "undefined";
    case Kind::kNone: return "NoneType";
    case Kind::kBool: return "bool";
    case Kind::kInt: return "int";
    case Kind::kFloat: return "float";
    case Kind::kString: return "str";
    case Kind::kList: return is_tuple() ? "tuple" : "list";
    case Kind::kDict: return "dict";
    case Kind::kNamespace: return "Namespace";
    case Kind::kCallable: return "function";
  }
  return "object";
}

bool equal(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.as_double() == b.as_double();
    const int64_t x = a.is_bool() ? int64_t(a.as_bool()) : a.as_int();
    const int64_t y = b.is_bool() ? int64_t(b.as_bool()) : b.as_int();
    return x == y;
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone: return true;
    case Value::Kind::kString: return a.as_string() == b.as_string();
    case Value::Kind::kList: {
      // Python: a list never equals a tuple.
      if (a.is_tuple() != b.is_tuple() || a.as_list().size() != b.as_list().size()) return false;
      for (size_t i = 0; i < a.as_list().size(); ++i)
        if (!equal(a.as_list()[i], b.as_list()[i])) return false;
      return true;
    }
    case Value::Kind::kDict: {
      if (a.as_dict().size() != b.as_dict().size()) return false;
      for (const auto& [k, v] : a.as_dict().entries()) {
        const Value* other = b.as_dict().find(k);
        if (!other || !equal(v, *other)) return false;
      }
      return true;
    }
    case Value::Kind::kNamespace: return &a.namespace_attributes() == &b.namespace_attributes();
    case Value::Kind::kCallable: return &a.as_callable() == &b.as_callable();
    default: return false;
  }
}

StatusOr<bool> less(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) return a.as_double() < b.as_double();
  if (a.is_string() && b.is_string()) return a.as_string() < b.as_string();  // UTF-8 keeps code point order.
  if (a.is_list() && b.is_list()) {
    const auto& x = a.as_list();
    const auto& y = b.as_list();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (equal(x[i], y[i])) continue;
      return less(x[i], y[i]);
    }
    return x.size() < y.size();
  }
  return absl::InvalidArgumentError(
      absl::StrCat("'<' is not supported between '", a.type_name(), "' and '", b.type_name(), "'"));
}

std::string float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d < 0 ? "-inf" : "inf";
  if (d == 0) return std::signbit(d) ? "-0.0" : "0.0";
  // The shortest round-trip digits, then Python's layout: positional for exponents in
  // [-4, 16), else d.ddde+XX.
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  std::string sci(buf, r.ptr);
  const bool negative = sci[0] == '-';
  if (negative) sci.erase(0, 1);
  const size_t e = sci.find('e');
  std::string digits = sci.substr(0, e);
  digits.erase(std::remove(digits.begin(), digits.end(), '.'), digits.end());
  const int exponent = std::atoi(sci.c_str() + e + 1);
  std::string out;
  if (exponent >= -4 && exponent < 16) {
    if (exponent < 0) {
      out = "0." + std::string(size_t(-exponent - 1), '0') + digits;
    } else if (size_t(exponent) + 1 >= digits.size()) {
      out = digits + std::string(size_t(exponent) + 1 - digits.size(), '0') + ".0";
    } else {
      out = digits.substr(0, size_t(exponent) + 1) + "." + digits.substr(size_t(exponent) + 1);
    }
  } else {
    out = digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    const int mag = std::abs(exponent);
    out += exponent < 0 ? "e-" : "e+";
    if (mag < 10) out += "0";
    out += std::to_string(mag);
  }
  return negative ? "-" + out : out;
}

namespace {

std::string string_repr(const std::string& s) {
  const bool use_double = s.find('\'') != std::string::npos && s.find('"') == std::string::npos;
  const char quote = use_double ? '"' : '\'';
  std::string out(1, quote);
  for (unsigned char c : s) {
    if (c == '\\') out += "\\\\";
    else if (c == quote) out += std::string("\\") + char(c);
    else if (c == '\n') out += "\\n";
    else if (c == '\r') out += "\\r";
    else if (c == '\t') out += "\\t";
    else if (c < 0x20 || c == 0x7f) {
      static constexpr char kHex[] = "0123456789abcdef";
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 15];
    } else {
      out += char(c);
    }
  }
  return out + quote;
}

}  // namespace

std::string to_repr(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kString: return string_repr(v.as_string());
    case Value::Kind::kList: {
      const auto& items = v.as_list();
      std::string out = v.is_tuple() ? "(" : "[";
      for (size_t i = 0; i < items.size(); ++i) out += (i ? ", " : "") + to_repr(items[i]);
      if (v.is_tuple() && items.size() == 1) out += ",";
      return out + (v.is_tuple() ? ")" : "]");
    }
    case Value::Kind::kDict: {
      std::string out = "{";
      bool first = true;
      for (const auto& [k, x] : v.as_dict().entries()) {
        out += (first ? "" : ", ") + string_repr(k) + ": " + to_repr(x);
        first = false;
      }
      return out + "}";
    }
    default: return to_str(v);
  }
}

std::string to_str(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined: return "";
    case Value::Kind::kNone: return "None";
    case Value::Kind::kBool: return v.as_bool() ? "True" : "False";
    case Value::Kind::kInt: return std::to_string(v.as_int());
    case Value::Kind::kFloat: return float_repr(v.as_double());
    case Value::Kind::kString: return v.as_string();
    case Value::Kind::kList:
    case Value::Kind::kDict: return to_repr(v);
    case Value::Kind::kNamespace: return "<Namespace>";
    case Value::Kind::kCallable: return "<function " + v.as_callable().name + ">";
  }
  return "";
}

}  // namespace pdserve::jinja
