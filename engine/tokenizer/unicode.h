// Unicode text operations the tokenizer.json components need, with the meanings the Hugging
// Face tokenizers library gives them (Rust's char predicates, its normalization forms):
// normalization and case mapping through utf8proc, general-category predicates, and code
// point iteration over text that has already been validated as UTF-8.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace pdserve::engine::unicode {

enum class NormalizationForm { kNfc, kNfd, kNfkc, kNfkd };

// `text` in the given normalization form. `text` must be valid UTF-8.
std::string normalize(std::string_view text, NormalizationForm form);

// Full lowercase mapping (as Rust's str::to_lowercase): per code point, plus U+0130 -> "i̇"
// and the final-sigma rule.
std::string lowercase(std::string_view text);

// One code point of valid UTF-8 text and where it lies.
struct CodePoint {
  char32_t value;
  size_t begin;   // Byte offset of its first byte.
  size_t length;  // Its UTF-8 length in bytes.
};
std::vector<CodePoint> code_points(std::string_view text);

bool is_whitespace(char32_t c);    // The White_Space property (Rust's char::is_whitespace).
bool is_numeric(char32_t c);       // General category N* (Rust's char::is_numeric).
bool is_alphabetic_or_numeric(char32_t c);  // L* or N*.
bool is_punctuation(char32_t c);   // ASCII punctuation or category P* (HF's is_punc).
bool is_control(char32_t c);       // Category C* except \t \n \r (HF Bert's is_control).
bool is_mark(char32_t c);          // Category M* (combining marks).
bool is_nonspacing_mark(char32_t c);  // Category Mn.
bool is_chinese_char(char32_t c);  // The CJK blocks BERT puts spaces around.

}  // namespace pdserve::engine::unicode
