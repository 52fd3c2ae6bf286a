#include "engine/jinja/json_value.h"

#include <algorithm>
#include <cmath>

#include "engine/jinja/py_string.h"

namespace pdserve::jinja {
namespace {

void append_hex4(std::string& out, unsigned v) {
  static constexpr char kHex[] = "0123456789abcdef";
  out += "\\u";
  for (int shift = 12; shift >= 0; shift -= 4) out += kHex[(v >> shift) & 15];
}

// Python's json string encoder (lowercase \u escapes; with ensure_ascii, non-ASCII as UTF-16).
std::string quote(const std::string& s, bool ensure_ascii) {
  std::string out = "\"";
  for (const std::string& cp : code_points(s)) {
    const unsigned char c = static_cast<unsigned char>(cp[0]);
    if (cp.size() == 1) {
      switch (c) {
        case '"': out += "\\\""; continue;
        case '\\': out += "\\\\"; continue;
        case '\n': out += "\\n"; continue;
        case '\r': out += "\\r"; continue;
        case '\t': out += "\\t"; continue;
        case '\b': out += "\\b"; continue;
        case '\f': out += "\\f"; continue;
        default: break;
      }
      if (c < 0x20 || (ensure_ascii && c >= 0x80)) append_hex4(out, c);
      else out += cp;
      continue;
    }
    if (!ensure_ascii) {
      out += cp;
      continue;
    }
    // Decode the multi-byte sequence (code_points keeps them whole).
    unsigned v = c & (cp.size() == 2 ? 0x1f : cp.size() == 3 ? 0x0f : 0x07);
    for (size_t i = 1; i < cp.size(); ++i) v = (v << 6) | (static_cast<unsigned char>(cp[i]) & 0x3f);
    if (v >= 0x10000) {
      v -= 0x10000;
      append_hex4(out, 0xd800 + (v >> 10));
      append_hex4(out, 0xdc00 + (v & 0x3ff));
    } else {
      append_hex4(out, v);
    }
  }
  return out + "\"";
}

std::string float_json(double d) {
  if (std::isnan(d)) return "NaN";
  if (std::isinf(d)) return d < 0 ? "-Infinity" : "Infinity";
  return float_repr(d);
}

Status dump(const Value& v, const JsonDumpOptions& o, int depth, std::string& out) {
  if (depth > 512) return absl::InvalidArgumentError("tojson: the value is nested too deeply");
  auto newline = [&](int level) {
    if (!o.indent) return;
    out += "\n";
    for (int i = 0; i < level; ++i) out += *o.indent;
  };
  switch (v.kind()) {
    case Value::Kind::kNone: out += "null"; return absl::OkStatus();
    case Value::Kind::kBool: out += v.as_bool() ? "true" : "false"; return absl::OkStatus();
    case Value::Kind::kInt: out += std::to_string(v.as_int()); return absl::OkStatus();
    case Value::Kind::kFloat: out += float_json(v.as_double()); return absl::OkStatus();
    case Value::Kind::kString: out += quote(v.as_string(), o.ensure_ascii); return absl::OkStatus();
    case Value::Kind::kList: {
      const auto& items = v.as_list();
      if (items.empty()) {
        out += "[]";
        return absl::OkStatus();
      }
      out += "[";
      for (size_t i = 0; i < items.size(); ++i) {
        if (i) out += o.item_separator;
        newline(depth + 1);
        PD_RETURN_IF_ERROR(dump(items[i], o, depth + 1, out));
      }
      newline(depth);
      out += "]";
      return absl::OkStatus();
    }
    case Value::Kind::kDict: {
      std::vector<const std::pair<std::string, Value>*> entries;
      for (const auto& e : v.as_dict().entries()) entries.push_back(&e);
      if (entries.empty()) {
        out += "{}";
        return absl::OkStatus();
      }
      if (o.sort_keys)
        std::stable_sort(entries.begin(), entries.end(), [](auto* a, auto* b) { return a->first < b->first; });
      out += "{";
      for (size_t i = 0; i < entries.size(); ++i) {
        if (i) out += o.item_separator;
        newline(depth + 1);
        out += quote(entries[i]->first, o.ensure_ascii) + o.key_separator;
        PD_RETURN_IF_ERROR(dump(entries[i]->second, o, depth + 1, out));
      }
      newline(depth);
      out += "}";
      return absl::OkStatus();
    }
    default:
      return absl::InvalidArgumentError(absl::StrCat("tojson: Object of type ", v.type_name(), " is not JSON serializable"));
  }
}

}  // namespace

Value from_json(const nlohmann::ordered_json& j) {
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null: return Value::none();
    case nlohmann::ordered_json::value_t::boolean: return Value::boolean(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer: return Value::integer(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: {
      const uint64_t u = j.get<uint64_t>();
      // Past int64 the value keeps its magnitude as a float (Python would keep a big int).
      if (u > uint64_t(INT64_MAX)) return Value::number(double(u));
      return Value::integer(int64_t(u));
    }
    case nlohmann::ordered_json::value_t::number_float: return Value::number(j.get<double>());
    case nlohmann::ordered_json::value_t::string: return Value::string(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      std::vector<Value> items;
      items.reserve(j.size());
      for (const auto& x : j) items.push_back(from_json(x));
      return Value::list(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      Dict d;
      for (const auto& [k, x] : j.items()) d.set(k, from_json(x));
      return Value::dict(std::move(d));
    }
    default: return Value::none();
  }
}

StatusOr<std::string> dump_json(const Value& v, const JsonDumpOptions& options) {
  std::string out;
  PD_RETURN_IF_ERROR(dump(v, options, 0, out));
  return out;
}

}  // namespace pdserve::jinja
