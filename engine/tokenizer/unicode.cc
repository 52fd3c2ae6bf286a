#include "engine/tokenizer/unicode.h"

#include <cstdlib>
#include <memory>

#include <utf8proc.h>

#include "engine/tokenizer/utf8.h"

namespace pdserve::engine::unicode {
namespace {

utf8proc_option_t options_for(NormalizationForm form) {
  switch (form) {
    case NormalizationForm::kNfc:
      return utf8proc_option_t(UTF8PROC_STABLE | UTF8PROC_COMPOSE);
    case NormalizationForm::kNfd:
      return utf8proc_option_t(UTF8PROC_STABLE | UTF8PROC_DECOMPOSE);
    case NormalizationForm::kNfkc:
      return utf8proc_option_t(UTF8PROC_STABLE | UTF8PROC_COMPOSE | UTF8PROC_COMPAT);
    case NormalizationForm::kNfkd:
      return utf8proc_option_t(UTF8PROC_STABLE | UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT);
  }
  return UTF8PROC_STABLE;
}

utf8proc_category_t category(char32_t c) { return utf8proc_category(utf8proc_int32_t(c)); }

bool is_cased(char32_t c) {
  return utf8proc_tolower(utf8proc_int32_t(c)) != utf8proc_int32_t(c) ||
         utf8proc_toupper(utf8proc_int32_t(c)) != utf8proc_int32_t(c);
}

// Case-ignorable for the final-sigma rule: marks, format characters, modifiers, apostrophes.
bool is_case_ignorable(char32_t c) {
  switch (category(c)) {
    case UTF8PROC_CATEGORY_MN:
    case UTF8PROC_CATEGORY_ME:
    case UTF8PROC_CATEGORY_CF:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_SK:
      return true;
    default:
      return c == '\'' || c == '.' || c == ':' || c == 0x00B7 || c == 0x2019;
  }
}

}  // namespace

std::string normalize(std::string_view text, NormalizationForm form) {
  if (text.empty()) return std::string();
  utf8proc_uint8_t* mapped = nullptr;
  const utf8proc_ssize_t length =
      utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text.data()),
                   utf8proc_ssize_t(text.size()), &mapped, options_for(form));
  // utf8proc fails only on invalid UTF-8 or memory exhaustion; text is validated beforehand.
  if (length < 0) return std::string(text);
  std::unique_ptr<utf8proc_uint8_t, decltype(&std::free)> owner(mapped, &std::free);
  return std::string(reinterpret_cast<const char*>(mapped), size_t(length));
}

std::vector<CodePoint> code_points(std::string_view text) {
  std::vector<CodePoint> out;
  out.reserve(text.size());
  size_t pos = 0;
  while (pos < text.size()) {
    utf8proc_int32_t value = 0;
    const utf8proc_ssize_t length = utf8proc_iterate(
        reinterpret_cast<const utf8proc_uint8_t*>(text.data() + pos),
        utf8proc_ssize_t(text.size() - pos), &value);
    if (length <= 0) {  // Not valid UTF-8 after all: take the byte as it is.
      out.push_back({char32_t(static_cast<unsigned char>(text[pos])), pos, 1});
      ++pos;
      continue;
    }
    out.push_back({char32_t(value), pos, size_t(length)});
    pos += size_t(length);
  }
  return out;
}

std::string lowercase(std::string_view text) {
  const std::vector<CodePoint> cps = code_points(text);
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < cps.size(); ++i) {
    const char32_t c = cps[i].value;
    if (c == 0x0130) {  // İ lowercases to i + combining dot above.
      out += "i\xCC\x87";
      continue;
    }
    if (c == 0x03A3) {  // Σ is ς at the end of a word: after a cased letter, not before one.
      const auto cased_neighbour = [&](size_t from, int step) {
        for (size_t j = from; j < cps.size(); j += size_t(step)) {
          if (!is_case_ignorable(cps[j].value)) return is_cased(cps[j].value);
        }
        return false;
      };
      const bool before = i > 0 && cased_neighbour(i - 1, -1);
      const bool after = cased_neighbour(i + 1, 1);
      utf8::append_code_point(out, before && !after ? 0x03C2 : 0x03C3);
      continue;
    }
    utf8::append_code_point(out, char32_t(utf8proc_tolower(utf8proc_int32_t(c))));
  }
  return out;
}

bool is_whitespace(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
         c == 0x205F || c == 0x3000;
}

bool is_numeric(char32_t c) {
  const utf8proc_category_t cat = category(c);
  return cat == UTF8PROC_CATEGORY_ND || cat == UTF8PROC_CATEGORY_NL || cat == UTF8PROC_CATEGORY_NO;
}

bool is_alphabetic_or_numeric(char32_t c) {
  const utf8proc_category_t cat = category(c);
  return (cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_LO) || is_numeric(c);
}

bool is_punctuation(char32_t c) {
  if (c < 0x80) {
    return (c >= '!' && c <= '/') || (c >= ':' && c <= '@') || (c >= '[' && c <= '`') ||
           (c >= '{' && c <= '~');
  }
  const utf8proc_category_t cat = category(c);
  return cat >= UTF8PROC_CATEGORY_PC && cat <= UTF8PROC_CATEGORY_PO;
}

bool is_control(char32_t c) {
  if (c == '\t' || c == '\n' || c == '\r') return false;
  const utf8proc_category_t cat = category(c);
  return cat == UTF8PROC_CATEGORY_CC || cat == UTF8PROC_CATEGORY_CF ||
         cat == UTF8PROC_CATEGORY_CO || cat == UTF8PROC_CATEGORY_CS || cat == UTF8PROC_CATEGORY_CN;
}

bool is_mark(char32_t c) {
  const utf8proc_category_t cat = category(c);
  return cat == UTF8PROC_CATEGORY_MN || cat == UTF8PROC_CATEGORY_MC || cat == UTF8PROC_CATEGORY_ME;
}

bool is_nonspacing_mark(char32_t c) { return category(c) == UTF8PROC_CATEGORY_MN; }

bool is_chinese_char(char32_t c) {
  return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) ||
         (c >= 0x20000 && c <= 0x2A6DF) || (c >= 0x2A700 && c <= 0x2B73F) ||
         (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B920 && c <= 0x2CEAF) ||
         (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}

}  // namespace pdserve::engine::unicode
