#include "engine/tokenizer/chat_template.h"

#include "engine/jinja/json_value.h"
#include "engine/jinja/py_string.h"

namespace pdserve::engine {
namespace {

using nlohmann::ordered_json;

// A special token in tokenizer_config.json: a string, or an AddedToken object {"content": ...}.
std::optional<std::string> special_token(const ordered_json& config, const char* key) {
  auto it = config.find(key);
  if (it == config.end()) return std::nullopt;
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string())
    return (*it)["content"].get<std::string>();
  return std::nullopt;
}

std::string content_text(const ChatMessage& m) {
  if (const auto* s = std::get_if<std::string>(&m.content)) return *s;
  std::string out;
  if (const auto* parts = std::get_if<std::vector<ChatContentPart>>(&m.content))
    for (const ChatContentPart& p : *parts) out += p.text;
  return out;
}

jinja::Value message_value(const ChatMessage& m) {
  jinja::Dict d;
  d.set("role", jinja::Value::string(m.role));
  if (const auto* s = std::get_if<std::string>(&m.content)) {
    d.set("content", jinja::Value::string(*s));
  } else if (const auto* parts = std::get_if<std::vector<ChatContentPart>>(&m.content)) {
    std::vector<jinja::Value> items;
    for (const ChatContentPart& p : *parts) {
      jinja::Dict part;
      part.set("type", jinja::Value::string("text"));
      part.set("text", jinja::Value::string(p.text));
      items.push_back(jinja::Value::dict(std::move(part)));
    }
    d.set("content", jinja::Value::list(std::move(items)));
  } else {
    d.set("content", jinja::Value::none());
  }
  if (!m.tool_calls.empty()) {
    std::vector<jinja::Value> calls;
    for (const ChatToolCall& c : m.tool_calls) {
      jinja::Dict function;
      function.set("name", jinja::Value::string(c.name));
      function.set("arguments", jinja::from_json(c.arguments));
      jinja::Dict call;
      call.set("id", jinja::Value::string(c.id));
      call.set("type", jinja::Value::string(c.type));
      call.set("function", jinja::Value::dict(std::move(function)));
      calls.push_back(jinja::Value::dict(std::move(call)));
    }
    d.set("tool_calls", jinja::Value::list(std::move(calls)));
  }
  if (m.tool_call_id) d.set("tool_call_id", jinja::Value::string(*m.tool_call_id));
  if (m.name) d.set("name", jinja::Value::string(*m.name));
  if (m.reasoning_content) d.set("reasoning_content", jinja::Value::string(*m.reasoning_content));
  return jinja::Value::dict(std::move(d));
}

// transformers' continue_final_message: cut the render right after the final message's
// content, so the model continues it instead of starting a new turn.
StatusOr<std::string> cut_after_final_message(std::string rendered, const ChatMessage& last) {
  std::string final_text;
  if (const auto* s = std::get_if<std::string>(&last.content)) {
    final_text = *s;
  } else if (const auto* parts = std::get_if<std::vector<ChatContentPart>>(&last.content); parts && !parts->empty()) {
    final_text = parts->back().text;
  } else {
    return absl::InvalidArgumentError("continue_final_message: the final message has no text to continue");
  }
  const std::string stripped = jinja::py_strip(final_text, jinja::StripSide::kBoth, std::nullopt);
  const size_t at = rendered.rfind(stripped);
  if (at == std::string::npos)
    return absl::InvalidArgumentError(
        "continue_final_message: the final message does not appear in the rendered chat template");
  const std::string left_stripped = jinja::py_strip(final_text, jinja::StripSide::kLeft, std::nullopt);
  // Where the template kept the message's trailing whitespace, keep it too.
  if (rendered.compare(at, left_stripped.size(), final_text) == 0) rendered.resize(at + left_stripped.size());
  else rendered.resize(at + stripped.size());
  return rendered;
}

}  // namespace

std::string chat_format_name(ChatFormat format) {
  switch (format) {
    case ChatFormat::kPlain: return "plain";
    case ChatFormat::kJinja: return "jinja";
  }
  return "plain";
}

