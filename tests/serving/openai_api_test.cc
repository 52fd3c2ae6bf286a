// Table tests of the OpenAI mapping's issue-15 surface (router/openai_request.h and
// router/openai_response.h): every sampling and response field a request may give, the fields
// refused and the ones ignored, batched prompts, vLLM's tokenize/detokenize bodies, and the
// response objects (logprobs in both formats, echo, choice indices, usage).
#include "router/openai_request.h"
#include "router/openai_response.h"

#include <gtest/gtest.h>

#include <functional>

namespace pdserve::router {
namespace {

using nlohmann::json;

// Token t decodes to "w<t>", with a space before it unless it starts the text; 0 is special ("").
class FakeTokenizer : public engine::Tokenizer {
 public:
  StatusOr<std::vector<int>> encode(std::string_view, bool) const override { return std::vector<int>{0}; }
  std::string decode_token(int prev, int token) const override {
    if (token == 0) return "";
    return (prev <= 0 ? "" : " ") + std::string("w") + std::to_string(token);
  }
  std::string special_token_text(int token) const override { return token == 0 ? "<s0>" : ""; }
  int vocab_size() const override { return 100; }
  int bos_id() const override { return 0; }
  int eos_id() const override { return 1; }
};

v1::TokenLogprob lp(int id, float logprob, std::vector<std::pair<int, float>> top) {
  v1::TokenLogprob l;
  l.set_token_id(id);
  l.set_logprob(logprob);
  for (auto [t, v] : top) {
    l.add_top_ids(t);
    l.add_top_logprobs(v);
  }
  return l;
}

TEST(OpenAiFields, AcceptedValuesReachTheGenerateRequest) {
  struct Case {
    const char* body;
    bool chat;
    std::function<void(const OpenAiRequest&)> check;
  };
  const std::vector<Case> cases = {
      {R"({"prompt":"x","frequency_penalty":1.5,"presence_penalty":-0.5})", false,
       [](const OpenAiRequest& r) {
         EXPECT_FLOAT_EQ(r.request.sampling().frequency_penalty(), 1.5f);
         EXPECT_FLOAT_EQ(r.request.sampling().presence_penalty(), -0.5f);
       }},
      {R"({"prompt":"x","frequency_penalty":-2,"presence_penalty":2})", false,
       [](const OpenAiRequest& r) {
         EXPECT_FLOAT_EQ(r.request.sampling().frequency_penalty(), -2.0f);
         EXPECT_FLOAT_EQ(r.request.sampling().presence_penalty(), 2.0f);
       }},
      // Biases clamped to [-100, 100], as vLLM does.
      {R"({"prompt":"x","logit_bias":{"5":250,"7":-3.5,"9":-1000}})", false,
       [](const OpenAiRequest& r) {
         const auto& b = r.request.sampling().logit_bias();
         ASSERT_EQ(b.size(), 3u);
         EXPECT_FLOAT_EQ(b.at(5), 100.0f);
         EXPECT_FLOAT_EQ(b.at(7), -3.5f);
         EXPECT_FLOAT_EQ(b.at(9), -100.0f);
       }},
      {R"({"prompt":"x","min_tokens":3,"max_tokens":5})", false,
       [](const OpenAiRequest& r) { EXPECT_EQ(r.request.sampling().min_tokens(), 3); }},
      {R"({"prompt":"x","stop_token_ids":[4,6],"seed":11,"ignore_eos":true,"repetition_penalty":1.3})", false,
       [](const OpenAiRequest& r) {
         EXPECT_EQ(r.request.sampling().stop_token_ids_size(), 2);
         EXPECT_EQ(r.request.sampling().seed(), 11);
         EXPECT_TRUE(r.request.sampling().ignore_eos());
         EXPECT_FLOAT_EQ(r.request.sampling().repetition_penalty(), 1.3f);
       }},
      {R"({"prompt":"x","skip_special_tokens":false})", false,
       [](const OpenAiRequest& r) {
         ASSERT_TRUE(r.request.sampling().has_skip_special_tokens());
         EXPECT_FALSE(r.request.sampling().skip_special_tokens());
       }},
      {R"({"prompt":"x"})", false,
       [](const OpenAiRequest& r) {
         EXPECT_FALSE(r.request.sampling().has_skip_special_tokens());
         EXPECT_FALSE(r.request.sampling().has_logprobs());
         EXPECT_FALSE(r.request.sampling().has_prompt_logprobs());
         EXPECT_EQ(r.n, 1);
         EXPECT_EQ(r.best_of, 1);
         EXPECT_EQ(r.logprobs, -1);
         EXPECT_TRUE(r.ignored_fields.empty());
       }},
      // n and best_of stay at the front end (the samples are fanned out there).
      {R"({"prompt":"x","n":3})", false,
       [](const OpenAiRequest& r) {
         EXPECT_EQ(r.n, 3);
         EXPECT_EQ(r.best_of, 3);
         EXPECT_EQ(r.request.sampling().n(), 0);
       }},
      {R"({"prompt":"x","n":2,"best_of":4})", false,
       [](const OpenAiRequest& r) {
         EXPECT_EQ(r.best_of, 4);
         EXPECT_EQ(r.logprobs, -1);                      // Not in the response...
         EXPECT_EQ(r.request.sampling().logprobs(), 0);  // ...but computed, to rank the samples.
       }},
      {R"({"prompt":"x","n":2,"best_of":4,"logprobs":3})", false,
       [](const OpenAiRequest& r) { EXPECT_EQ(r.request.sampling().logprobs(), 3); }},
      {R"({"prompt":"x","logprobs":2})", false,
       [](const OpenAiRequest& r) {
         EXPECT_EQ(r.logprobs, 2);
         EXPECT_EQ(r.request.sampling().logprobs(), 2);
         EXPECT_FALSE(r.request.sampling().has_prompt_logprobs());
       }},
      {R"({"prompt":"x","logprobs":0})", false,
       [](const OpenAiRequest& r) { EXPECT_EQ(r.request.sampling().logprobs(), 0); }},
      {R"({"prompt":"x","echo":true})", false,
       [](const OpenAiRequest& r) {
         EXPECT_TRUE(r.echo);
         EXPECT_FALSE(r.request.sampling().has_prompt_logprobs());
       }},
      // echo with logprobs: the prompt's logprobs, from the prefill pass.
      {R"({"prompt":"x","echo":true,"logprobs":1})", false,
       [](const OpenAiRequest& r) { EXPECT_EQ(r.request.sampling().prompt_logprobs(), 1); }},
      {R"({"prompt":"x","logprobs":null,"echo":false,"best_of":null,"n":null})", false,
       [](const OpenAiRequest& r) {
         EXPECT_FALSE(r.request.sampling().has_logprobs());
         EXPECT_EQ(r.n, 1);
       }},
      {R"({"prompt":"x","stream":true,"stream_options":{"include_usage":true}})", false,
       [](const OpenAiRequest& r) { EXPECT_TRUE(r.include_usage); }},
      // Chat: logprobs is a boolean, top_logprobs the count.
      {R"({"messages":[{"role":"user","content":"Hi"}],"logprobs":true,"top_logprobs":2})", true,
       [](const OpenAiRequest& r) {
         EXPECT_EQ(r.logprobs, 2);
         EXPECT_EQ(r.request.sampling().logprobs(), 2);
       }},
      {R"({"messages":[{"role":"user","content":"Hi"}],"logprobs":true})", true,
       [](const OpenAiRequest& r) { EXPECT_EQ(r.request.sampling().logprobs(), 0); }},
      {R"({"messages":[{"role":"user","content":"Hi"}],"logprobs":false})", true,
       [](const OpenAiRequest& r) { EXPECT_FALSE(r.request.sampling().has_logprobs()); }},
      {R"({"messages":[{"role":"user","content":"Hi"}],"n":2,"max_tokens":9,"max_completion_tokens":4})", true,
       [](const OpenAiRequest& r) {
         EXPECT_EQ(r.n, 2);
         EXPECT_EQ(r.request.sampling().max_tokens(), 4);  // The newer name wins.
         EXPECT_TRUE(r.max_tokens_given);
       }},
      {R"({"messages":[{"role":"user","content":"Hi"}],"max_completion_tokens":7})", true,
       [](const OpenAiRequest& r) { EXPECT_EQ(r.request.sampling().max_tokens(), 7); }},
      // Neutral values of unsupported fields change nothing and are accepted.
      {R"({"prompt":"x","suffix":"","bad_words":[],"use_beam_search":false,"min_p":0,"response_format":{"type":"text"},
          "add_special_tokens":true,"include_stop_str_in_output":false,"guided_json":null})",
       false, [](const OpenAiRequest& r) { EXPECT_TRUE(r.ignored_fields.empty()); }},
      // Unknown fields: accepted, listed for the warning in the order sent (vLLM's behaviour).
      {R"({"prompt":"x","user":"u1","frobnicate":3})", false,
       [](const OpenAiRequest& r) {
         EXPECT_EQ(r.ignored_fields, (std::vector<std::string>{"user", "frobnicate"}));
       }},
      {R"({"messages":[{"role":"user","content":"Hi"}],"echo_not_a_field":1,"tool_choice":"none"})", true,
       [](const OpenAiRequest& r) { EXPECT_EQ(r.ignored_fields.size(), 2u); }},
  };
  for (const Case& c : cases) {
    auto r = parse_openai_request(c.body, c.chat);
    ASSERT_TRUE(r.ok()) << c.body << ": " << r.status();
    SCOPED_TRACE(c.body);
    c.check(*r);
  }
}

