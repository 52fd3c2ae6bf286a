// generation_config.json's sampling defaults: what real files give (Llama-3.1-Instruct's,
// Qwen3's, Qwen2.5's), do_sample false as greedy, the keys reported as not applied, and a clear
// error naming the key for each value out of range or of the wrong type.
#include "engine/model/generation_config.h"

#include <gtest/gtest.h>

#include "engine/model/hf_config.h"

namespace pdserve::engine {
namespace {

struct Case {
  const char* name;
  const char* json;
  GenerationDefaults want;
};

TEST(GenerationConfig, ParsesTheSamplingDefaults) {
  const std::vector<Case> cases = {
      {"none", R"({"bos_token_id": 1, "eos_token_id": 2})", {}},
      {"llama-3.1-instruct",
       R"({"bos_token_id": 128000, "do_sample": true, "eos_token_id": [128001, 128008, 128009],
           "temperature": 0.6, "top_p": 0.9, "transformers_version": "4.42.3"})",
       {0.6f, std::nullopt, 0.9f, std::nullopt, {}}},
      {"qwen3", R"({"do_sample": true, "eos_token_id": [151645, 151643], "pad_token_id": 151643,
                    "temperature": 0.6, "top_k": 20, "top_p": 0.95})",
       {0.6f, 20, 0.95f, std::nullopt, {}}},
      {"qwen2.5-instruct", R"({"do_sample": true, "repetition_penalty": 1.05, "temperature": 0.7,
                              "top_p": 0.8, "top_k": 20})",
       {0.7f, 20, 0.8f, 1.05f, {}}},
      {"do_sample absent", R"({"temperature": 0.3})", {0.3f, std::nullopt, std::nullopt, std::nullopt, {}}},
      {"nulls are absent", R"({"temperature": null, "top_k": null, "do_sample": null})", {}},
      {"do_sample false: greedy, the penalty kept",
       R"({"do_sample": false, "temperature": 0.6, "top_p": 0.9, "repetition_penalty": 1.1})",
       {0.0f, std::nullopt, std::nullopt, 1.1f,
        {"temperature 0.6: do_sample is false, so the default is greedy",
         "top_p 0.9: do_sample is false, so the default is greedy"}}},
      {"do_sample false alone", R"({"do_sample": false})", {0.0f, std::nullopt, std::nullopt, std::nullopt, {}}},
      {"top_k 0 is off, temperature 0 greedy", R"({"top_k": 0, "temperature": 0})", {0.0f, 0, std::nullopt, std::nullopt, {}}},
      {"min_p and max_new_tokens reported", R"({"min_p": 0.05, "max_new_tokens": 2048, "top_p": 1})",
       {std::nullopt, std::nullopt, 1.0f, std::nullopt,
        {"min_p 0.05: pdserve has no min_p sampling", "max_new_tokens 2048: requests do not take their max_tokens from it"}}},
      {"min_p 0 is off", R"({"min_p": 0})", {}},
  };
  for (const Case& c : cases) {
    auto got = parse_generation_defaults(c.json, "gen");
    ASSERT_TRUE(got.ok()) << c.name << ": " << got.status();
    EXPECT_EQ(got->temperature, c.want.temperature) << c.name;
    EXPECT_EQ(got->top_k, c.want.top_k) << c.name;
    EXPECT_EQ(got->top_p, c.want.top_p) << c.name;
    EXPECT_EQ(got->repetition_penalty, c.want.repetition_penalty) << c.name;
    EXPECT_EQ(got->not_applied, c.want.not_applied) << c.name;
  }
}

TEST(GenerationConfig, RefusesValuesOutOfRangeNamingTheKey) {
  const std::vector<std::pair<const char*, const char*>> bad = {
      {R"({"temperature": -0.1})", "temperature must be >= 0"},
      {R"({"temperature": "hot"})", "temperature must be a finite number"},
      {R"({"top_p": 0})", "top_p must be in (0, 1]"},
      {R"({"top_p": 1.5})", "top_p must be in (0, 1]"},
      {R"({"top_k": -1})", "top_k must be an integer >= 0"},
      {R"({"top_k": 2.5})", "top_k must be an integer >= 0"},
      {R"({"repetition_penalty": 0})", "repetition_penalty must be > 0"},
      {R"({"repetition_penalty": -1.2})", "repetition_penalty must be > 0"},
      {R"({"min_p": 2})", "min_p must be in [0, 1]"},
      {R"({"max_new_tokens": 0})", "max_new_tokens must be an integer > 0"},
      {R"({"do_sample": "yes"})", "do_sample must be a boolean"},
      {R"([1, 2])", "not a JSON object"},
      {R"({"temperature": )", "not valid JSON"},
  };
  for (const auto& [json, message] : bad) {
    auto got = parse_generation_defaults(json, "gen.json");
    ASSERT_FALSE(got.ok()) << json;
    EXPECT_TRUE(absl::IsInvalidArgument(got.status())) << json;
    EXPECT_NE(got.status().message().find(message), std::string::npos) << json << ": " << got.status();
    EXPECT_NE(got.status().message().find("gen.json"), std::string::npos) << json << ": " << got.status();
  }
}

// The loader's path: merge_generation_config keeps the defaults with the model's config.
TEST(GenerationConfig, MergeKeepsTheDefaultsWithTheConfig) {
  ModelConfig c;
  c.vocab_size = 1000;
  ASSERT_TRUE(merge_generation_config(R"({"eos_token_id": 7, "temperature": 0.6, "repetition_penalty": 1.2})", "gen", c).ok());
  EXPECT_EQ(c.generation_defaults.temperature, 0.6f);
  EXPECT_EQ(c.generation_defaults.repetition_penalty, 1.2f);
  EXPECT_FALSE(merge_generation_config(R"({"top_p": 7})", "gen", c).ok());
  EXPECT_EQ(describe_generation_defaults(c.generation_defaults),
            "sampling defaults for requests that leave them unset: temperature 0.6, repetition_penalty 1.2");
}

}  // namespace
}  // namespace pdserve::engine
