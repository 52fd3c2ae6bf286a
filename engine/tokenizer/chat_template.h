// Chat formatting per model: turns chat messages into the prompt text a model was trained on.
// pdserve does not run Jinja: a Hugging Face tokenizer_config.json "chat_template" is
// recognised as one of a few well-known families by the markers it contains, and each family is
// rendered by hand-written code; anything else (and llama2.c models, which have no template)
// gets the plain "<role>: <content>" format. It lives beside the tokenizer because both the
// workers (which report the format in Worker.Info) and the router (which renders) need it.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace pdserve::engine {

enum class ChatFormat {
  kPlain,   // "<role>: <content>\n" per message, then "assistant:".
  kLlama3,  // <|start_header_id|>role<|end_header_id|>\n\ncontent<|eot_id|>
  kChatMl,  // <|im_start|>role\ncontent<|im_end|>\n (Qwen, many fine-tunes)
  kLlama2,  // [INST] ... [/INST] with a <<SYS>> block (Llama-2; Mistral models get the same)
};

struct ChatMessage {
  std::string role;
  std::string content;
};

// The family a Jinja chat template belongs to, from its markers; kPlain when none is known
// (including an empty template).
ChatFormat detect_chat_format(std::string_view jinja_template);

// The chat template in a tokenizer_config.json's text: "chat_template" as a string, or from its
// list form ([{"name", "template"}]) the one named "default". Empty when there is none or the
// text is not JSON.
std::string chat_template_from_tokenizer_config(std::string_view config_json);

// The format's name in APIs (ModelInfo.chat_format): "plain", "llama3", "chatml" or "llama2".
std::string chat_format_name(ChatFormat format);

// The prompt for `messages`, ending where the assistant's reply starts. The BOS token is left
// out: the tokenizer adds it when encoding the prompt.
std::string render_chat(ChatFormat format, const std::vector<ChatMessage>& messages);

}  // namespace pdserve::engine
