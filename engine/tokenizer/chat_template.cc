#include "engine/tokenizer/chat_template.h"

#include <nlohmann/json.hpp>

namespace pdserve::engine {
namespace {

// Jinja's `trim` / Python's strip(), which the Llama templates apply to each message.
std::string trim(const std::string& s) {
  constexpr const char* kSpace = " \t\r\n\f\v";
  const size_t begin = s.find_first_not_of(kSpace);
  if (begin == std::string::npos) return "";
  return s.substr(begin, s.find_last_not_of(kSpace) - begin + 1);
}

std::string render_plain(const std::vector<ChatMessage>& messages) {
  std::string out;
  for (const ChatMessage& m : messages) out += m.role + ": " + m.content + "\n";
  return out + "assistant:";
}

// Meta's Llama-3 template (add_generation_prompt = true).
std::string render_llama3(const std::vector<ChatMessage>& messages) {
  std::string out;
  for (const ChatMessage& m : messages)
    out += "<|start_header_id|>" + m.role + "<|end_header_id|>\n\n" + trim(m.content) + "<|eot_id|>";
  return out + "<|start_header_id|>assistant<|end_header_id|>\n\n";
}

// ChatML as Qwen2 and most fine-tunes write it (add_generation_prompt = true). Qwen's own
// templates add a default system message when there is none; that wording differs per release,
// so it is left to the client.
std::string render_chatml(const std::vector<ChatMessage>& messages) {
  std::string out;
  for (const ChatMessage& m : messages) out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
  return out + "<|im_start|>assistant\n";
}

// Meta's Llama-2 template: a leading system message goes into the first user turn's <<SYS>>
// block, every user turn but the first starts with BOS (the first one's comes from the
// tokenizer), every assistant turn ends with EOS. Other roles are rendered as user turns.
std::string render_llama2(const std::vector<ChatMessage>& messages) {
  std::string out, system;
  size_t i = 0;
  if (!messages.empty() && messages[0].role == "system") {
    system = "<<SYS>>\n" + messages[0].content + "\n<</SYS>>\n\n";
    i = 1;
  }
  bool first_user = true;
  for (; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if (m.role == "assistant") {
      out += " " + trim(m.content) + " </s>";
      continue;
    }
    if (!first_user) out += "<s>";
    out += "[INST] " + trim((first_user ? system : "") + m.content) + " [/INST]";
    first_user = false;
  }
  return out;
}

}  // namespace

ChatFormat detect_chat_format(std::string_view jinja_template) {
  auto has = [&](std::string_view marker) { return jinja_template.find(marker) != std::string_view::npos; };
  if (has("<|start_header_id|>") && has("<|end_header_id|>")) return ChatFormat::kLlama3;
  if (has("<|im_start|>") && has("<|im_end|>")) return ChatFormat::kChatMl;
  if (has("[INST]") && has("[/INST]")) return ChatFormat::kLlama2;
  return ChatFormat::kPlain;
}

std::string chat_template_from_tokenizer_config(std::string_view config_json) {
  const nlohmann::json j = nlohmann::json::parse(config_json, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return "";
  auto it = j.find("chat_template");
  if (it == j.end()) return "";
  if (it->is_string()) return it->get<std::string>();
  if (!it->is_array()) return "";
  for (const nlohmann::json& named : *it)
    if (named.is_object() && named.value("name", "") == "default" && named.contains("template") &&
        named["template"].is_string())
      return named["template"].get<std::string>();
  return "";
}

std::string chat_format_name(ChatFormat format) {
  switch (format) {
    case ChatFormat::kPlain: return "plain";
    case ChatFormat::kLlama3: return "llama3";
    case ChatFormat::kChatMl: return "chatml";
    case ChatFormat::kLlama2: return "llama2";
  }
  return "plain";
}

std::string render_chat(ChatFormat format, const std::vector<ChatMessage>& messages) {
  switch (format) {
    case ChatFormat::kLlama3: return render_llama3(messages);
    case ChatFormat::kChatMl: return render_chatml(messages);
    case ChatFormat::kLlama2: return render_llama2(messages);
    case ChatFormat::kPlain: break;
  }
  return render_plain(messages);
}

}  // namespace pdserve::engine
