#define PCRE2_CODE_UNIT_WIDTH 8
#include "engine/tokenizer/regex.h"

#include <pcre2.h>

#include "engine/tokenizer/utf8.h"

namespace pdserve::engine {
namespace {

std::string pcre2_error_text(int code) {
  PCRE2_UCHAR buffer[256];
  pcre2_get_error_message(code, buffer, sizeof(buffer));
  return std::string(reinterpret_cast<const char*>(buffer));
}

}  // namespace

std::string with_unicode_whitespace(std::string_view pattern) {
  std::string out;
  out.reserve(pattern.size());
  bool quoted = false;  // Inside \Q...\E everything is literal.
  for (size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] != '\\' || i + 1 == pattern.size()) {
      out += pattern[i];
      continue;
    }
    const char next = pattern[++i];
    if (quoted) {
      quoted = next != 'E';
      out += '\\';
      out += next;
    } else if (next == 's') {
      out += "\\p{White_Space}";
    } else if (next == 'S') {
      out += "\\P{White_Space}";
    } else {
      quoted = next == 'Q';
      out += '\\';
      out += next;
    }
  }
  return out;
}

class Pattern::Code {
 public:
  explicit Code(pcre2_code* code) : code_(code) {}
  ~Code() { pcre2_code_free(code_); }
  Code(const Code&) = delete;
  Code& operator=(const Code&) = delete;
  pcre2_code* get() const { return code_; }

 private:
  pcre2_code* code_;
};

StatusOr<Pattern> Pattern::compile(std::string_view pattern, Kind kind) {
  int error = 0;
  PCRE2_SIZE error_offset = 0;
  // PCRE2_LITERAL admits few other options (not UCP, which only matters to regexes).
  const uint32_t options =
      kind == Kind::kLiteral ? PCRE2_UTF | PCRE2_LITERAL : PCRE2_UTF | PCRE2_UCP;
  const std::string source =
      kind == Kind::kLiteral ? std::string(pattern) : with_unicode_whitespace(pattern);
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(source.data()), source.size(),
                                   options, &error, &error_offset, nullptr);
  if (code == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("pattern \"", std::string(pattern),
                                                   "\" does not compile at offset ", error_offset,
                                                   ": ", pcre2_error_text(error)));
  }
  // JIT is only a speed-up; the interpreter gives the same matches if it is unavailable.
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
  return Pattern(std::string(pattern), std::make_shared<const Code>(code));
}

StatusOr<std::vector<TextSpan>> Pattern::find_all(std::string_view text) const {
  std::vector<TextSpan> spans;
  if (text.empty()) return spans;
  std::unique_ptr<pcre2_match_data, decltype(&pcre2_match_data_free)> match(
      pcre2_match_data_create_from_pattern(code_->get(), nullptr), &pcre2_match_data_free);
  size_t offset = 0;
  while (offset < text.size()) {
    const int rc = pcre2_match(code_->get(), reinterpret_cast<PCRE2_SPTR>(text.data()),
                               text.size(), offset, PCRE2_NO_UTF_CHECK, match.get(), nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      return absl::InternalError(
          absl::StrCat("pattern \"", source_, "\" failed to match: ", pcre2_error_text(rc)));
    }
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(match.get());
    const size_t begin = ovector[0];
    const size_t end = ovector[1];
    if (end == begin) {  // Move on one character past an empty match.
      if (begin >= text.size()) break;
      offset = begin + utf8::next_sequence(text.substr(begin)).length;
      continue;
    }
    spans.push_back({begin, end});
    offset = end;
  }
  return spans;
}

StatusOr<std::string> Pattern::replace_all(std::string_view text,
                                           std::string_view replacement) const {
  PD_ASSIGN_OR_RETURN(const std::vector<TextSpan> spans, find_all(text));
  std::string out;
  size_t last = 0;
  for (const TextSpan& span : spans) {
    out.append(text.substr(last, span.begin - last));
    out.append(replacement);
    last = span.end;
  }
  out.append(text.substr(last));
  return out;
}

}  // namespace pdserve::engine
