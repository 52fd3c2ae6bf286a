// The Jinja interpreter (engine/jinja/) on arbitrary template text, rendered against a fixed
// chat context: any input must compile or fail with a Status, and render or fail with one,
// within the interpreter's bounds (output size, loop iterations, nesting) — never crash, hang
// or exhaust memory. Tight bounds keep each run fast.
#include <cstddef>
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "engine/jinja/json_value.h"
#include "engine/jinja/template.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace pdserve;
  static const jinja::Value context = jinja::from_json(nlohmann::ordered_json::parse(R"({
    "messages": [
      {"role": "system", "content": "You are helpful."},
      {"role": "user", "content": [{"type": "text", "text": "Hi \u00e9 \ud83d\ude00"}]},
      {"role": "assistant", "content": "<think>x</think>ok", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": {"a": 1, "b": [true, null, 2.5]}}}]},
      {"role": "tool", "tool_call_id": "c1", "content": "42"}],
    "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
    "add_generation_prompt": true, "bos_token": "<s>", "eos_token": "</s>", "enable_thinking": false})"));
  auto compiled = jinja::Template::compile(std::string(reinterpret_cast<const char*>(data), size));
  if (!compiled.ok()) return 0;
  jinja::RenderOptions options;
  options.max_output_bytes = 1 << 20;
  options.max_loop_iterations = 1 << 14;
  options.value_limits.max_string_bytes = 1 << 20;
  options.value_limits.max_list_items = 1 << 14;
  (void)compiled->render(context.as_dict(), options);
  return 0;
}
