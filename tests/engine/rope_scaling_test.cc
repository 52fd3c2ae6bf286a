// rope_frequencies against values computed independently, in double, from Hugging Face
// transformers' formulas (modeling_rope_utils), for each scaling type — Llama-3.1's real
// configuration among them — and the yarn attention factor in each of its three forms.
#include <gtest/gtest.h>

#include <cmath>
#include <utility>
#include <vector>

#include "engine/rope_scaling.h"

namespace pdserve::engine {
namespace {

struct TableCase {
  const char* name;
  RopeScaling scaling;
  float theta;
  int head_dim;
  int max_position_embeddings;
  std::vector<std::pair<int, double>> inv_freq;  // (pair, expected inverse frequency)
  double attention_scale;
};

RopeScaling llama3(double factor, double low, double high, int original) {
  RopeScaling s;
  s.type = RopeScalingType::kLlama3;
  s.factor = factor;
  s.low_freq_factor = low;
  s.high_freq_factor = high;
  s.original_max_position_embeddings = original;
  return s;
}

RopeScaling of_type(RopeScalingType type, double factor) {
  RopeScaling s;
  s.type = type;
  s.factor = factor;
  return s;
}

RopeScaling yarn(double factor, int original) {
  RopeScaling s = of_type(RopeScalingType::kYarn, factor);
  s.original_max_position_embeddings = original;
  return s;
}

RopeScaling yarn_mscale() {  // DeepSeek-style: mscale / mscale_all_dim, untruncated ramp.
  RopeScaling s = yarn(40.0, 4096);
  s.mscale = 2.0;
  s.mscale_all_dim = 1.0;
  s.truncate = false;
  s.beta_fast = 16.0;
  s.beta_slow = 2.0;
  return s;
}

RopeScaling yarn_explicit_factor() {  // Qwen-style context with an explicit attention factor.
  RopeScaling s = yarn(4.0, 32768);
  s.attention_factor = 1.5;
  return s;
}

// Expected values: the HF formulas evaluated by hand in Python (plain math, double precision),
// not with this code.
const TableCase kCases[] = {
    {"none", {}, 10000.0f, 8, 256, {{0, 1.0}, {1, 0.1}, {2, 0.01}, {3, 0.001}}, 1.0},
    // Llama-3.1-8B's rope_scaling: pairs 0-28 kept, 29-34 smoothed, 35-63 divided by 8.
    {"llama3.1",
     llama3(8.0, 1.0, 4.0, 8192),
     500000.0f,
     128,
     131072,
     {{0, 1.0000000000e+00}, {1, 8.1461723386e-01}, {20, 1.6560440081e-02}, {28, 3.2114459948e-03},
      {29, 2.1665707635e-03}, {30, 1.3718935678e-03}, {31, 8.5675141292e-04}, {32, 5.2484616099e-04},
      {33, 3.1269375038e-04}, {34, 1.7850781277e-04}, {35, 9.5562123540e-05}, {40, 3.4281021960e-05},
      {63, 3.0689259889e-07}},
     1.0},
    {"tiny-llama31",
     llama3(8.0, 1.0, 4.0, 64),
     10000.0f,
     16,
     256,
     {{0, 1.0000000000e+00}, {1, 2.4438459944e-01}, {2, 1.3042256044e-02}, {3, 3.9528470752e-03},
      {4, 1.2500000000e-03}, {5, 3.9528470752e-04}, {6, 1.2500000000e-04}, {7, 3.9528470752e-05}},
     1.0},
    {"linear",
     of_type(RopeScalingType::kLinear, 4.0),
     10000.0f,
     16,
     256,
     {{0, 2.5000000000e-01}, {1, 7.9056941504e-02}, {2, 2.5000000000e-02}, {3, 7.9056941504e-03},
      {4, 2.5000000000e-03}, {5, 7.9056941504e-04}, {6, 2.5000000000e-04}, {7, 7.9056941504e-05}},
     1.0},
    // Static dynamic NTK: HF's frequencies at sequence length max_position_embeddings * factor.
    {"dynamic",
     of_type(RopeScalingType::kDynamic, 2.0),
     10000.0f,
     16,
     256,
     {{0, 1.0000000000e+00}, {1, 2.7029612569e-01}, {2, 7.3059995564e-02}, {3, 1.9747833744e-02},
      {4, 5.3377629519e-03}, {5, 1.4427766458e-03}, {6, 3.8997693759e-04}, {7, 1.0540925534e-04}},
     1.0},
    {"yarn",
     yarn(4.0, 64),
     10000.0f,
     16,
     256,
     {{0, 1.0000000000e+00}, {1, 2.3717082451e-01}, {2, 5.0000000000e-02}, {3, 7.9056941504e-03},
      {4, 2.5000000000e-03}, {5, 7.9056941504e-04}, {6, 2.5000000000e-04}, {7, 7.9056941504e-05}},
     1.138629436111989},
    {"yarn mscale, untruncated",
     yarn_mscale(),
     10000.0f,
     32,
     163840,
     {{0, 1.0000000000e+00}, {1, 5.6234132519e-01}, {2, 3.1622776602e-01}, {3, 1.7782794100e-01},
      {4, 1.0000000000e-01}, {5, 5.6234132519e-02}, {6, 3.1622776602e-02}, {7, 1.5096118957e-02},
      {8, 5.7901049624e-03}, {9, 1.7382186218e-03}, {10, 1.2395236927e-04}, {11, 4.4456985251e-05},
      {12, 2.5000000000e-05}, {13, 1.4058533130e-05}, {14, 7.9056941504e-06}, {15, 4.4456985251e-06}},
     1.269480015985188},
    {"yarn attention_factor",
     yarn_explicit_factor(),
     1000000.0f,
     128,
     131072,
     {{0, 1.0000000000e+00}, {10, 1.1547819847e-01}, {20, 1.3335214322e-02}, {30, 1.0643609812e-03},
      {40, 4.4456985251e-05}, {50, 5.1338125661e-06}, {63, 3.1023444019e-07}},
     1.5},
};

TEST(RopeScaling, FrequenciesMatchIndependentTable) {
  for (const TableCase& t : kCases) {
    ASSERT_TRUE(t.scaling.validate().ok()) << t.name;
    const RopeFrequencies got = rope_frequencies(t.scaling, t.theta, t.head_dim, t.max_position_embeddings);
    ASSERT_EQ(got.inv_freq.size(), size_t(t.head_dim / 2)) << t.name;
    for (const auto& [pair, want] : t.inv_freq)
      EXPECT_NEAR(got.inv_freq[size_t(pair)], want, 1e-6 * want) << t.name << " pair " << pair;
    EXPECT_NEAR(got.attention_scale, t.attention_scale, 1e-6) << t.name;
  }
}

// The unscaled table is the expression the kernels evaluated before there were tables, bit for
// bit: published outputs of unscaled models do not move.
TEST(RopeScaling, UnscaledTableIsTheKernelsFormerExpression) {
  for (int head_dim : {8, 48, 64, 128}) {
    const RopeFrequencies got = rope_frequencies({}, 10000.0f, head_dim, 512);
    for (int i = 0; i < head_dim / 2; ++i)
      EXPECT_EQ(got.inv_freq[size_t(i)], 1.0f / std::pow(10000.0f, float(2 * i) / float(head_dim))) << head_dim;
    EXPECT_EQ(got.attention_scale, 1.0f);
  }
}

TEST(RopeScaling, ValidateRefusesWhatHfRefuses) {
  EXPECT_FALSE(of_type(RopeScalingType::kLinear, 0.5).validate().ok());
  EXPECT_FALSE(llama3(8.0, 4.0, 1.0, 8192).validate().ok());  // high <= low
  EXPECT_FALSE(llama3(8.0, 1.0, 4.0, 0).validate().ok());     // no original context
  RopeScaling negative = yarn(4.0, 64);
  negative.attention_factor = -1.0;
  EXPECT_FALSE(negative.validate().ok());
  EXPECT_TRUE(RopeScaling{}.validate().ok());
}

}  // namespace
}  // namespace pdserve::engine
