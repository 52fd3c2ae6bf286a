// The engine's logits against an independent plain implementation of the Hugging Face forward
// pass (tests/engine/reference_hf.h) on the shapes issue 14 added: Llama-3.1's RoPE scaling
// (tiny-llama31), Qwen3's per-head q/k norms with head_dim != hidden / heads (tiny-qwen3), and
// YaRN (tiny-yarn), plus linear and dynamic scaling and Qwen2's q/k/v biases (tiny-qwen2); at TP
// 1 and 2, on the CPU backend and on the CPU emulation of the GPU (whose uploaded shards fuse the
// QKV and gate_up GEMMs). Every position's logits must agree within 1e-4 (f32 against double).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "engine/model/hf_config.h"
#include "engine/model/make_model.h"
#include "engine/model_loader.h"
#include "engine/model_weights.h"
#include "engine/rank_pool.h"
#include "tests/engine/reference_hf.h"

namespace pdserve::engine {
namespace {

namespace fs = std::filesystem;

constexpr double kTolerance = 1e-4;

// The engine's logits after each of `prompt`'s tokens: the first `prefill` tokens in one step,
// then one decode step per token (so both attention paths run, and decode steps rotate new
// keys against ones cached by the prefill).
std::vector<std::vector<float>> engine_logits(const std::string& dir, const std::vector<int>& prompt, int prefill,
                                              int tp, const std::string& backend) {
  auto m = load_model({dir});
  EXPECT_TRUE(m.ok()) << m.status();
  if (!m.ok()) return {};
  auto weights = ModelWeightsF32::create(m->config, *m->weights);
  EXPECT_TRUE(weights.ok()) << weights.status();
  const int block = 16, blocks = (int(prompt.size()) + block - 1) / block;
  EngineOptions options;
  options.tp = tp;
  options.backend = backend;
  options.max_batch_tokens = prefill;
  auto pool = RankPool::create(m->config, **weights, m->config.kv_cache_spec(block), blocks, options);
  EXPECT_TRUE(pool.ok()) << pool.status();
  if (!pool.ok()) return {};
  std::vector<int> table(blocks);
  for (int i = 0; i < blocks; ++i) table[i] = i;
  const int vocab = m->config.vocab_size;
  std::vector<std::vector<float>> out;
  for (int begin = 0; begin < int(prompt.size());) {
    const int end = begin == 0 ? prefill : begin + 1;
    ForwardBatch batch;
    for (int t = begin; t < end; ++t) {
      batch.tokens.push_back(prompt[t]);
      batch.positions.push_back(t);
      batch.block_tables.push_back(table.data());
      batch.logit_rows.push_back(t - begin);
    }
    std::vector<float> logits(size_t(end - begin) * vocab);
    EXPECT_TRUE((*pool)->forward(batch, {.logits = logits.data()}).ok());
    for (int t = 0; t < end - begin; ++t) out.emplace_back(logits.begin() + t * vocab, logits.begin() + (t + 1) * vocab);
    begin = end;
  }
  return out;
}

double max_abs_diff(const std::vector<std::vector<float>>& a, const std::vector<std::vector<float>>& b) {
  EXPECT_EQ(a.size(), b.size());
  double worst = a.size() == b.size() ? 0.0 : INFINITY;
  for (size_t t = 0; t < std::min(a.size(), b.size()); ++t) {
    EXPECT_EQ(a[t].size(), b[t].size());
    for (size_t i = 0; i < std::min(a[t].size(), b[t].size()); ++i)
      worst = std::max(worst, std::abs(double(a[t][i]) - double(b[t][i])));
  }
  return worst;
}

// Byte tokens after BOS: 80 positions, past the presets' 64-token original context; the first
// kPrefill in one step, the rest decoded one by one.
constexpr int kPrefill = 72;

std::vector<int> long_prompt() {
  std::vector<int> p = {256};
  for (int i = 0; i < 79; ++i) p.push_back((i * 37 + 11) % 256);
  return p;
}

struct Model {
  const char* preset;
  // Replaces config.json's rope_scaling (JSON text), or empty to keep the preset's.
  const char* rope_scaling;
  // What the loaded config must say, so that a preset that lost its shape fails here rather than
  // matching a reference that read the same plain file.
  RopeScalingType scaling;
  bool qk_norm;
};

struct Case {
  Model model;
  const char* backend;
  int tp;
};

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  const Model& m = info.param.model;
  std::string name = std::string(m.preset) + "_" + info.param.backend + "_tp" + std::to_string(info.param.tp);
  if (*m.rope_scaling) name += "_" + nlohmann::json::parse(m.rope_scaling)["rope_type"].get<std::string>();
  std::replace(name.begin(), name.end(), '-', '_');
  return name;
}

// Every model on both backends at TP 1 and 2.
std::vector<Case> cases() {
  const Model models[] = {
      {"tiny-llama31", "", RopeScalingType::kLlama3, false},
      {"tiny-qwen3", "", RopeScalingType::kNone, true},
      {"tiny-qwen2", "", RopeScalingType::kNone, false},  // q/k/v biases.
      {"tiny-yarn", "", RopeScalingType::kYarn, false},
      {"tiny-llama31", R"({"rope_type": "linear", "factor": 4.0})", RopeScalingType::kLinear, false},
      {"tiny-llama31", R"({"rope_type": "dynamic", "factor": 2.0})", RopeScalingType::kDynamic, false},
  };
  std::vector<Case> out;
  for (const char* backend : {"cpu", "emulated"})
    for (const Model& m : models)
      for (int tp : {1, 2}) out.push_back({m, backend, tp});
  return out;
}

class HfReference : public ::testing::TestWithParam<Case> {
 protected:
  // A fresh model directory for `preset` (seed 7), its rope_scaling replaced when asked.
  static fs::path make(const Case& c) {
    const fs::path dir = fs::temp_directory_path() /
                         ("pdserve_hfref_" + std::to_string(getpid()) + "_" + case_name({c, 0}));
    MakeModelOptions o;
    o.preset = c.model.preset;
    o.seed = 7;
    o.out_dir = dir.string();
    EXPECT_TRUE(make_model(o).ok());
    if (*c.model.rope_scaling) {
      std::ifstream in(dir / "config.json");
      nlohmann::json config = nlohmann::json::parse(in);
      config["rope_scaling"] = nlohmann::json::parse(c.model.rope_scaling);
      std::ofstream(dir / "config.json") << config.dump(2);
    }
    return dir;
  }
};

TEST_P(HfReference, EveryPositionsLogitsMatchTheReference) {
  const Case& c = GetParam();
  const fs::path dir = make(c);
  auto config = read_hf_config((dir / "config.json").string());
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->rope_scaling.type, c.model.scaling);
  EXPECT_EQ(config->qk_norm, c.model.qk_norm);
  const std::vector<int> prompt = long_prompt();
  const pdserve::testing::ReferenceHf reference(dir.string());
  const auto want = reference.logits(prompt);
  const auto got = engine_logits(dir.string(), prompt, kPrefill, c.tp, c.backend);
  const double worst = max_abs_diff(got, want);
  std::printf("[ max |delta| ] %-12s %-40s %-8s TP %d: %.3g over %zu positions\n", c.model.preset, c.model.rope_scaling,
              c.backend, c.tp, worst, prompt.size());
  EXPECT_LE(worst, kTolerance);
  fs::remove_all(dir);
}