TEST(OpenAiFields, BadValuesAreRefusedNamingTheField) {
  struct Case {
    const char* body;
    bool chat;
    const char* mentions;
  } cases[] = {
      {R"({"prompt":"x","n":0})", false, "'n' must be in [1, 16]"},
      {R"({"prompt":"x","n":17})", false, "'n'"},
      {R"({"prompt":"x","n":"2"})", false, "'n'"},
      {R"({"prompt":"x","n":2,"best_of":1})", false, "'best_of' must be >= n"},
      {R"({"prompt":"x","best_of":2,"stream":true})", false, "'best_of' must equal n when streaming"},
      {R"({"prompt":"x","best_of":17})", false, "'best_of'"},
      {R"({"prompt":"x","logprobs":21})", false, "'logprobs' must be in [0, 20]"},
      {R"({"prompt":"x","logprobs":-1})", false, "'logprobs'"},
      {R"({"prompt":"x","logprobs":true})", false, "'logprobs' must be a number"},
      {R"({"prompt":"x","echo":1})", false, "'echo'"},
      {R"({"prompt":"x","frequency_penalty":3})", false, "'frequency_penalty' must be in [-2, 2]"},
      {R"({"prompt":"x","presence_penalty":-2.5})", false, "'presence_penalty'"},
      {R"({"prompt":"x","frequency_penalty":"high"})", false, "'frequency_penalty'"},
      {R"({"prompt":"x","logit_bias":{"abc":1}})", false, "'logit_bias' key 'abc'"},
      {R"({"prompt":"x","logit_bias":{"-3":1}})", false, "'logit_bias' key '-3'"},
      {R"({"prompt":"x","logit_bias":{"3x":1}})", false, "'logit_bias' key '3x'"},
      {R"({"prompt":"x","logit_bias":{"3":"up"}})", false, "'logit_bias' bias of '3'"},
      {R"({"prompt":"x","logit_bias":[1]})", false, "'logit_bias'"},
      {R"({"prompt":"x","min_tokens":-1})", false, "'min_tokens'"},
      {R"({"prompt":"x","min_tokens":9,"max_tokens":5})", false, "'min_tokens' must be <= max_tokens"},
      {R"({"prompt":"x","skip_special_tokens":"no"})", false, "'skip_special_tokens'"},
      {R"({"prompt":"x","stream_options":{"include_usage":true}})", false, "'stream_options' is only allowed"},
      {R"({"prompt":"x","stream":true,"stream_options":{"continuous_usage_stats":true}})", false,
       "'stream_options.continuous_usage_stats'"},
      {R"({"prompt":[]})", false, "'prompt'"},
      {R"({"prompt":["a",[1]]})", false, "'prompt'"},
      {R"({"prompt":[[1],"a"]})", false, "'prompt'"},
      {R"({"prompt":[[1,-2]]})", false, "'prompt'"},
      {R"({"prompt":[{"a":1}]})", false, "'prompt'"},
      {R"({"messages":[{"role":"user","content":"Hi"}],"top_logprobs":21,"logprobs":true})", true, "'top_logprobs'"},
      {R"({"messages":[{"role":"user","content":"Hi"}],"top_logprobs":2})", true,
       "'top_logprobs' needs 'logprobs': true"},
      {R"({"messages":[{"role":"user","content":"Hi"}],"logprobs":2})", true, "'logprobs' must be a boolean"},
      {R"({"messages":[{"role":"user","content":"Hi"}],"n":0})", true, "'n'"},
  };
  for (const Case& c : cases) {
    auto r = parse_openai_request(c.body, c.chat);
    ASSERT_FALSE(r.ok()) << c.body;
    EXPECT_TRUE(absl::IsInvalidArgument(r.status())) << c.body;
    EXPECT_EQ(http_error(r.status()).status, 400) << c.body;
    EXPECT_NE(r.status().message().find(c.mentions), std::string_view::npos) << c.body << ": " << r.status();
  }
  // 2 x 16 = 32 choices are fine; more than kMaxChoices in all are not.
  EXPECT_TRUE(parse_openai_request(R"({"prompt":["a","b"],"best_of":16,"n":16})", false).ok());
  json many = {{"prompt", json::array()}, {"n", 4}};
  for (int i = 0; i < 40; ++i) many["prompt"].push_back("p");
  auto r = parse_openai_request(many.dump(), false);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("prompts x samples"), std::string_view::npos) << r.status();
  json batch = {{"prompt", json::array()}};
  for (int i = 0; i <= kMaxBatchPrompts; ++i) batch["prompt"].push_back("p");
  EXPECT_FALSE(parse_openai_request(batch.dump(), false).ok());
  json bias = {{"prompt", "x"}, {"logit_bias", json::object()}};
  for (int i = 0; i <= 1024; ++i) bias["logit_bias"][std::to_string(i)] = 1;
  auto b = parse_openai_request(bias.dump(), false);
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.status().message().find("'logit_bias' may hold at most 1024"), std::string_view::npos) << b.status();
}

