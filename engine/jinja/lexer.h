// Splits template text into tokens the way jinja2's lexer does: text between tags, and the
// expression tokens inside {{ }} and {% %} ({# #} comments are dropped). Whitespace control is
// applied here, because it changes the text: "{%-" / "-%}" strip all whitespace before / after
// a tag, and with trim_blocks and lstrip_blocks (the options transformers renders with) the
// newline after a block tag goes, and so do spaces from a line's start up to a block tag.
// Like jinja2, newlines are normalised to "\n" and one trailing newline of the source dropped.
#pragma once

#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "common/status.h"
#include "engine/jinja/source_position.h"

namespace pdserve::jinja {

enum class TokenKind {
  kText,           // Literal template text (whitespace control already applied).
  kVariableBegin,  // {{
  kVariableEnd,    // }}
  kBlockBegin,     // {%
  kBlockEnd,       // %}
  kName,           // identifier or keyword
  kString,         // a string literal, escapes decoded
  kInteger,
  kFloat,
  kOperator,       // + - * / // % ** ~ == != < <= > >= = . , : | ( ) [ ] { }
  kEnd,            // end of the template
};

struct Token {
  TokenKind kind;
  std::string text;  // The text, the name, the decoded string, the number's digits or the operator.
  SourcePosition position;
};

struct LexOptions {
  bool trim_blocks = true;
  bool lstrip_blocks = true;
};

// The template's tokens, ending with kEnd. Errors: an unclosed tag, comment or string, or a
// character that starts no token.
StatusOr<std::vector<Token>> lex(absl::string_view source, const LexOptions& options);

}  // namespace pdserve::jinja
