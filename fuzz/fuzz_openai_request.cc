// The OpenAI HTTP request parser on arbitrary bodies (completions and chat, with the plain
// format and with a Jinja chat template that reads every message field): malformed JSON,
// wrong types, out-of-range numbers and template failures must give InvalidArgument, never a
// crash.
#include <cstddef>
#include <cstdint>
#include <string>

#include "router/openai_request.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace pdserve;
  static const engine::ChatTemplate plain = engine::ChatTemplate::plain("fuzzing the plain format");
  static const engine::ChatTemplate jinja = engine::ChatTemplate::from_tokenizer_config(R"({"chat_template":
    "{% for m in messages %}<|{{ m.role }}|>{{ m.content if m.content is string else m.content | tojson }}{% for c in m.tool_calls | default([]) %}{{ c.function.name }}{{ c.function.arguments | tojson }}{% endfor %}{% endfor %}{% if tools %}{{ tools | tojson(indent=2) }}{% endif %}{% if add_generation_prompt %}<|assistant|>{% endif %}{% if enable_thinking is false %}<think></think>{% endif %}",
    "bos_token": "<s>"})");
  if (size == 0) return 0;
  const bool chat = data[0] & 1;
  const engine::ChatTemplate& chat_template = (data[0] & 2) ? jinja : plain;
  const std::string body(reinterpret_cast<const char*>(data) + 1, size - 1);
  (void)router::parse_openai_request(body, chat, chat_template);
  return 0;
}