// Known fields pdserve cannot honour: 400 naming them (never silently ignored).
TEST(OpenAiFields, UnsupportedFieldsAreRefused) {
  struct Case {
    const char* body;
    bool chat;
    const char* field;
  } cases[] = {
      {R"({"prompt":"x","suffix":"tail"})", false, "'suffix' is not supported"},
      {R"({"prompt":"x","bad_words":["a"]})", false, "'bad_words'"},
      {R"({"prompt":"x","allowed_token_ids":[1]})", false, "'allowed_token_ids'"},
      {R"({"prompt":"x","guided_json":{}})", false, "'guided_json'"},
      {R"({"prompt":"x","guided_regex":"a+"})", false, "'guided_regex'"},
      {R"({"prompt":"x","guided_choice":["a"]})", false, "'guided_choice'"},
      {R"({"prompt":"x","guided_grammar":"g"})", false, "'guided_grammar'"},
      {R"({"prompt":"x","structured_outputs":{}})", false, "'structured_outputs'"},
      {R"({"prompt":"x","response_format":{"type":"json_object"}})", false, "'response_format'"},
      {R"({"prompt":"x","use_beam_search":true})", false, "'use_beam_search'"},
      {R"({"prompt":"x","length_penalty":0.5})", false, "'length_penalty'"},
      {R"({"prompt":"x","min_p":0.1})", false, "'min_p'"},
      {R"({"prompt":"x","prompt_logprobs":1})", false, "'prompt_logprobs'"},
      {R"({"prompt":"x","include_stop_str_in_output":true})", false, "'include_stop_str_in_output'"},
      {R"({"prompt":"x","spaces_between_special_tokens":false})", false, "'spaces_between_special_tokens'"},
      {R"({"prompt":"x","truncate_prompt_tokens":5})", false, "'truncate_prompt_tokens'"},
      {R"({"prompt":"x","priority":1})", false, "'priority'"},
      {R"({"prompt":"x","add_special_tokens":false})", false, "'add_special_tokens'"},
      {R"({"messages":[{"role":"user","content":"Hi"}],"echo":true})", true, "'echo'"},
      {R"({"messages":[{"role":"user","content":"Hi"}],"best_of":2})", true, "'best_of'"},
      {R"({"messages":[{"role":"user","content":"Hi"}],"chat_template":"{{ x }}"})", true, "'chat_template'"},
      {R"({"messages":[{"role":"user","content":"Hi"}],"response_format":{"type":"json_schema"}})", true,
       "'response_format'"},
  };
  for (const Case& c : cases) {
    auto r = parse_openai_request(c.body, c.chat);
    ASSERT_FALSE(r.ok()) << c.body;
    EXPECT_EQ(http_error(r.status()).status, 400) << c.body;
    EXPECT_NE(r.status().message().find(c.field), std::string_view::npos) << c.body << ": " << r.status();
  }
}

