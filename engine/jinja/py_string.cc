#include "engine/jinja/py_string.h"

#include <utf8proc.h>

#include "absl/strings/str_cat.h"

namespace pdserve::jinja {
namespace {

// Decodes one code point at s[i] (advancing i); an invalid byte decodes as itself.
char32_t decode(absl::string_view s, size_t& i) {
  utf8proc_int32_t c = -1;
  const utf8proc_ssize_t n = utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t*>(s.data() + i),
                                              utf8proc_ssize_t(s.size() - i), &c);
  if (n <= 0 || c < 0) {
    return char32_t(static_cast<unsigned char>(s[i++]));
  }
  i += size_t(n);
  return char32_t(c);
}

void append(std::string& out, char32_t c) {
  utf8proc_uint8_t buf[4];
  const utf8proc_ssize_t n = utf8proc_encode_char(utf8proc_int32_t(c), buf);
  out.append(reinterpret_cast<const char*>(buf), size_t(n));
}

// Appends map(c, out) for each code point; bytes that are not UTF-8 are copied unchanged.
template <typename Map>
std::string map_code_points(absl::string_view s, Map map) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    utf8proc_int32_t c = -1;
    const utf8proc_ssize_t n = utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t*>(s.data() + i),
                                                utf8proc_ssize_t(s.size() - i), &c);
    if (n <= 0 || c < 0) {
      out += s[i++];
      continue;
    }
    i += size_t(n);
    map(char32_t(c), out);
  }
  return out;
}

bool is_cased(char32_t c) {
  const utf8proc_category_t cat = utf8proc_category(utf8proc_int32_t(c));
  return cat == UTF8PROC_CATEGORY_LU || cat == UTF8PROC_CATEGORY_LL || cat == UTF8PROC_CATEGORY_LT;
}

char32_t upper(char32_t c) { return char32_t(utf8proc_toupper(utf8proc_int32_t(c))); }
char32_t lower(char32_t c) { return char32_t(utf8proc_tolower(utf8proc_int32_t(c))); }
char32_t title(char32_t c) { return char32_t(utf8proc_totitle(utf8proc_int32_t(c))); }

}  // namespace

std::vector<std::string> code_points(absl::string_view s) {
  std::vector<std::string> out;
  size_t i = 0;
  while (i < s.size()) {
    const size_t start = i;
    decode(s, i);
    out.emplace_back(s.substr(start, i - start));
  }
  return out;
}

bool is_python_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xa0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 || c == 0x202f || c == 0x205f || c == 0x3000;
}

size_t leading_space_bytes(absl::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    size_t next = i;
    if (!is_python_space(decode(s, next))) break;
    i = next;
  }
  return i;
}

std::string py_strip(absl::string_view s, StripSide side, const std::optional<std::string>& chars) {
  std::vector<char32_t> strip_set;
  if (chars) {
    size_t i = 0;
    while (i < chars->size()) strip_set.push_back(decode(*chars, i));
  }
  auto strips = [&](char32_t c) {
    if (!chars) return is_python_space(c);
    for (char32_t x : strip_set)
      if (x == c) return true;
    return false;
  };
  // Code point boundaries, so the right side strips whole code points.
  std::vector<size_t> starts;
  std::vector<char32_t> cps;
  size_t i = 0;
  while (i < s.size()) {
    starts.push_back(i);
    cps.push_back(decode(s, i));
  }
  starts.push_back(s.size());
  size_t begin = 0, end = cps.size();
  if (side != StripSide::kRight)
    while (begin < end && strips(cps[begin])) ++begin;
  if (side != StripSide::kLeft)
    while (end > begin && strips(cps[end - 1])) --end;
  return std::string(s.substr(starts[begin], starts[end] - starts[begin]));
}

std::vector<std::string> py_split(absl::string_view s, const std::optional<std::string>& sep, int64_t maxsplit) {
  std::vector<std::string> out;
  if (sep) {
    size_t pos = 0;
    while (maxsplit < 0 || int64_t(out.size()) < maxsplit) {
      const size_t at = s.find(*sep, pos);
      if (at == absl::string_view::npos) break;
      out.emplace_back(s.substr(pos, at - pos));
      pos = at + sep->size();
    }
    out.emplace_back(s.substr(pos));
    return out;
  }
  size_t i = 0;
  while (i < s.size()) {
    // Skip a whitespace run, then take a word.
    size_t j = i;
    while (j < s.size()) {
      size_t k = j;
      if (!is_python_space(decode(s, k))) break;
      j = k;
    }
    if (j >= s.size()) break;
    if (maxsplit >= 0 && int64_t(out.size()) == maxsplit) {
      out.emplace_back(py_strip(s.substr(j), StripSide::kRight, std::nullopt));
      return out;
    }
    size_t end = j;
    while (end < s.size()) {
      size_t k = end;
      if (is_python_space(decode(s, k))) break;
      end = k;
    }
    out.emplace_back(s.substr(j, end - j));
    i = end;
  }
  return out;
}

