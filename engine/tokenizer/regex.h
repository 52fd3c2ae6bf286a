// The patterns tokenizer.json components match with ({"String": ...} literals and
// {"Regex": ...} Oniguruma-style regexes, as Split, Replace and the ByteLevel pre-tokenizer
// use them): compiled once with PCRE2 in UTF + Unicode-property mode, shared and immutable.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace pdserve::engine {

// A byte range [begin, end) of the searched text.
struct TextSpan {
  size_t begin;
  size_t end;
};

// `pattern` with \s / \S spelled as \p{White_Space} / \P{White_Space} (outside \Q...\E).
std::string with_unicode_whitespace(std::string_view pattern);

class Pattern {
 public:
  enum class Kind { kLiteral, kRegex };
  // InvalidArgument (quoting the pattern) when a regex does not compile. A regex's \s and \S
  // mean the White_Space property, as in Oniguruma (the library's regex engine), not PCRE2's
  // own \s (which also takes U+180E).
  static StatusOr<Pattern> compile(std::string_view pattern, Kind kind);

  // The non-empty, non-overlapping matches in `text` (valid UTF-8), left to right. Empty
  // matches split nothing, as in the tokenizers library, so they are skipped.
  // Internal when PCRE2 fails (its match limit on pathological input).
  StatusOr<std::vector<TextSpan>> find_all(std::string_view text) const;
  // `text` with every match replaced by `replacement` (taken literally).
  StatusOr<std::string> replace_all(std::string_view text, std::string_view replacement) const;
  const std::string& source() const { return source_; }

 private:
  class Code;  // The compiled PCRE2 code; kept out of this header.
  Pattern(std::string source, std::shared_ptr<const Code> code)
      : source_(std::move(source)), code_(std::move(code)) {}
  std::string source_;
  std::shared_ptr<const Code> code_;
};

}  // namespace pdserve::engine