// One choice per prompt, in order: strings, or token-id lists.
TEST(OpenAiFields, BatchedPrompts) {
  auto texts = parse_openai_request(R"({"prompt":["a","b","c"],"max_tokens":3,"seed":5})", false);
  ASSERT_TRUE(texts.ok()) << texts.status();
  ASSERT_EQ(texts->num_prompts(), 3);
  for (int i = 0; i < 3; ++i) {
    const v1::GenerateRequest r = texts->prompt_request(i);
    EXPECT_EQ(r.text(), std::string(1, char('a' + i)));
    EXPECT_EQ(r.sampling().max_tokens(), 3);
    EXPECT_EQ(r.sampling().seed(), 5);  // The same seed for every prompt: each equals it alone.
  }
  auto ids = parse_openai_request(R"({"prompt":[[1,2],[3]]})", false);
  ASSERT_TRUE(ids.ok()) << ids.status();
  ASSERT_EQ(ids->num_prompts(), 2);
  EXPECT_EQ(ids->prompt_request(0).token_ids().ids_size(), 2);
  EXPECT_EQ(ids->prompt_request(1).token_ids().ids(0), 3);
  auto one = parse_openai_request(R"({"prompt":[7,8]})", false);
  ASSERT_TRUE(one.ok());
  EXPECT_EQ(one->num_prompts(), 1);
  EXPECT_EQ(one->request.token_ids().ids_size(), 2);
  auto single = parse_openai_request(R"({"prompt":["only"]})", false);
  ASSERT_TRUE(single.ok());
  EXPECT_EQ(single->num_prompts(), 1);
  EXPECT_EQ(single->request.text(), "only");
}

