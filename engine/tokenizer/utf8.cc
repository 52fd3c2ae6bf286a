#include "engine/tokenizer/utf8.h"

namespace pdserve::engine::utf8 {

Sequence next_sequence(std::string_view text) {
  const auto byte = [&](size_t i) { return static_cast<unsigned char>(text[i]); };
  const unsigned char lead = byte(0);
  if (lead < 0x80) return {SequenceKind::kComplete, 1};
  size_t length;
  // The allowed range of the second byte depends on the lead byte (Unicode Table 3-7); this
  // is what rules out overlong forms, surrogates and values above U+10FFFF.
  unsigned char second_min = 0x80, second_max = 0xBF;
  if (lead >= 0xC2 && lead <= 0xDF) {
    length = 2;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    length = 3;
    if (lead == 0xE0) second_min = 0xA0;
    if (lead == 0xED) second_max = 0x9F;
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    length = 4;
    if (lead == 0xF0) second_min = 0x90;
    if (lead == 0xF4) second_max = 0x8F;
  } else {
    return {SequenceKind::kInvalid, 1};
  }
  for (size_t i = 1; i < length; ++i) {
    if (i >= text.size()) return {SequenceKind::kIncomplete, i};
    const unsigned char lo = i == 1 ? second_min : 0x80;
    const unsigned char hi = i == 1 ? second_max : 0xBF;
    if (byte(i) < lo || byte(i) > hi) return {SequenceKind::kInvalid, i};
  }
  return {SequenceKind::kComplete, length};
}

size_t first_invalid(std::string_view text) {
  size_t pos = 0;
  while (pos < text.size()) {
    const Sequence seq = next_sequence(text.substr(pos));
    if (seq.kind != SequenceKind::kComplete) return pos;
    pos += seq.length;
  }
  return std::string_view::npos;
}

void append_code_point(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

}  // namespace pdserve::engine::utf8
