// A compiled Jinja template: the public face of the interpreter (engine/jinja/). Compiling
// lexes and parses with the options transformers renders chat templates with (trim_blocks,
// lstrip_blocks, loop controls), and refuses constructs outside the supported subset with an
// error naming them (engine/jinja/parser.h, builtins.h). A Template is immutable and cheap to
// copy; render may run concurrently.
#pragma once

#include <memory>
#include <string>

#include "absl/strings/string_view.h"
#include "common/status.h"
#include "engine/jinja/ast.h"
#include "engine/jinja/evaluator.h"
#include "engine/jinja/value.h"

namespace pdserve::jinja {

class Template {
 public:
  static StatusOr<Template> compile(absl::string_view source);

  // The text for `context` (its entries are the template's variables).
  StatusOr<std::string> render(const Dict& context, const RenderOptions& options) const;

 private:
  explicit Template(std::shared_ptr<const Program> program) : program_(std::move(program)) {}
  std::shared_ptr<const Program> program_;
};

}  // namespace pdserve::jinja