TEST(OpenAiTokenize, Bodies) {
  auto t = parse_tokenize_request(R"({"prompt":"hello","model":"m"})", engine::ChatTemplate::plain("x"));
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->text, "hello");
  EXPECT_EQ(t->model, "m");
  EXPECT_TRUE(t->add_special_tokens);
  auto m = parse_tokenize_request(R"({"messages":[{"role":"user","content":"Hi"}]})", engine::ChatTemplate::plain("x"));
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->text, "user: Hi\nassistant:");
  EXPECT_FALSE(m->add_special_tokens);  // vLLM's default for messages.
  auto no_special =
      parse_tokenize_request(R"({"prompt":"a","add_special_tokens":false})", engine::ChatTemplate::plain("x"));
  ASSERT_TRUE(no_special.ok());
  EXPECT_FALSE(no_special->add_special_tokens);
  for (const char* bad : {R"({})", R"({"prompt":"a","messages":[]})", R"({"prompt":5})", R"({"prompt":"a","model":1})"})
    EXPECT_TRUE(absl::IsInvalidArgument(parse_tokenize_request(bad, engine::ChatTemplate::plain("x")).status())) << bad;

  auto d = parse_detokenize_request(R"({"tokens":[1,2,3]})");
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->tokens, (std::vector<int>{1, 2, 3}));
  for (const char* bad : {R"({})", R"({"tokens":"abc"})", R"({"tokens":[1,"a"]})", R"({"tokens":[-1]})"})
    EXPECT_TRUE(absl::IsInvalidArgument(parse_detokenize_request(bad).status())) << bad;
}

ChoiceOutput output(int index, std::vector<int> prompt, std::vector<int> ids, std::vector<v1::TokenLogprob> lps,
                    std::string text) {
  ChoiceOutput c;
  c.index = index;
  c.prompt_ids = std::move(prompt);
  c.token_ids = std::move(ids);
  c.logprobs = std::move(lps);
  c.text = std::move(text);
  c.finish_reason = "length";
  return c;
}

