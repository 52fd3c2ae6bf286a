// max_position_embeddings (ModelConfig::max_seq_len) bounds every request: a longer prompt is
// refused with a message naming the context, generation stops before a position past it, and
// KV cannot be reserved beyond it (the P/D handoff's path).
#include <gtest/gtest.h>

#include <filesystem>

#include "engine/engine.h"
#include "engine/model/make_model.h"

namespace pdserve::engine {
namespace {

class ContextLimit : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / ("pdserve_context_" + std::to_string(getpid()));
    ASSERT_TRUE(make_model({.preset = "tiny-qwen3", .seed = 1, .out_dir = dir_.string()}).ok());
    auto model = load_model({dir_.string()});
    ASSERT_TRUE(model.ok()) << model.status();
    context_ = model->config.max_seq_len;
    ASSERT_EQ(context_, 256);  // The preset's max_position_embeddings.
    auto e = Engine::create(std::move(*model), {});
    ASSERT_TRUE(e.ok()) << e.status();
    engine_ = std::move(*e);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  static std::vector<int> prompt(int n) { return std::vector<int>(size_t(n), 65); }

  std::filesystem::path dir_;
  int context_ = 0;
  std::unique_ptr<Engine> engine_;
};

TEST_F(ContextLimit, PromptLongerThanTheContextIsRefused) {
  SamplingParams p;
  const Status s = engine_->add_request({"long", prompt(context_ + 1), p}, [](const TokenEvent&) {});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("context of 256 positions"), std::string::npos) << s;
  EXPECT_TRUE(engine_->add_request({"fits", prompt(context_), p}, [](const TokenEvent&) {}).ok());
}

TEST_F(ContextLimit, GenerationStopsAtTheContext) {
  SamplingParams p;
  p.max_tokens = 100;
  p.ignore_eos = true;
  // 250 prompt positions + 6 fed-back tokens fill the 256 positions; the 7th token's logits come
  // from the last position and it is never fed.
  auto got = engine_->generate(prompt(context_ - 6), p);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->token_ids.size(), 7u);
  EXPECT_EQ(got->finish_reason, FinishReason::kLength);
}

TEST_F(ContextLimit, KvCannotBeReservedPastTheContext) {
  EXPECT_FALSE(engine_->reserve_cached_blocks({}, "", context_ + 1).ok());
  auto fits = engine_->reserve_cached_blocks({}, "", context_);
  ASSERT_TRUE(fits.ok()) << fits.status();
  EXPECT_TRUE(engine_->release_blocks(fits->blocks).ok());
}

}  // namespace
}  // namespace pdserve::engine
