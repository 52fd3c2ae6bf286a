// A llama2.c checkpoint exported as a Hugging Face directory (q/k rows permuted so that
// rotate-half RoPE equals the original adjacent-pair RoPE) computes the same logits.
#include <gtest/gtest.h>

#include <filesystem>

#include "engine/model/make_model.h"
#include "engine/model_loader.h"
#include "engine/model_weights.h"
#include "engine/rank_pool.h"
#include "tests/engine/test_model.h"

namespace pdserve::engine {
namespace {

std::vector<float> logits_of(const LoadedModel& m, const std::vector<int>& prompt, int tp) {
  auto weights = ModelWeightsF32::create(m.config, *m.weights);
  EXPECT_TRUE(weights.ok()) << weights.status();
  const KvCacheSpec spec = m.config.kv_cache_spec(16);
  EngineOptions options;
  options.tp = tp;
  options.max_batch_tokens = int(prompt.size());
  auto pool = RankPool::create(m.config, **weights, spec, 64, options);
  EXPECT_TRUE(pool.ok()) << pool.status();
  std::vector<int> table(64);
  for (int i = 0; i < 64; ++i) table[i] = i;
  ForwardBatch batch;
  for (size_t i = 0; i < prompt.size(); ++i) {
    batch.tokens.push_back(prompt[i]);
    batch.positions.push_back(int(i));
    batch.block_tables.push_back(table.data());
    batch.logit_rows.push_back(int(i));  // Every position's logits.
  }
  std::vector<float> logits(prompt.size() * m.config.vocab_size);
  EXPECT_TRUE((*pool)->forward(batch, {.logits = logits.data()}).ok());
  return logits;
}

TEST(Export, HuggingFaceExportOfStories260KGivesTheSameLogits) {
  const auto dir = std::filesystem::temp_directory_path() / ("pdserve_export_" + std::to_string(getpid()));
  MakeModelOptions opts;
  opts.from = pdserve::testing::stories_bin();
  opts.out_dir = dir.string();
  ASSERT_TRUE(make_model(opts).ok());
  auto original = load_model({pdserve::testing::stories_bin()});
  auto exported = load_model({dir.string()});
  ASSERT_TRUE(original.ok()) << original.status();
  ASSERT_TRUE(exported.ok()) << exported.status();
  EXPECT_EQ(exported->config.rope_style, RopeStyle::kRotateHalf);
  EXPECT_EQ(original->config.rope_style, RopeStyle::kAdjacentPairs);
  const std::vector<int> prompt = {1, 403, 407, 261, 378, 423, 260, 317, 300, 1, 65, 88, 297};
  for (int tp : {1, 2}) {
    const std::vector<float> a = logits_of(*original, prompt, tp), b = logits_of(*exported, prompt, tp);
    ASSERT_EQ(a.size(), b.size());
    float worst = 0;
    for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::abs(a[i] - b[i]));
    EXPECT_LT(worst, 1e-4) << "TP " << tp;
  }
  // And the tokenizer came along: the same text encodes the same.
  EXPECT_EQ(*original->tokenizer->encode("Lily went home.", true), *exported->tokenizer->encode("Lily went home.", true));
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace pdserve::engine