ChatTemplate ChatTemplate::plain(std::string reason) {
  ChatTemplate t;
  t.fallback_reason_ = std::move(reason);
  return t;
}

ChatTemplate ChatTemplate::from_tokenizer_config(absl::string_view config_json) {
  const ordered_json config = ordered_json::parse(config_json.begin(), config_json.end(), nullptr,
                                                  /*allow_exceptions=*/false);
  if (!config.is_object()) return plain("tokenizer_config.json is not a JSON object");
  auto it = config.find("chat_template");
  std::optional<std::string> source;
  if (it != config.end() && it->is_string()) {
    source = it->get<std::string>();
  } else if (it != config.end() && it->is_array()) {
    for (const ordered_json& named : *it)
      if (named.is_object() && named.value("name", "") == "default" && named.contains("template") &&
          named["template"].is_string())
        source = named["template"].get<std::string>();
    if (!source) return plain("tokenizer_config.json's chat_template list has no template named \"default\"");
  }
  if (!source) return plain("tokenizer_config.json has no chat_template");
  auto compiled = jinja::Template::compile(*source);
  if (!compiled.ok()) return plain(absl::StrCat("the chat_template does not compile: ", compiled.status().message()));
  ChatTemplate t;
  t.format_ = ChatFormat::kJinja;
  t.template_ = *std::move(compiled);
  t.bos_token_ = special_token(config, "bos_token");
  t.eos_token_ = special_token(config, "eos_token");
  return t;
}

StatusOr<std::string> ChatTemplate::render_plain(const ChatRequest& request) const {
  if (!request.tools.is_null())
    return absl::InvalidArgumentError("'tools' need the model's chat template; this model has none (" +
                                      fallback_reason_ + ")");
  std::string out;
  for (const ChatMessage& m : request.messages) {
    if (!m.tool_calls.empty())
      return absl::InvalidArgumentError("tool calls need the model's chat template; this model has none (" +
                                        fallback_reason_ + ")");
    out += m.role + ": " + content_text(m) + "\n";
  }
  if (request.continue_final_message && !out.empty()) out.pop_back();  // Continue the last message's line.
  else if (request.add_generation_prompt) out += "assistant:";
  return out;
}

StatusOr<std::string> ChatTemplate::render(const ChatRequest& request, std::chrono::system_clock::time_point now) const {
  if (request.continue_final_message && request.add_generation_prompt)
    return absl::InvalidArgumentError("continue_final_message and add_generation_prompt cannot both be true");
  if (request.continue_final_message && request.messages.empty())
    return absl::InvalidArgumentError("continue_final_message needs a final message");
  if (format_ == ChatFormat::kPlain) return render_plain(request);

  jinja::Dict context;
  std::vector<jinja::Value> messages;
  for (const ChatMessage& m : request.messages) messages.push_back(message_value(m));
  context.set("messages", jinja::Value::list(std::move(messages)));
  context.set("tools", request.tools.is_null() ? jinja::Value::none() : jinja::from_json(request.tools));
  context.set("documents", jinja::Value::none());
  context.set("add_generation_prompt", jinja::Value::boolean(request.add_generation_prompt));
  if (bos_token_) context.set("bos_token", jinja::Value::string(*bos_token_));
  if (eos_token_) context.set("eos_token", jinja::Value::string(*eos_token_));
  for (const auto& [key, value] : request.template_kwargs.items()) {
    if (key == "messages" || key == "tools" || key == "documents" || key == "add_generation_prompt")
      return absl::InvalidArgumentError(absl::StrCat("chat_template_kwargs may not set '", key, "'"));
    context.set(key, jinja::from_json(value));
  }
  jinja::RenderOptions options;
  options.now = now;
  auto rendered = template_->render(context, options);
  if (!rendered.ok())
    return absl::InvalidArgumentError(absl::StrCat("the chat template failed: ", rendered.status().message()));
  if (request.continue_final_message) return cut_after_final_message(*std::move(rendered), request.messages.back());
  return rendered;
}

}  // namespace pdserve::engine
