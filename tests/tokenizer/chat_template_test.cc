// Chat formats (engine/tokenizer/chat_template.h): family recognition from real-world Jinja
// templates, the tokenizer_config.json forms, and each family's exact prompt text.
#include "engine/tokenizer/chat_template.h"

#include <gtest/gtest.h>

namespace pdserve::engine {
namespace {

// Abridged from the templates the families ship with: only the markers matter.
constexpr const char* kLlama3Template =
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + "
    "message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}{{ content }}{% endfor %}";
constexpr const char* kQwen2Template =
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + "
    "'\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";
constexpr const char* kLlama2Template =
    "{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}{% elif "
    "message['role'] == 'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}";
constexpr const char* kMistralTemplate =
    "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] "
    "+ ' [/INST]' }}{% else %}{{ message['content'] + eos_token}}{% endif %}{% endfor %}";

TEST(ChatTemplate, RecognisesFamiliesByMarkers) {
  struct Case {
    const char* jinja;
    ChatFormat want;
  };
  for (const Case& c : std::vector<Case>{{kLlama3Template, ChatFormat::kLlama3},
                                         {kQwen2Template, ChatFormat::kChatMl},
                                         {kLlama2Template, ChatFormat::kLlama2},
                                         {kMistralTemplate, ChatFormat::kLlama2},
                                         {"", ChatFormat::kPlain},
                                         {"{{ messages[0]['content'] }}", ChatFormat::kPlain},
                                         {"<|im_start|> without its end", ChatFormat::kPlain}})
    EXPECT_EQ(detect_chat_format(c.jinja), c.want) << c.jinja;
}

TEST(ChatTemplate, ReadsTokenizerConfigForms) {
  EXPECT_EQ(chat_template_from_tokenizer_config(R"({"chat_template": "T", "bos_token": "<s>"})"), "T");
  EXPECT_EQ(chat_template_from_tokenizer_config(
                R"({"chat_template": [{"name": "tool_use", "template": "X"}, {"name": "default", "template": "D"}]})"),
            "D");
  EXPECT_EQ(chat_template_from_tokenizer_config(R"({"bos_token": "<s>"})"), "");
  EXPECT_EQ(chat_template_from_tokenizer_config(R"({"chat_template": null})"), "");
  EXPECT_EQ(chat_template_from_tokenizer_config("not json"), "");
}

TEST(ChatTemplate, RendersEachFamilyExactly) {
  const std::vector<ChatMessage> conversation = {
      {"system", "Be brief."}, {"user", " Hi "}, {"assistant", "Hello!"}, {"user", "Tell a story"}};
  const std::vector<ChatMessage> single = {{"user", "Hi"}};
  struct Case {
    ChatFormat format;
    const std::vector<ChatMessage>* messages;
    std::string want;
  };
  const std::vector<Case> cases = {
      {ChatFormat::kPlain, &conversation,
       "system: Be brief.\nuser:  Hi \nassistant: Hello!\nuser: Tell a story\nassistant:"},
      {ChatFormat::kPlain, &single, "user: Hi\nassistant:"},
      {ChatFormat::kLlama3, &conversation,
       "<|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
       "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
       "<|start_header_id|>assistant<|end_header_id|>\n\nHello!<|eot_id|>"
       "<|start_header_id|>user<|end_header_id|>\n\nTell a story<|eot_id|>"
       "<|start_header_id|>assistant<|end_header_id|>\n\n"},
      {ChatFormat::kLlama3, &single,
       "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"},
      {ChatFormat::kChatMl, &conversation,
       "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n Hi <|im_end|>\n"
       "<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\nTell a story<|im_end|>\n<|im_start|>assistant\n"},
      {ChatFormat::kChatMl, &single, "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"},
      {ChatFormat::kLlama2, &conversation,
       "[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\n Hi [/INST] Hello! </s><s>[INST] Tell a story [/INST]"},
      {ChatFormat::kLlama2, &single, "[INST] Hi [/INST]"},
  };
  for (const Case& c : cases) EXPECT_EQ(render_chat(c.format, *c.messages), c.want) << chat_format_name(c.format);
}

TEST(ChatTemplate, NamesFormats) {
  EXPECT_EQ(chat_format_name(ChatFormat::kPlain), "plain");
  EXPECT_EQ(chat_format_name(ChatFormat::kLlama3), "llama3");
  EXPECT_EQ(chat_format_name(ChatFormat::kChatMl), "chatml");
  EXPECT_EQ(chat_format_name(ChatFormat::kLlama2), "llama2");
}

}  // namespace
}  // namespace pdserve::engine
