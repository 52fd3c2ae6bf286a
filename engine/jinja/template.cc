#include "engine/jinja/template.h"

#include "engine/jinja/lexer.h"
#include "engine/jinja/parser.h"

namespace pdserve::jinja {

StatusOr<Template> Template::compile(absl::string_view source) {
  PD_ASSIGN_OR_RETURN(std::vector<Token> tokens, lex(source, LexOptions{}));
  PD_ASSIGN_OR_RETURN(Program program, parse(std::move(tokens)));
  return Template(std::make_shared<const Program>(std::move(program)));
}

StatusOr<std::string> Template::render(const Dict& context, const RenderOptions& options) const {
  return jinja::render(*program_, context, options);
}

}  // namespace pdserve::jinja
