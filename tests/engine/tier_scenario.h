// The tier tests' scenario (host_tier_test.cc, fs_tier_test.cc): stories260K engines with given
// options, the distinct ~375-token prompts, and a short greedy run of one.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "engine/engine.h"
#include "tests/engine/test_model.h"

namespace pdserve::testing {

// A stories260K engine with `options`.
inline StatusOr<std::unique_ptr<engine::Engine>> try_stories_engine(engine::EngineOptions options) {
  auto model = engine::load_model({stories_bin()});
  if (!model.ok()) return model.status();
  return engine::Engine::create(std::move(*model), std::move(options));
}

// The same, failing the test (null) when it cannot be made.
inline std::unique_ptr<engine::Engine> stories_engine(engine::EngineOptions options) {
  auto e = try_stories_engine(std::move(options));
  EXPECT_TRUE(e.ok()) << e.status();
  return e.ok() ? std::move(*e) : nullptr;
}

// A prompt of `n` tokens (BOS first), distinct for each `salt`.
inline std::vector<int> prompt_of(int n, int salt) {
  std::vector<int> p = {1};
  for (int i = 1; i < n; ++i) p.push_back(3 + (i * 37 + salt * 101 + (i * salt) % 7) % 500);
  return p;
}

// `max_tokens` greedy tokens after `prompt`, whatever the stop tokens.
inline engine::GenerationResult run(engine::Engine& e, const std::vector<int>& prompt, int max_tokens = 8) {
  engine::SamplingParams p;
  p.max_tokens = max_tokens;
  p.ignore_eos = true;
  auto r = e.generate(prompt, p);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *r : engine::GenerationResult{};
}

}  // namespace pdserve::testing
