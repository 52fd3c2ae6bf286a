// The mixed-geometry preset: every per-layer cache geometry in one model. It must compute the
// same tokens at every TP size, and — the reason it exists — a KV cache handed over with any
// one cache layer wrong (the index cache included) must change what it generates.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>

#include "engine/engine.h"
#include "engine/model/make_model.h"
#include "tests/engine/kv_copy.h"

namespace pdserve::engine {
namespace {

class MixedGeometry : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = std::filesystem::temp_directory_path() / ("pdserve_mixed_" + std::to_string(getpid()));
    MakeModelOptions o;
    o.preset = "mixed-geometry";
    o.seed = 3;
    o.out_dir = dir_.string();
    ASSERT_TRUE(make_model(o).ok());
  }
  static void TearDownTestSuite() { std::filesystem::remove_all(dir_); }

  static std::unique_ptr<Engine> engine(int tp) {
    auto model = load_model({dir_.string()});
    EXPECT_TRUE(model.ok()) << model.status();
    EngineOptions o;
    o.tp = tp;
    o.kv_cache_bytes = 4 << 20;
    auto e = Engine::create(std::move(*model), o);
    EXPECT_TRUE(e.ok()) << e.status();
    return std::move(*e);
  }

  static std::vector<int> prompt() {
    std::vector<int> p = {256};
    for (int i = 0; i < 120; ++i) p.push_back((i * 97 + 13) % 256);  // 8 blocks: top-k matters.
    return p;
  }

  static inline std::filesystem::path dir_;
};

TEST_F(MixedGeometry, SpecHasEveryGeometry) {
  auto e = engine(1);
  const KvCacheSpec spec = e->config().kv_cache_spec(16);
  ASSERT_EQ(spec.layers.size(), 6u);  // 5 attention layers + 1 index cache.
  EXPECT_EQ(spec.layers[5].kind, KvKind::kKeyOnly);
  EXPECT_EQ(spec.layers[5].sharding, KvSharding::kReplicated);
  EXPECT_EQ(spec.layers[1].layout, KvLayout::kInterleaved);
  EXPECT_EQ(spec.layers[2].order, KvOrder::kHeadMajor);
  EXPECT_GT(spec.layers[2].window, 0);
  EXPECT_EQ(e->config().index_cache_layer(3), 5);
}

TEST_F(MixedGeometry, SameTokensAtEveryTp) {
  SamplingParams p;
  p.max_tokens = 40;
  p.ignore_eos = true;
  const std::vector<int> tp1 = engine(1)->generate(prompt(), p)->token_ids;
  ASSERT_EQ(tp1.size(), 40u);
  for (int tp : {2, 4, 8}) EXPECT_EQ(engine(tp)->generate(prompt(), p)->token_ids, tp1) << "TP " << tp;
}

// Prefill on one engine, hand the KV to another with cache layer `corrupt` (or none, -1)
// shifted by one block, then decode.
std::vector<int> handoff_with(Engine& prefill, Engine& decode, const std::vector<int>& prompt,
                              const SamplingParams& params, int corrupt) {
  const auto [first, handed] = pdserve::testing::run_prefill_only(prefill, prompt, params);
  auto reserved = decode.reserve_cached_blocks({}, "", int(prompt.size()) + params.max_tokens);
  EXPECT_TRUE(reserved.ok());
  if (!reserved.ok()) return {};
  pdserve::testing::copy_kv(prefill, handed, decode, reserved->blocks, int(prompt.size() + 15) / 16, corrupt);
  EXPECT_TRUE(prefill.release_blocks(handed).ok());
  return pdserve::testing::decode_preloaded(decode, prompt, params, reserved->blocks, first);
}

TEST_F(MixedGeometry, AnyWrongCacheLayerChangesTheOutput) {
  auto prefill = engine(2), decode = engine(2);
  SamplingParams p;
  p.max_tokens = 24;
  p.ignore_eos = true;
  const std::vector<int> whole = engine(2)->generate(prompt(), p)->token_ids;
  EXPECT_EQ(handoff_with(*prefill, *decode, prompt(), p, -1), whole);
  for (int layer = 0; layer < 6; ++layer)
    EXPECT_NE(handoff_with(*prefill, *decode, prompt(), p, layer), whole) << "cache layer " << layer;
}

}  // namespace
}  // namespace pdserve::engine
