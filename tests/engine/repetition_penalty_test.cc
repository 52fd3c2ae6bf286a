// The repetition penalty end to end on the bundled model: greedy tokens with a penalty equal a
// plain computation on the reference implementation's logits (every id of the prompt and the
// output so far divided or multiplied by hand, then the argmax), at TP 1 and 2, sampling on the
// host and on the backend; a penalty of 1 gives today's tokens; a slot a finished sequence left
// is emptied before the next one uses it.
#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include "engine/engine.h"
#include "tests/engine/reference_llama.h"
#include "tests/engine/test_model.h"

namespace pdserve::engine {
namespace {

using pdserve::testing::stories_bin;

std::unique_ptr<Engine> make_engine(int tp, EngineOptions::SampleOn on) {
  auto model = load_model({stories_bin()});
  EXPECT_TRUE(model.ok()) << model.status();
  EngineOptions o;
  o.tp = tp;
  o.sample_on = on;
  o.kv_cache_bytes = 8 << 20;
  auto e = Engine::create(std::move(*model), o);
  EXPECT_TRUE(e.ok()) << e.status();
  return std::move(*e);
}

SamplingParams penalised(float penalty, int max_tokens) {
  SamplingParams p;
  p.max_tokens = max_tokens;
  p.ignore_eos = true;
  p.repetition_penalty = penalty;
  return p;
}

// Greedy with the penalty, computed plainly: the reference's logits, each seen id's logit
// divided by the penalty when positive and multiplied otherwise, the first maximum.
std::vector<int> penalised_by_hand(pdserve::testing::ReferenceLlama& ref, const std::vector<int>& prompt,
                                   float penalty, int max_new) {
  std::vector<int> tokens = prompt, out;
  std::vector<float> logits;
  for (size_t pos = 0; pos + 1 < tokens.size(); ++pos) ref.forward(tokens[pos], int(pos));
  while (int(out.size()) < max_new) {
    logits = ref.forward(tokens.back(), int(tokens.size()) - 1);
    for (int id : std::set<int>(tokens.begin(), tokens.end()))
      logits[id] = logits[id] > 0 ? logits[id] / penalty : logits[id] * penalty;
    int best = 0;
    for (int i = 1; i < int(logits.size()); ++i)
      if (logits[i] > logits[best]) best = i;
    tokens.push_back(best);
    out.push_back(best);
  }
  return out;
}

std::vector<int> story_prompt(const Engine& e) {
  auto prompt = e.tokenizer().encode("Lily had a red ball. She played with the ball every day and", true);
  EXPECT_TRUE(prompt.ok());
  return *prompt;
}

TEST(RepetitionPenalty, GreedyEqualsThePenaltyAppliedByHandAtTp1And2) {
  pdserve::testing::ReferenceLlama ref(stories_bin());
  for (EngineOptions::SampleOn on : {EngineOptions::SampleOn::kHost, EngineOptions::SampleOn::kBackend})
    for (int tp : {1, 2}) {
      auto engine = make_engine(tp, on);
      const std::vector<int> prompt = story_prompt(*engine);
      const std::vector<int> plain = engine->generate(prompt, penalised(1.0f, 60))->token_ids;
      for (float penalty : {1.3f, 0.8f, 2.5f}) {
        const std::vector<int> got = engine->generate(prompt, penalised(penalty, 60))->token_ids;
        EXPECT_EQ(got, penalised_by_hand(ref, prompt, penalty, 60))
            << "penalty " << penalty << ", TP " << tp << ", sampling on the " << (on == EngineOptions::SampleOn::kHost ? "host" : "backend");
        EXPECT_NE(got, plain) << "penalty " << penalty << " changed nothing";
      }
    }
}

TEST(RepetitionPenalty, PenaltyOneGivesTheTokensOfARequestWithout) {
  pdserve::testing::ReferenceLlama ref(stories_bin());
  for (EngineOptions::SampleOn on : {EngineOptions::SampleOn::kHost, EngineOptions::SampleOn::kBackend}) {
    auto engine = make_engine(1, on);
    const std::vector<int> prompt = story_prompt(*engine);
    SamplingParams greedy;
    greedy.max_tokens = 60;
    greedy.ignore_eos = true;
    EXPECT_EQ(engine->generate(prompt, penalised(1.0f, 60))->token_ids, engine->generate(prompt, greedy)->token_ids);
    SamplingParams seeded = greedy;
    seeded.temperature = 0.9f;
    seeded.top_p = 0.95f;
    seeded.seed = 7;
    SamplingParams seeded_one = seeded;
    seeded_one.repetition_penalty = 1.0f;
    EXPECT_EQ(engine->generate(prompt, seeded_one)->token_ids, engine->generate(prompt, seeded)->token_ids);
  }
}

// Requests batched together, each with its own penalty (or none), each get their solo tokens;
// then, their slots free again, new requests reuse them and still get the hand-computed tokens.
TEST(RepetitionPenalty, BatchedRequestsAndReusedSlotsKeepEachSequencesOwnIds) {
  pdserve::testing::ReferenceLlama ref(stories_bin());
  for (EngineOptions::SampleOn on : {EngineOptions::SampleOn::kHost, EngineOptions::SampleOn::kBackend}) {
    auto engine = make_engine(2, on);
    const std::vector<float> penalties = {1.3f, 1.0f, 0.8f, 1.7f};
    std::vector<std::vector<int>> prompts;
    for (int i = 0; i < 4; ++i) {
      std::vector<int> p = {1};
      for (int t = 0; t < 10 + 7 * i; ++t) p.push_back(3 + (t * 37 + i * 101) % 500);
      prompts.push_back(p);
    }
    for (int round = 0; round < 2; ++round) {
      std::vector<std::vector<int>> got(4);
      for (int i = 0; i < 4; ++i) {
        const int r = (i + round) % 4;  // Another sequence in each slot the second time.
        ASSERT_TRUE(engine->add_request({std::to_string(i), prompts[r], penalised(penalties[r], 30)},
                                        [&got, i](const TokenEvent& ev) {
                                          if (ev.token >= 0) got[i].push_back(ev.token);
                                        }).ok());
      }
      ASSERT_TRUE(engine->run_until_idle().ok());
      for (int i = 0; i < 4; ++i) {
        const int r = (i + round) % 4;
        EXPECT_EQ(got[i], penalised_by_hand(ref, prompts[r], penalties[r], 30)) << "round " << round << ", prompt " << r;
      }
    }
  }
}

TEST(RepetitionPenalty, RefusesPenaltiesThatAreNotPositiveAndFinite) {
  auto engine = make_engine(1, EngineOptions::SampleOn::kHost);
  for (float bad : {0.0f, -1.0f, std::nanf(""), INFINITY}) {
    const Status s = engine->add_request({"bad", {1}, penalised(bad, 4)}, {});
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << bad << ": " << s;
    EXPECT_NE(s.message().find("repetition_penalty"), std::string::npos) << s;
  }
}

}  // namespace
}  // namespace pdserve::engine
