// Chat templates (engine/tokenizer/chat_template.h): where the template comes from in
// tokenizer_config.json, the visible fallback to the plain format, the context a template
// sees (messages with content parts and tool calls, tools, bos/eos, chat_template_kwargs),
// continue_final_message, and errors. Rendering itself is checked against jinja2 and
// @huggingface/jinja by the chat_template_oracle test (tests/reference/).
#include "engine/tokenizer/chat_template.h"

#include <gtest/gtest.h>

namespace pdserve::engine {
namespace {

using nlohmann::ordered_json;

constexpr const char* kChatMl =
    "{% for m in messages %}{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

std::chrono::system_clock::time_point fixed_now() {
  return std::chrono::system_clock::time_point(std::chrono::seconds(1721985300));  // 2024-07-26 09:15 UTC
}

ChatTemplate compile(const std::string& jinja, ordered_json extra = ordered_json::object()) {
  extra["chat_template"] = jinja;
  return ChatTemplate::from_tokenizer_config(extra.dump());
}

ChatMessage text_message(std::string role, std::string content) {
  ChatMessage m;
  m.role = std::move(role);
  m.content = std::move(content);
  return m;
}

std::string render(const ChatTemplate& t, const ChatRequest& r) {
  auto text = t.render(r, fixed_now());
  EXPECT_TRUE(text.ok()) << text.status();
  return text.ok() ? *text : "";
}

TEST(ChatTemplate, TakesTheTemplateFromTokenizerConfig) {
  ChatRequest r;
  r.messages = {text_message("user", "Hi")};
  const ChatTemplate direct = ChatTemplate::from_tokenizer_config(R"({"chat_template": "[{{ messages[0].content }}]"})");
  EXPECT_EQ(direct.format(), ChatFormat::kJinja);
  EXPECT_EQ(direct.fallback_reason(), "");
  EXPECT_EQ(render(direct, r), "[Hi]");
  const ChatTemplate named = ChatTemplate::from_tokenizer_config(
      R"({"chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D{{ 1 + 1 }}"}]})");
  EXPECT_EQ(named.format(), ChatFormat::kJinja);
  EXPECT_EQ(render(named, r), "D2");
}

TEST(ChatTemplate, FallsBackToPlainVisibly) {
  struct Case {
    std::string config;
    std::string reason;  // A part of the fallback reason.
  };
  for (const Case& c : std::vector<Case>{
           {R"({"bos_token": "<s>"})", "has no chat_template"},
           {R"({"chat_template": null})", "has no chat_template"},
           {R"({"chat_template": [{"name": "tool_use", "template": "T"}]})", "no template named \"default\""},
           {"not json", "not a JSON object"},
           {R"({"chat_template": "{% include 'other.jinja' %}"})", "the 'include' tag is not supported"},
           {R"({"chat_template": "{{ messages | nosuchfilter }}"})", "no filter named 'nosuchfilter'"},
           {R"({"chat_template": "{% for m in messages %}"})", "unclosed 'for' block"},
       }) {
    const ChatTemplate t = ChatTemplate::from_tokenizer_config(c.config);
    EXPECT_EQ(t.format(), ChatFormat::kPlain) << c.config;
    EXPECT_NE(t.fallback_reason().find(c.reason), std::string::npos) << c.config << " -> " << t.fallback_reason();
  }
  EXPECT_EQ(chat_format_name(ChatFormat::kPlain), "plain");
  EXPECT_EQ(chat_format_name(ChatFormat::kJinja), "jinja");
}

TEST(ChatTemplate, PlainFormatIsRoleColonContent) {
  const ChatTemplate plain = ChatTemplate::plain("no template");
  ChatRequest r;
  r.messages = {text_message("system", "Be brief."), text_message("user", "Hi")};
  EXPECT_EQ(render(plain, r), "system: Be brief.\nuser: Hi\nassistant:");
  r.add_generation_prompt = false;
  EXPECT_EQ(render(plain, r), "system: Be brief.\nuser: Hi\n");
  ChatMessage parts;
  parts.role = "user";
  parts.content = std::vector<ChatContentPart>{{"a "}, {"b"}};
  r.messages = {parts};
  r.add_generation_prompt = true;
  EXPECT_EQ(render(plain, r), "user: a b\nassistant:");
  // Tools need a template: the plain format cannot show them, so it refuses.
  r.tools = ordered_json::array({{{"type", "function"}}});
  auto refused = plain.render(r, fixed_now());
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("no template"), std::string::npos) << refused.status();
}

// What a template sees: the fields it is given, with the structure the request had.
TEST(ChatTemplate, GivesTheTemplateTransformersContext) {
  const ChatTemplate t = compile(
      "{{ bos_token }}|{{ eos_token }}|{{ add_generation_prompt }}|{{ tools | tojson }}|{{ documents }}|"
      "{% for m in messages %}{{ m.role }}:{{ m.content | tojson }}"
      "{% if m.tool_calls is defined %} calls={{ m.tool_calls | tojson }}{% endif %}"
      "{% if m.tool_call_id is defined %} id={{ m.tool_call_id }}{% endif %}"
      "{% if m.name is defined %} name={{ m.name }}{% endif %}"
      "{% if m.reasoning_content is defined %} reasoning={{ m.reasoning_content }}{% endif %};{% endfor %}"
      "{% if enable_thinking is defined %}thinking={{ enable_thinking }}{% endif %}|{{ strftime_now('%Y-%m-%d') }}",
      {{"bos_token", {{"content", "<s>"}, {"lstrip", false}}}, {"eos_token", "</s>"}});
  ChatRequest r;
  ChatMessage parts;
  parts.role = "user";
  parts.content = std::vector<ChatContentPart>{{"look"}, {"here"}};
  ChatMessage call;
  call.role = "assistant";
  call.reasoning_content = "hmm";
  call.tool_calls.push_back({"c1", "function", "get", ordered_json::parse(R"({"b": 1, "a": [true]})")});
  ChatMessage result = text_message("tool", "42");
  result.tool_call_id = "c1";
  result.name = "get";
  r.messages = {parts, call, result};
  r.tools = ordered_json::parse(R"([{"type": "function", "function": {"name": "get"}}])");
  r.template_kwargs = {{"enable_thinking", false}};
  EXPECT_EQ(render(t, r),
            "<s>|</s>|True|[{\"type\": \"function\", \"function\": {\"name\": \"get\"}}]|None|"
            "user:[{\"type\": \"text\", \"text\": \"look\"}, {\"type\": \"text\", \"text\": \"here\"}];"
            "assistant:null calls=[{\"id\": \"c1\", \"type\": \"function\", \"function\": {\"name\": \"get\", "
            "\"arguments\": {\"b\": 1, \"a\": [true]}}}] reasoning=hmm;"
            "tool:\"42\" id=c1 name=get;thinking=False|2024-07-26");
}

TEST(ChatTemplate, WithoutToolsTheTemplateSeesNone) {
  const ChatTemplate t = compile("{{ tools is none }}{{ bos_token is defined }}");
  ChatRequest r;
  r.messages = {text_message("user", "x")};
  EXPECT_EQ(render(t, r), "TrueFalse");
}

// transformers' rule: the render is cut right after the final message's content.
TEST(ChatTemplate, ContinueFinalMessageCutsAfterIt) {
  const ChatTemplate t = compile(kChatMl);
  ChatRequest r;
  r.messages = {text_message("user", "Hi"), text_message("assistant", "Hello, I am")};
  r.add_generation_prompt = false;
  r.continue_final_message = true;
  EXPECT_EQ(render(t, r), "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello, I am");
  r.add_generation_prompt = true;
  auto both = t.render(r, fixed_now());
  ASSERT_FALSE(both.ok());
  EXPECT_NE(both.status().message().find("cannot both be true"), std::string::npos);
  // A template that drops the message cannot be continued.
  const ChatTemplate dropping = compile("{{ messages[0].content }}");
  r.add_generation_prompt = false;
  auto missing = dropping.render(r, fixed_now());
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("does not appear"), std::string::npos);
}

TEST(ChatTemplate, RenderErrorsAreInvalidArgumentWithTheMessage) {
  const ChatTemplate t = compile(
      "{% if messages[0].role != 'system' %}{{ raise_exception('The first message must be a system message') }}{% endif %}");
  ChatRequest r;
  r.messages = {text_message("user", "x")};
  auto raised = t.render(r, fixed_now());
  ASSERT_FALSE(raised.ok());
  EXPECT_EQ(raised.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(raised.status().message().find("The first message must be a system message"), std::string::npos)
      << raised.status();
  r.template_kwargs = {{"messages", 1}};
  auto overriding = compile(kChatMl).render(r, fixed_now());
  ASSERT_FALSE(overriding.ok());
  EXPECT_NE(overriding.status().message().find("may not set 'messages'"), std::string::npos);
}

}  // namespace
}  // namespace pdserve::engine
