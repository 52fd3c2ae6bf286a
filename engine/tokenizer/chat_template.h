// Chat formatting per model: turns a chat request's messages into the prompt text the model
// was trained on by rendering the model's own Jinja chat_template (tokenizer_config.json) with
// pdserve's interpreter (engine/jinja/), in the context transformers gives it: messages,
// tools, add_generation_prompt, the bos/eos token strings, and the request's
// chat_template_kwargs (e.g. Qwen3's enable_thinking). A model with no template (llama2.c
// checkpoints) or one that does not compile gets the plain "<role>: <content>" format, and
// says why (ChatTemplate::fallback_reason, reported in ModelInfo). It lives beside the
// tokenizer because the template travels with it, and both the workers (which report the
// format) and the router (which renders) need it.
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/strings/string_view.h"
#include "common/status.h"
#include "engine/jinja/template.h"

namespace pdserve::engine {

enum class ChatFormat {
  kPlain,  // "<role>: <content>\n" per message, then "assistant:".
  kJinja,  // The model's chat_template.
};

// The format's name in APIs (ModelInfo.chat_format): "plain" or "jinja".
std::string chat_format_name(ChatFormat format);

struct ChatContentPart {  // {"type": "text", "text": ...}: the only part type served.
  std::string text;
};

struct ChatToolCall {
  std::string id;
  std::string type = "function";
  std::string name;
  // The arguments as the template sees them: the parsed object when the request's JSON
  // string parses (as transformers and vLLM pass them), else the string as sent.
  nlohmann::ordered_json arguments;
};

struct ChatMessage {
  std::string role;
  // A string, a list of text parts (kept as a list: templates iterate over it), or none.
  std::variant<std::monostate, std::string, std::vector<ChatContentPart>> content;
  std::vector<ChatToolCall> tool_calls;
  std::optional<std::string> tool_call_id;
  std::optional<std::string> name;
  std::optional<std::string> reasoning_content;
};

struct ChatRequest {
  std::vector<ChatMessage> messages;
  nlohmann::ordered_json tools;  // The tool definitions as sent (an array), or null.
  bool add_generation_prompt = true;
  // Leave the last (assistant) message open for the model to continue, cutting the render
  // after its content as transformers does; excludes add_generation_prompt.
  bool continue_final_message = false;
  nlohmann::ordered_json template_kwargs = nlohmann::ordered_json::object();  // chat_template_kwargs.
};

class ChatTemplate {
 public:
  // The plain format, with the reason the model has no usable template.
  static ChatTemplate plain(std::string reason);
  // From a tokenizer_config.json's text: "chat_template" as a string, or from its list form
  // ([{"name", "template"}]) the one named "default", compiled; the plain format when there
  // is none or it does not compile (the reason says which, with the compile error).
  static ChatTemplate from_tokenizer_config(absl::string_view config_json);

  ChatFormat format() const { return format_; }
  // Why the plain format is used; empty for a Jinja template.
  const std::string& fallback_reason() const { return fallback_reason_; }

  // The prompt for `request`; `now` is what strftime_now() formats. A template's
  // raise_exception or any render error is InvalidArgument with its message.
  StatusOr<std::string> render(const ChatRequest& request, std::chrono::system_clock::time_point now) const;

 private:
  ChatTemplate() = default;
  StatusOr<std::string> render_plain(const ChatRequest& request) const;

  ChatFormat format_ = ChatFormat::kPlain;
  std::optional<jinja::Template> template_;
  std::optional<std::string> bos_token_;
  std::optional<std::string> eos_token_;
  std::string fallback_reason_;
};

}  // namespace pdserve::engine
