// Where in a template's text something is (1-based line and column), and the error Status
// that names it: every compile and render error of the Jinja interpreter points at the
// template text that caused it, so a user can find the construct in their chat_template.
#pragma once

#include <string>

#include "common/status.h"

namespace pdserve::jinja {

struct SourcePosition {
  int line = 1;
  int column = 1;
};

// InvalidArgument "template line L column C: <what>".
inline Status error_at(SourcePosition at, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("template line ", at.line, " column ", at.column, ": ", what));
}

}  // namespace pdserve::jinja
