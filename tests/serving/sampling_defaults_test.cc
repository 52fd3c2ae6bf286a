// proto/sampling_defaults.h: a model's GenerationDefaults as ModelInfo carries them, and the
// one function every entry point applies them with — unset fields take the default, set ones
// (0 included: presence, not value, decides) keep the request's.
#include "proto/sampling_defaults.h"

#include <gtest/gtest.h>

namespace pdserve {
namespace {

TEST(SamplingDefaults, ProtoCarriesExactlyWhatTheFileGave) {
  engine::GenerationDefaults d;
  d.temperature = 0.6f;
  d.repetition_penalty = 1.05f;
  d.not_applied = {"min_p 0.05: pdserve has no min_p sampling"};
  const v1::SamplingDefaults p = sampling_defaults_proto(d);
  EXPECT_TRUE(p.has_temperature() && p.has_repetition_penalty());
  EXPECT_FALSE(p.has_top_k() || p.has_top_p());
  EXPECT_FLOAT_EQ(p.temperature(), 0.6f);
  EXPECT_FLOAT_EQ(p.repetition_penalty(), 1.05f);
  ASSERT_EQ(p.not_applied_size(), 1);
  EXPECT_EQ(p.not_applied(0), d.not_applied[0]);
}

TEST(SamplingDefaults, UnsetFieldsTakeTheDefaultsAndSetOnesWin) {
  v1::SamplingDefaults all;
  all.set_temperature(0.7f);
  all.set_top_k(20);
  all.set_top_p(0.8f);
  all.set_repetition_penalty(1.1f);
  struct Case {
    const char* name;
    std::function<void(v1::SamplingParams&)> request;
    v1::SamplingDefaults defaults;
    std::function<void(const v1::SamplingParams&)> check;
  };
  const std::vector<Case> cases = {
      {"nothing set: every default", [](v1::SamplingParams&) {}, all,
       [](const v1::SamplingParams& s) {
         EXPECT_FLOAT_EQ(s.temperature(), 0.7f);
         EXPECT_EQ(s.top_k(), 20);
         EXPECT_FLOAT_EQ(s.top_p(), 0.8f);
         EXPECT_FLOAT_EQ(s.repetition_penalty(), 1.1f);
       }},
      {"explicit zeros and ones win",
       [](v1::SamplingParams& s) {
         s.set_temperature(0);
         s.set_top_k(0);
         s.set_top_p(1);
         s.set_repetition_penalty(1);
       },
       all,
       [](const v1::SamplingParams& s) {
         EXPECT_EQ(s.temperature(), 0.0f);
         EXPECT_EQ(s.top_k(), 0);
         EXPECT_EQ(s.top_p(), 1.0f);
         EXPECT_EQ(s.repetition_penalty(), 1.0f);
       }},
      {"no defaults: stays unset", [](v1::SamplingParams& s) { s.set_top_k(3); }, {},
       [](const v1::SamplingParams& s) {
         EXPECT_FALSE(s.has_temperature() || s.has_top_p() || s.has_repetition_penalty());
         EXPECT_EQ(s.top_k(), 3);
       }},
      {"other fields untouched",
       [](v1::SamplingParams& s) {
         s.set_max_tokens(9);
         s.set_seed(4);
       },
       all,
       [](const v1::SamplingParams& s) {
         EXPECT_EQ(s.max_tokens(), 9);
         EXPECT_EQ(s.seed(), 4);
       }},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    v1::SamplingParams s;
    c.request(s);
    apply_sampling_defaults(c.defaults, &s);
    c.check(s);
    // Applying again changes nothing (the HTTP front end and Router::generate both apply).
    v1::SamplingParams again = s;
    apply_sampling_defaults(c.defaults, &again);
    EXPECT_EQ(again.SerializeAsString(), s.SerializeAsString());
  }
}

}  // namespace
}  // namespace pdserve