// The legacy completions logprobs object: tokens (decoded in context), token_logprobs,
// top_logprobs as {text: logprob}, text_offset; with echo the prompt's tokens first, the first
// with null logprobs.
TEST(OpenAiResponse, CompletionLogprobsAndEcho) {
  FakeTokenizer tok;
  auto req = parse_openai_request(R"({"prompt":"p","logprobs":2,"echo":true,"n":2})", false);
  ASSERT_TRUE(req.ok());
  ChoiceOutput a = output(0, {0, 5}, {7, 8},
                          {lp(7, -0.5f, {{7, -0.5f}, {9, -1.5f}}), lp(8, -0.25f, {{8, -0.25f}, {3, -2.f}})}, " w7 w8");
  a.prompt_text = "w5";
  a.prompt_logprobs = {lp(5, -3.0f, {{2, -0.1f}, {5, -3.0f}})};
  ChoiceOutput b = output(1, {0, 5}, {9}, {lp(9, -1.5f, {{7, -0.5f}, {9, -1.5f}})}, " w9");
  b.prompt_text = "w5";
  const json body = completion_body(*req, "cmpl-1", 42, "m", {a, b}, tok, 2, 0);
  ASSERT_EQ(body["choices"].size(), 2u);
  const json& c0 = body["choices"][0];
  EXPECT_EQ(c0["index"], 0);
  EXPECT_EQ(c0["text"], "w5 w7 w8");  // The prompt first.
  const json& l = c0["logprobs"];
  EXPECT_EQ(l["tokens"], json({"", "w5", " w7", " w8"}));
  EXPECT_EQ(l["token_logprobs"][0], nullptr);
  EXPECT_FLOAT_EQ(l["token_logprobs"][1].get<float>(), -3.0f);
  EXPECT_FLOAT_EQ(l["token_logprobs"][2].get<float>(), -0.5f);
  EXPECT_EQ(l["top_logprobs"][0], nullptr);
  EXPECT_EQ(l["top_logprobs"][1].size(), 2u);
  EXPECT_FLOAT_EQ(l["top_logprobs"][1]["w2"].get<float>(), -0.1f);
  EXPECT_FLOAT_EQ(l["top_logprobs"][2][" w9"].get<float>(), -1.5f);
  EXPECT_FLOAT_EQ(l["top_logprobs"][3][" w3"].get<float>(), -2.0f);
  EXPECT_EQ(l["text_offset"], json({0, 0, 2, 5}));
  EXPECT_EQ(body["choices"][1]["index"], 1);
  EXPECT_EQ(body["choices"][1]["text"], "w5 w9");
  // Completion tokens summed over choices; prompt tokens as given (once per prompt).
  EXPECT_EQ(body["usage"]["completion_tokens"], 3);
  EXPECT_EQ(body["usage"]["prompt_tokens"], 2);
  EXPECT_EQ(body["usage"]["total_tokens"], 5);
  EXPECT_EQ(body["usage"]["prompt_tokens_details"]["cached_tokens"], 0);

  // Without echo: the output alone, offsets from 0; without logprobs: null.
  auto plain = parse_openai_request(R"({"prompt":"p","logprobs":1})", false);
  ASSERT_TRUE(plain.ok());
  const json p = completion_body(*plain, "c", 1, "m", {a}, tok, 2, 3);
  EXPECT_EQ(p["choices"][0]["text"], " w7 w8");
  EXPECT_EQ(p["choices"][0]["logprobs"]["tokens"], json({" w7", " w8"}));
  EXPECT_EQ(p["choices"][0]["logprobs"]["text_offset"], json({0, 3}));
  EXPECT_EQ(p["usage"]["prompt_tokens_details"]["cached_tokens"], 3);
  auto none = parse_openai_request(R"({"prompt":"p"})", false);
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(completion_body(*none, "c", 1, "m", {a}, tok, 2, 0)["choices"][0]["logprobs"], nullptr);
}

// Special tokens' strings in logprobs objects follow skip_special_tokens as the streamed text
// does: "" when skipped, their own text when kept.
TEST(OpenAiResponse, LogprobTokenStringsKeepSpecialTokensOnlyWhenAsked) {
  FakeTokenizer tok;
  for (bool skip : {true, false}) {
    SCOPED_TRACE(skip ? "skipping" : "keeping");
    const std::string body = std::string(R"({"prompt":"p","logprobs":2,"skip_special_tokens":)") +
                             (skip ? "true" : "false") + "}";
    auto req = parse_openai_request(body, false);
    ASSERT_TRUE(req.ok()) << req.status();
    ChoiceOutput a = output(0, {5}, {0}, {lp(0, -0.5f, {{0, -0.5f}, {1, -1.5f}})}, "");
    const json l = completion_body(*req, "c", 1, "m", {a}, tok, 1, 0)["choices"][0]["logprobs"];
    EXPECT_EQ(l["tokens"], json({skip ? "" : "<s0>"}));
    EXPECT_TRUE(l["top_logprobs"][0].contains(skip ? "" : "<s0>")) << l.dump();
  }
}

TEST(OpenAiResponse, ChatLogprobsContent) {
  FakeTokenizer tok;
  auto req =
      parse_openai_request(R"({"messages":[{"role":"user","content":"Hi"}],"logprobs":true,"top_logprobs":2})", true);
  ASSERT_TRUE(req.ok());
  ChoiceOutput a = output(0, {0, 5}, {7, 8},
                          {lp(7, -0.5f, {{7, -0.5f}, {9, -1.5f}}), lp(8, -0.25f, {{8, -0.25f}, {3, -2.f}})}, " w7 w8");
  const json body = completion_body(*req, "chatcmpl-1", 1, "m", {a}, tok, 2, 0);
  const json& c = body["choices"][0];
  EXPECT_EQ(c["message"]["content"], " w7 w8");
  const json& content = c["logprobs"]["content"];
  ASSERT_EQ(content.size(), 2u);
  EXPECT_EQ(content[0]["token"], " w7");
  EXPECT_FLOAT_EQ(content[0]["logprob"].get<float>(), -0.5f);
  EXPECT_EQ(content[0]["bytes"], json({32, 119, 55}));
  ASSERT_EQ(content[0]["top_logprobs"].size(), 2u);
  EXPECT_EQ(content[0]["top_logprobs"][1]["token"], " w9");
  EXPECT_FLOAT_EQ(content[0]["top_logprobs"][1]["logprob"].get<float>(), -1.5f);
  EXPECT_EQ(content[1]["top_logprobs"][1]["bytes"], json({32, 119, 51}));
  EXPECT_EQ(body["object"], "chat.completion");
}

