// Python's str operations on UTF-8 text, as chat templates call them (message.content.strip(),
// .split('</think>'), | title, | length, slicing). Python counts and indexes code points and
// has its own idea of whitespace and of word boundaries; these functions reproduce that so a
// template renders as it does under jinja2. Case mapping is utf8proc's simple (one code point
// to one) mapping plus Python's full mapping of 'ß' ("SS", title "Ss"); Python maps a few
// other rare letters and ligatures (e.g. U+FB01) to several code points where this keeps one.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace pdserve::jinja {

// The text split into code points (each as its UTF-8 bytes); invalid bytes stand alone.
std::vector<std::string> code_points(absl::string_view s);
// Python's str.isspace() for one code point.
bool is_python_space(char32_t c);

// How many bytes of whitespace (Python's) `s` starts with.
size_t leading_space_bytes(absl::string_view s);

// str.strip / lstrip / rstrip: `chars` absent strips whitespace, else any of its code points.
enum class StripSide { kBoth, kLeft, kRight };
std::string py_strip(absl::string_view s, StripSide side, const std::optional<std::string>& chars);
// str.split(sep, maxsplit): no sep splits on whitespace runs and drops empty pieces.
std::vector<std::string> py_split(absl::string_view s, const std::optional<std::string>& sep, int64_t maxsplit);
// str.splitlines() (every separator Python knows, without keeping ends).
std::vector<std::string> py_splitlines(absl::string_view s);
// str.replace(old, new, count); count < 0 replaces all.
std::string py_replace(absl::string_view s, absl::string_view old_text, absl::string_view new_text, int64_t count);
std::string py_upper(absl::string_view s);
std::string py_lower(absl::string_view s);
// str.title(): each run of cased letters starts upper case, the rest lower.
std::string py_title(absl::string_view s);
// str.capitalize(): the first code point upper case, the rest lower.
std::string py_capitalize(absl::string_view s);
// str.find(sub): the code point index, or -1.
int64_t py_find(absl::string_view s, absl::string_view sub);
// len(re.findall(r"\w+", s)): runs of letters, digits and underscores (jinja2's wordcount).
int64_t py_word_count(absl::string_view s);
// str.count(sub): non-overlapping occurrences (an empty sub counts code points + 1).
int64_t py_count(absl::string_view s, absl::string_view sub);

}  // namespace pdserve::jinja