// The reference's own RoPE tables against the HF formulas evaluated by hand in Python (the same
// values engine/rope_scaling's table test holds): the reference is right on its own.
TEST(HfReferenceTables, MatchHandComputedValues) {
  struct Want {
    const char* preset;
    std::vector<double> inv_freq;
    double attention_scale;
  };
  const Want wants[] = {
      {"tiny-llama31",
       {1.0000000000e+00, 2.4438459944e-01, 1.3042256044e-02, 3.9528470752e-03, 1.2500000000e-03, 3.9528470752e-04,
        1.2500000000e-04, 3.9528470752e-05},
       1.0},
      {"tiny-yarn",
       {1.0000000000e+00, 2.3717082451e-01, 5.0000000000e-02, 7.9056941504e-03, 2.5000000000e-03, 7.9056941504e-04,
        2.5000000000e-04, 7.9056941504e-05},
       1.138629436111989},
  };
  for (const Want& w : wants) {
    const fs::path dir = fs::temp_directory_path() / ("pdserve_hfref_table_" + std::to_string(getpid()));
    ASSERT_TRUE(make_model({.preset = w.preset, .seed = 1, .out_dir = dir.string()}).ok());
    const pdserve::testing::ReferenceHf reference(dir.string());
    ASSERT_EQ(reference.inv_freq().size(), w.inv_freq.size()) << w.preset;
    for (size_t i = 0; i < w.inv_freq.size(); ++i)
      EXPECT_NEAR(reference.inv_freq()[i], w.inv_freq[i], 1e-9 * w.inv_freq[i]) << w.preset << " pair " << i;
    EXPECT_NEAR(reference.attention_scale(), w.attention_scale, 1e-12) << w.preset;
    fs::remove_all(dir);
  }
}

INSTANTIATE_TEST_SUITE_P(Models, HfReference, ::testing::ValuesIn(cases()), case_name);

}  // namespace
}  // namespace pdserve::engine
