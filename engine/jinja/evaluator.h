// Renders a parsed template (engine/jinja/ast.h) against a context, with jinja2's scoping:
// a for loop's body and a macro's body have their own variables (so `set` inside a loop does
// not leak out: templates use namespace() for that), `if` does not. Undefined names render as
// nothing and fail when used further (attribute, call, arithmetic), as jinja2's default
// Undefined does. Every run is bounded (output size, loop iterations, nesting depth), so no
// template can hang or exhaust the process; the error says which bound was hit.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include "common/status.h"
#include "engine/jinja/ast.h"
#include "engine/jinja/builtins.h"
#include "engine/jinja/value.h"

namespace pdserve::jinja {

struct RenderOptions {
  // What strftime_now() formats (tests fix it; serving passes the wall clock).
  std::chrono::system_clock::time_point now;
  size_t max_output_bytes = 16 << 20;
  int64_t max_loop_iterations = 1 << 20;  // Over all loops of one render.
  int max_depth = 128;                    // Nested blocks, expressions and macro calls.
  ValueLimits value_limits;
};

StatusOr<std::string> render(const Program& program, const Dict& context, const RenderOptions& options);

}  // namespace pdserve::jinja
