// Parses a token stream (engine/jinja/lexer.h) into a Program with jinja2's grammar and
// operator precedence. Supported statements: if/elif/else, for (tuple targets, an `if`
// filter, `else`, break/continue), set (also `ns.attr` and block set), macro, call,
// generation; anything else ({% include %}, {% extends %}, {% filter %}, ...) fails to parse
// with an error naming the tag. Unknown filters and tests fail here too, as they do in jinja2.
#pragma once

#include <vector>

#include "common/status.h"
#include "engine/jinja/ast.h"
#include "engine/jinja/lexer.h"

namespace pdserve::jinja {

// Nesting beyond this (parentheses, blocks) is refused, so no input can exhaust the stack.
inline constexpr int kMaxParseDepth = 200;

StatusOr<Program> parse(std::vector<Token> tokens);

}  // namespace pdserve::jinja