// best_of: the n samples with the highest sum of sampled-token logprobs, most likely first.
TEST(OpenAiResponse, BestSamplesRankByCumulativeLogprob) {
  std::vector<ChoiceOutput> outs = {
      output(0, {}, {1, 2}, {lp(1, -1.f, {}), lp(2, -1.f, {})}, ""),   // -2
      output(1, {}, {1}, {lp(1, -0.5f, {})}, ""),                      // -0.5
      output(2, {}, {1, 2}, {lp(1, -3.f, {}), lp(2, -0.1f, {})}, ""),  // -3.1
      output(3, {}, {1}, {lp(1, -0.5f, {})}, ""),                      // -0.5 (tie: after 1)
  };
  EXPECT_EQ(best_samples(outs, 2), (std::vector<int>{1, 3}));
  EXPECT_EQ(best_samples(outs, 4), (std::vector<int>{1, 3, 0, 2}));
  EXPECT_NEAR(outs[2].cumulative_logprob(), -3.1, 1e-6);
}

v1::GenerateResponse message(int index, std::vector<int> prompt, std::vector<int> ids, std::string text,
                             std::vector<v1::TokenLogprob> lps = {}, bool finished = false) {
  v1::GenerateResponse r;
  r.set_index(index);
  for (int t : prompt) r.add_prompt_token_ids(t);
  for (int t : ids) r.add_token_ids(t);
  r.set_text(std::move(text));
  for (auto& l : lps) *r.add_logprobs() = l;
  if (finished) {
    r.set_finished(true);
    r.set_finish_reason("stop");
  }
  return r;
}