std::vector<std::string> py_splitlines(absl::string_view s) {
  std::vector<std::string> out;
  std::string line;
  size_t i = 0;
  while (i < s.size()) {
    const size_t start = i;
    const char32_t c = decode(s, i);
    const bool separator = c == '\n' || c == '\r' || c == 0x0b || c == 0x0c || c == 0x1c || c == 0x1d ||
                           c == 0x1e || c == 0x85 || c == 0x2028 || c == 0x2029;
    if (!separator) {
      absl::StrAppend(&line, s.substr(start, i - start));
      continue;
    }
    if (c == '\r' && i < s.size() && s[i] == '\n') ++i;
    out.push_back(std::move(line));
    line.clear();
  }
  if (!line.empty()) out.push_back(std::move(line));
  return out;
}

std::string py_replace(absl::string_view s, absl::string_view old_text, absl::string_view new_text, int64_t count) {
  std::string out;
  if (old_text.empty()) {
    // Python inserts `new` before every code point and at the end.
    int64_t done = 0;
    for (const std::string& cp : code_points(s)) {
      if (count < 0 || done < count) {
        absl::StrAppend(&out, new_text);
        ++done;
      }
      out += cp;
    }
    if (count < 0 || done < count) absl::StrAppend(&out, new_text);
    return out;
  }
  size_t pos = 0;
  int64_t done = 0;
  while (count < 0 || done < count) {
    const size_t at = s.find(old_text, pos);
    if (at == absl::string_view::npos) break;
    absl::StrAppend(&out, s.substr(pos, at - pos));
    absl::StrAppend(&out, new_text);
    pos = at + old_text.size();
    ++done;
  }
  absl::StrAppend(&out, s.substr(pos));
  return out;
}

// Python's full case mapping turns 'ß' into two letters; the rest maps one to one here.
constexpr char32_t kSharpS = 0xdf;

std::string py_upper(absl::string_view s) {
  return map_code_points(s, [](char32_t c, std::string& out) {
    if (c == kSharpS) out += "SS";
    else append(out, upper(c));
  });
}

std::string py_lower(absl::string_view s) {
  return map_code_points(s, [](char32_t c, std::string& out) { append(out, lower(c)); });
}

std::string py_title(absl::string_view s) {
  bool previous_cased = false;
  return map_code_points(s, [&](char32_t c, std::string& out) {
    if (!previous_cased && c == kSharpS) out += "Ss";
    else append(out, previous_cased ? lower(c) : title(c));
    previous_cased = is_cased(c);
  });
}

std::string py_capitalize(absl::string_view s) {
  bool first = true;
  return map_code_points(s, [&](char32_t c, std::string& out) {
    if (first && c == kSharpS) out += "Ss";
    else append(out, first ? title(c) : lower(c));
    first = false;
  });
}

int64_t py_find(absl::string_view s, absl::string_view sub) {
  const size_t at = s.find(sub);
  if (at == absl::string_view::npos) return -1;
  return int64_t(code_points(s.substr(0, at)).size());
}

int64_t py_word_count(absl::string_view s) {
  int64_t words = 0;
  bool in_word = false;
  size_t i = 0;
  while (i < s.size()) {
    const char32_t c = decode(s, i);
    const utf8proc_category_t cat = utf8proc_category(utf8proc_int32_t(c));
    const bool word_char = c == '_' || (cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_LO) ||
                           (cat >= UTF8PROC_CATEGORY_ND && cat <= UTF8PROC_CATEGORY_NO);
    if (word_char && !in_word) ++words;
    in_word = word_char;
  }
  return words;
}

int64_t py_count(absl::string_view s, absl::string_view sub) {
  if (sub.empty()) return int64_t(code_points(s).size()) + 1;
  int64_t n = 0;
  for (size_t pos = s.find(sub); pos != absl::string_view::npos; pos = s.find(sub, pos + sub.size())) ++n;
  return n;
}

}  // namespace pdserve::jinja
