// The conversions issue 15's sampling fields go through on their way from a client to the
// engine and back: proto/engine_sampling.h (wire <-> engine SamplingParams: unset fields,
// the logit-bias map, the optional logprob counts), worker/token_logprobs.h (engine <-> wire
// TokenLogprob), set_neutral_sampling, and the CLI's --logit-bias parser.
#include <gtest/gtest.h>

#include <functional>

#include "proto/engine_sampling.h"
#include "proto/sampling_defaults.h"
#include "tools/sampling_flags.h"
#include "worker/sampling_params.h"
#include "worker/token_logprobs.h"

namespace pdserve {
namespace {

// One wire field set (or left unset) and what the engine must get for it.
struct WireCase {
  const char* name;
  std::function<void(v1::SamplingParams&)> edit;
  std::function<bool(const engine::SamplingParams&)> want;
};

TEST(EngineSampling, EachWireFieldReachesTheEngine) {
  const WireCase cases[] = {
      {"unset: the engine's neutral values", [](v1::SamplingParams&) {},
       [](const engine::SamplingParams& p) {
         return p.temperature == 0 && p.top_k == 0 && p.top_p == 1 && p.repetition_penalty == 1 && p.seed == -1 &&
                p.frequency_penalty == 0 && p.presence_penalty == 0 && p.logit_bias.empty() && p.min_tokens == 0 &&
                p.logprobs == -1 && p.prompt_logprobs == -1 && p.skip_special_tokens;
       }},
      {"temperature", [](v1::SamplingParams& s) { s.set_temperature(0.7f); },
       [](const engine::SamplingParams& p) { return p.temperature == 0.7f; }},
      {"seed 0 is a seed", [](v1::SamplingParams& s) { s.set_seed(0); },
       [](const engine::SamplingParams& p) { return p.seed == 0; }},
      {"frequency_penalty", [](v1::SamplingParams& s) { s.set_frequency_penalty(0.5f); },
       [](const engine::SamplingParams& p) { return p.frequency_penalty == 0.5f && p.presence_penalty == 0; }},
      {"presence_penalty", [](v1::SamplingParams& s) { s.set_presence_penalty(-1.5f); },
       [](const engine::SamplingParams& p) { return p.presence_penalty == -1.5f && p.frequency_penalty == 0; }},
      {"logit_bias: sorted by id",
       [](v1::SamplingParams& s) {
         (*s.mutable_logit_bias())[300] = -100;
         (*s.mutable_logit_bias())[7] = 5;
         (*s.mutable_logit_bias())[42] = 0.25f;
       },
       [](const engine::SamplingParams& p) {
         return p.logit_bias == std::vector<std::pair<int, float>>{{7, 5.0f}, {42, 0.25f}, {300, -100.0f}};
       }},
      {"min_tokens", [](v1::SamplingParams& s) { s.set_min_tokens(4); },
       [](const engine::SamplingParams& p) { return p.min_tokens == 4; }},
      {"logprobs 0 is set (the token's own only)", [](v1::SamplingParams& s) { s.set_logprobs(0); },
       [](const engine::SamplingParams& p) { return p.logprobs == 0 && p.prompt_logprobs == -1; }},
      {"logprobs 3", [](v1::SamplingParams& s) { s.set_logprobs(3); },
       [](const engine::SamplingParams& p) { return p.logprobs == 3; }},
      {"prompt_logprobs 2", [](v1::SamplingParams& s) { s.set_prompt_logprobs(2); },
       [](const engine::SamplingParams& p) { return p.prompt_logprobs == 2 && p.logprobs == -1; }},
      {"skip_special_tokens false", [](v1::SamplingParams& s) { s.set_skip_special_tokens(false); },
       [](const engine::SamplingParams& p) { return !p.skip_special_tokens; }},
      {"skip_special_tokens true", [](v1::SamplingParams& s) { s.set_skip_special_tokens(true); },
       [](const engine::SamplingParams& p) { return p.skip_special_tokens; }},
  };
  for (const WireCase& c : cases) {
    v1::SamplingParams s;
    s.set_max_tokens(8);
    c.edit(s);
    const engine::SamplingParams p = engine_sampling(s);
    EXPECT_TRUE(c.want(p)) << c.name;
    EXPECT_EQ(p.max_tokens, 8) << c.name;
  }
}

TEST(EngineSampling, TheWireFormGivesTheEngineParametersBack) {
  engine::SamplingParams p;
  p.temperature = 0.9f;
  p.top_k = 40;
  p.top_p = 0.95f;
  p.seed = 1234;
  p.max_tokens = 33;
  p.stop_token_ids = {5, 9};
  p.stop_strings = {"\n\n"};
  p.ignore_eos = true;
  p.repetition_penalty = 1.2f;
  p.frequency_penalty = 0.4f;
  p.presence_penalty = -0.3f;
  p.logit_bias = {{3, -2.0f}, {17, 8.5f}};
  p.min_tokens = 6;
  p.logprobs = 5;
  p.prompt_logprobs = 0;
  p.skip_special_tokens = false;
  const engine::SamplingParams back = engine_sampling(wire_sampling(p));
  EXPECT_EQ(back.temperature, p.temperature);
  EXPECT_EQ(back.top_k, p.top_k);
  EXPECT_EQ(back.top_p, p.top_p);
  EXPECT_EQ(back.seed, p.seed);
  EXPECT_EQ(back.max_tokens, p.max_tokens);
  EXPECT_EQ(back.stop_token_ids, p.stop_token_ids);
  EXPECT_EQ(back.stop_strings, p.stop_strings);
  EXPECT_EQ(back.ignore_eos, p.ignore_eos);
  EXPECT_EQ(back.repetition_penalty, p.repetition_penalty);
  EXPECT_EQ(back.frequency_penalty, p.frequency_penalty);
  EXPECT_EQ(back.presence_penalty, p.presence_penalty);
  EXPECT_EQ(back.logit_bias, p.logit_bias);
  EXPECT_EQ(back.min_tokens, p.min_tokens);
  EXPECT_EQ(back.logprobs, p.logprobs);
  EXPECT_EQ(back.prompt_logprobs, p.prompt_logprobs);
  EXPECT_EQ(back.skip_special_tokens, p.skip_special_tokens);
  // -1 ("none", "random") is unset on the wire, not a value.
  const v1::SamplingParams none = wire_sampling(engine::SamplingParams{});
  EXPECT_FALSE(none.has_seed() || none.has_logprobs() || none.has_prompt_logprobs());
}

// The worker's validated form refuses what the engine refuses, naming the field.
TEST(EngineSampling, TheWorkersConversionValidates) {
  v1::SamplingParams s;
  s.set_max_tokens(4);
  EXPECT_TRUE(worker::to_engine_params(s).ok());
  s.set_max_tokens(0);
  const auto bad = worker::to_engine_params(s);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("max_tokens"), std::string::npos) << bad.status();
}

// A migrated request's min_tokens counts its resumed output too, max_tokens only what is left:
// the worker checks min_tokens against both together.
TEST(EngineSampling, TheWorkersConversionCountsResumedTokensForMinTokens) {
  v1::SamplingParams s;
  s.set_max_tokens(3);
  s.set_min_tokens(4);
  engine::SamplingParams plain;
  plain.max_tokens = 3;
  plain.min_tokens = 4;
  if (plain.validate().ok()) GTEST_SKIP() << "engine::SamplingParams::validate() predates min_tokens' check";
  EXPECT_EQ(worker::to_engine_params(s).status().code(), absl::StatusCode::kInvalidArgument);
  const auto resumed = worker::to_engine_params(s, /*resumed_tokens=*/2);
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  EXPECT_EQ(resumed->max_tokens, 3);
  EXPECT_EQ(resumed->min_tokens, 4);
  EXPECT_EQ(worker::to_engine_params(s, /*resumed_tokens=*/0).status().code(), absl::StatusCode::kInvalidArgument);
  s.set_max_tokens(0);  // Nothing left to generate is still refused.
  EXPECT_EQ(worker::to_engine_params(s, /*resumed_tokens=*/5).status().code(), absl::StatusCode::kInvalidArgument);
}

// Neutral sampling is the engine's defaults, so a reference engine run with plain parameters
// computes what the router serves for it.
TEST(EngineSampling, NeutralSamplingIsTheEnginesDefaults) {
  v1::SamplingParams s;
  s.set_temperature(0.8f);
  s.set_top_k(3);
  s.set_top_p(0.5f);
  s.set_repetition_penalty(1.3f);
  set_neutral_sampling(&s);
  ASSERT_TRUE(s.has_temperature() && s.has_top_k() && s.has_top_p() && s.has_repetition_penalty());
  const engine::SamplingParams p = engine_sampling(s), d;
  EXPECT_EQ(p.temperature, d.temperature);
  EXPECT_EQ(p.top_k, d.top_k);
  EXPECT_EQ(p.top_p, d.top_p);
  EXPECT_EQ(p.repetition_penalty, d.repetition_penalty);
  // A model default no longer applies.
  v1::SamplingDefaults defaults;
  defaults.set_temperature(0.6f);
  apply_sampling_defaults(defaults, &s);
  EXPECT_EQ(s.temperature(), 0.0f);
}

TEST(TokenLogprobs, EngineAndWireFormsConvertBothWays) {
  struct Case {
    const char* name;
    engine::TokenLogprob lp;
  } cases[] = {
      {"no alternatives (logprobs 0)", {17, -0.25f, {}}},
      {"three alternatives, most likely first", {5, -1.5f, {{9, -0.1f}, {5, -1.5f}, {2, -3.0f}}}},
      {"the sampled token is not among them", {400, -12.0f, {{1, -0.01f}}}},
  };
  for (const Case& c : cases) {
    const v1::TokenLogprob w = worker::to_wire(c.lp);
    EXPECT_EQ(w.token_id(), c.lp.token) << c.name;
    EXPECT_EQ(w.logprob(), c.lp.logprob) << c.name;
    ASSERT_EQ(w.top_ids_size(), int(c.lp.top.size())) << c.name;
    ASSERT_EQ(w.top_logprobs_size(), int(c.lp.top.size())) << c.name;
    for (size_t i = 0; i < c.lp.top.size(); ++i) {
      EXPECT_EQ(w.top_ids(int(i)), c.lp.top[i].first) << c.name;
      EXPECT_EQ(w.top_logprobs(int(i)), c.lp.top[i].second) << c.name;
    }
    const engine::TokenLogprob back = worker::from_wire(w);
    EXPECT_EQ(back.token, c.lp.token) << c.name;
    EXPECT_EQ(back.logprob, c.lp.logprob) << c.name;
    EXPECT_EQ(back.top, c.lp.top) << c.name;
  }
  google::protobuf::RepeatedPtrField<v1::TokenLogprob> out;
  *out.Add() = worker::to_wire(cases[0].lp);
  worker::append_wire({cases[1].lp, cases[2].lp}, &out);
  ASSERT_EQ(out.size(), 3);
  EXPECT_EQ(out[1].token_id(), 5);
  EXPECT_EQ(out[2].token_id(), 400);
}

TEST(LogitBiasFlag, ParsesIdBiasPairs) {
  struct Case {
    const char* spec;
    bool ok;
    std::vector<std::pair<int, float>> want;
  } cases[] = {
      {"5:1.5", true, {{5, 1.5f}}},
      {"300:-100,7:2", true, {{7, 2.0f}, {300, -100.0f}}},
      {" 1:0.5 , 2:-0.5 ", true, {{1, 0.5f}, {2, -0.5f}}},
      {"0:100", true, {{0, 100.0f}}},
      {"", false, {}},
      {"5", false, {}},
      {"5:", false, {}},
      {":1", false, {}},
      {"a:1", false, {}},
      {"5:x", false, {}},
      {"-1:2", false, {}},
      {"5:1,5:2", false, {}},
      {"5:1,,6:2", false, {}},
  };
  for (const Case& c : cases) {
    const auto got = tools::parse_logit_bias(c.spec);
    EXPECT_EQ(got.ok(), c.ok) << "'" << c.spec << "': " << got.status();
    if (got.ok() && c.ok) {
      EXPECT_EQ(*got, c.want) << c.spec;
    }
  }
}

}  // namespace
}  // namespace pdserve