// Streaming: each chunk names its choice's index; chat opens every choice with the role; echo
// puts the prompt (and its logprobs) in the choice's first chunk; logprobs follow the tokens'
// context across chunks.
TEST(OpenAiResponse, StreamChunks) {
  FakeTokenizer tok;
  auto chat = parse_openai_request(
      R"({"messages":[{"role":"user","content":"Hi"}],"n":2,"stream":true,"logprobs":true})", true);
  ASSERT_TRUE(chat.ok());
  std::vector<StreamChoice> st(2);
  auto c1 = chunk_body(*chat, "id", 1, "m", message(1, {0, 5}, {7}, " w7", {lp(7, -0.5f, {})}), "", tok, &st[1]);
  ASSERT_TRUE(c1);
  EXPECT_EQ((*c1)["choices"][0]["index"], 1);
  EXPECT_EQ((*c1)["choices"][0]["delta"]["role"], "assistant");
  EXPECT_EQ((*c1)["choices"][0]["delta"]["content"], " w7");
  EXPECT_EQ((*c1)["choices"][0]["logprobs"]["content"][0]["token"], " w7");
  auto c0 = chunk_body(*chat, "id", 1, "m", message(0, {0, 5}, {8}, " w8", {lp(8, -0.5f, {})}), "", tok, &st[0]);
  ASSERT_TRUE(c0);
  EXPECT_EQ((*c0)["choices"][0]["index"], 0);
  EXPECT_EQ((*c0)["choices"][0]["delta"]["role"], "assistant");
  auto c1b = chunk_body(*chat, "id", 1, "m", message(1, {}, {9}, " w9", {lp(9, -0.5f, {})}, true), "", tok, &st[1]);
  ASSERT_TRUE(c1b);
  EXPECT_FALSE((*c1b)["choices"][0]["delta"].contains("role"));
  EXPECT_EQ((*c1b)["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ((*c1b)["choices"][0]["logprobs"]["content"][0]["token"], " w9");  // After w7: with its space.
  // Nothing to say: no chunk.
  EXPECT_FALSE(chunk_body(*chat, "id", 1, "m", message(0, {}, {}, ""), "", tok, &st[0]));

  auto echo = parse_openai_request(R"({"prompt":"w5","echo":true,"logprobs":1,"stream":true})", false);
  ASSERT_TRUE(echo.ok());
  StreamChoice s;
  v1::GenerateResponse first = message(0, {0, 5}, {7}, " w7", {lp(7, -0.5f, {{7, -0.5f}})});
  *first.add_prompt_logprobs() = lp(5, -2.f, {{5, -2.f}});
  auto e1 = chunk_body(*echo, "id", 1, "m", first, "w5", tok, &s);
  ASSERT_TRUE(e1);
  EXPECT_EQ((*e1)["choices"][0]["text"], "w5 w7");
  EXPECT_EQ((*e1)["choices"][0]["logprobs"]["tokens"], json({"", "w5", " w7"}));
  EXPECT_EQ((*e1)["choices"][0]["logprobs"]["token_logprobs"][0], nullptr);
  EXPECT_EQ((*e1)["object"], "text_completion");
  auto e2 = chunk_body(*echo, "id", 1, "m", message(0, {}, {8}, " w8", {lp(8, -0.1f, {{8, -0.1f}})}), "w5", tok, &s);
  ASSERT_TRUE(e2);
  EXPECT_EQ((*e2)["choices"][0]["text"], " w8");  // The prompt only once.
  EXPECT_EQ((*e2)["choices"][0]["logprobs"]["tokens"], json({" w8"}));
  EXPECT_EQ((*e2)["choices"][0]["logprobs"]["text_offset"], json({5}));

  const json u = usage_chunk(*echo, "id", 1, "m", 4, 6, 1);
  EXPECT_TRUE(u["choices"].empty());
  EXPECT_EQ(u["usage"]["total_tokens"], 10);
  EXPECT_EQ(u["usage"]["prompt_tokens_details"]["cached_tokens"], 1);
}

// The shapes every response has (moved from router_unit_test.cc's ResponseAndChunkShapes).
TEST(OpenAiResponse, ResponseAndChunkShapes) {
  FakeTokenizer tok;
  OpenAiRequest completion;
  ChoiceOutput hello = output(0, {0, 5, 6}, {7, 8}, {}, "hello");
  auto body = completion_body(completion, "cmpl-1", 5, "m", {hello}, tok, 3, 0);
  EXPECT_EQ(body["object"], "text_completion");
  EXPECT_EQ(body["choices"][0]["text"], "hello");
  EXPECT_EQ(body["choices"][0]["index"], 0);
  EXPECT_EQ(body["choices"][0]["finish_reason"], "length");
  EXPECT_TRUE(body["choices"][0]["logprobs"].is_null());
  EXPECT_EQ(body["usage"]["total_tokens"], 5);
  OpenAiRequest chat;
  chat.chat = true;
  StreamChoice st;
  auto first = chunk_body(chat, "c", 5, "m", message(0, {0, 5}, {}, ""), "", tok, &st);
  ASSERT_TRUE(first);
  EXPECT_EQ((*first)["object"], "chat.completion.chunk");
  EXPECT_EQ((*first)["choices"][0]["delta"]["role"], "assistant");
  EXPECT_TRUE((*first)["choices"][0]["finish_reason"].is_null());
  auto last = chunk_body(chat, "c", 5, "m", message(0, {}, {}, "", {}, true), "", tok, &st);
  ASSERT_TRUE(last);
  EXPECT_EQ((*last)["choices"][0]["finish_reason"], "stop");
  EXPECT_FALSE((*last)["choices"][0]["delta"].contains("content"));
  EXPECT_EQ(sse(nlohmann::json{{"a", 1}}), "data: {\"a\":1}\n\n");
}

TEST(OpenAiResponse, ChoiceOutputCollectsMessages) {
  ChoiceOutput c;
  v1::GenerateResponse first = message(0, {0, 5}, {7}, "a", {lp(7, -1.f, {})});
  *first.add_prompt_logprobs() = lp(5, -2.f, {});
  c.add(first);
  v1::GenerateResponse last = message(0, {}, {8, 9}, "bc", {lp(8, -1.f, {}), lp(9, -1.f, {})}, true);
  last.set_cached_tokens(4);
  c.add(last);
  EXPECT_EQ(c.prompt_ids, (std::vector<int>{0, 5}));
  EXPECT_EQ(c.prompt_logprobs.size(), 1u);
  EXPECT_EQ(c.token_ids, (std::vector<int>{7, 8, 9}));
  EXPECT_EQ(c.text, "abc");
  EXPECT_EQ(c.logprobs.size(), 3u);
  EXPECT_EQ(c.finish_reason, "stop");
  EXPECT_EQ(c.cached_tokens, 4);
  EXPECT_DOUBLE_EQ(c.cumulative_logprob(), -3.0);
}

}  // namespace
}  // namespace pdserve::router
