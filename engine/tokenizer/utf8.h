// UTF-8 helpers shared by the tokenizers and the stream decoder: strict validation (no
// overlongs, surrogates or code points past U+10FFFF) and splitting text into code points.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace pdserve::engine::utf8 {

enum class SequenceKind { kComplete, kIncomplete, kInvalid };

struct Sequence {
  SequenceKind kind;
  // kComplete: the character's length. kIncomplete: how many bytes are present (all of the
  // rest of the input). kInvalid: the length of the maximal ill-formed subpart, at least 1,
  // which is what one U+FFFD replaces (the Unicode "best practice" for substitution).
  size_t length;
};

// Classifies the UTF-8 sequence that starts at `text[0]` (text must be non-empty).
Sequence next_sequence(std::string_view text);

// The byte offset of the first invalid or truncated sequence, or npos if `text` is valid.
size_t first_invalid(std::string_view text);

// Appends the UTF-8 encoding of `code_point` (assumed to be a valid scalar value).
void append_code_point(std::string& out, char32_t code_point);

inline constexpr std::string_view kReplacementCharacter = "\xEF\xBF\xBD";

}  // namespace pdserve::engine::utf8
