#include "tune/fit.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

namespace pdserve::tune {
namespace {

// Deterministic multiplicative noise: uniform in [1 − spread, 1 + spread], from a seeded
// mt19937_64 read directly (std::uniform_real_distribution differs between libraries).
class Noise {
 public:
  explicit Noise(double spread, uint64_t seed = 42) : spread_(spread), rng_(seed) {}
  double operator()() {
    const double u = static_cast<double>(rng_() >> 11) * 0x1.0p-53;
    return 1 + spread_ * (2 * u - 1);
  }

 private:
  double spread_;
  std::mt19937_64 rng_;
};

constexpr double kOutlierFactor = 5;  // One step per group stalls (a shared box).

StepSample prefill_step(int64_t tokens, double wall_s) {
  StepSample s;
  s.prefill_tokens = tokens;
  s.prefill_seqs = 1;
  s.wall_s = wall_s;
  return s;
}

StepSample decode_step(int batch, int64_t kv_tokens, double wall_s) {
  StepSample s;
  s.decode_seqs = batch;
  s.kv_tokens = kv_tokens;
  s.wall_s = wall_s;
  return s;
}

const std::vector<int64_t> kPrefillSizes = {16, 32, 48, 64, 128, 256, 512, 1024, 1536, 2048, 3072, 4096, 6144, 8192};
const PrefillLaw kPrefillLaw{2e-3, 5e-6, 3e-10};

// Seven noisy repeats and one outlier per size, plus steps the prefill fit must ignore.
std::vector<StepSample> prefill_samples(double (*wall)(int64_t), double spread) {
  Noise noise(spread);
  std::vector<StepSample> samples;
  for (int64_t l : kPrefillSizes) {
    for (int r = 0; r < 7; ++r) samples.push_back(prefill_step(l, wall(l) * noise()));
    samples.push_back(prefill_step(l, wall(l) * kOutlierFactor));
    StepSample mixed = prefill_step(l, 1.0);  // A mixed step: not prefill-only.
    mixed.decode_seqs = 4;
    samples.push_back(mixed);
  }
  samples.push_back(decode_step(8, 800, 1.0));
  return samples;
}

double law_wall(int64_t l) { return kPrefillLaw.step_seconds(static_cast<double>(l)); }
// Not of the law's form: a step at 1000 tokens.
double step_wall(int64_t l) { return l < 1000 ? 0.01 : 0.1; }

void expect_relative(double actual, double expected, double tolerance, const char* what) {
  EXPECT_NEAR(actual / expected, 1, tolerance) << what << ": " << actual << " vs " << expected;
}

TEST(FitPrefill, RecoversLawThroughNoiseAndOutliers) {
  StatusOr<PrefillFit> fit = fit_prefill(prefill_samples(law_wall, 0.03));
  ASSERT_TRUE(fit.ok()) << fit.status();
  expect_relative(fit->law.a, kPrefillLaw.a, 0.05, "a");
  expect_relative(fit->law.b, kPrefillLaw.b, 0.05, "b");
  expect_relative(fit->law.c, kPrefillLaw.c, 0.10, "c");
  EXPECT_EQ(fit->error.points, static_cast<int>(kPrefillSizes.size()));
  EXPECT_EQ(fit->error.held_out, static_cast<int>(kPrefillSizes.size() / 4));
  EXPECT_LT(fit->error.median_abs_rel, 0.02);
  EXPECT_LT(fit->error.p90_abs_rel, 0.03);
  ASSERT_EQ(fit->groups.size(), kPrefillSizes.size());
  for (size_t i = 0; i < fit->groups.size(); ++i) {
    EXPECT_EQ(fit->groups[i].x, static_cast<double>(kPrefillSizes[i]));
    EXPECT_EQ(fit->groups[i].samples, 8);  // The mixed step is not among them.
    EXPECT_EQ(fit->groups[i].held_out, i % 4 == 3) << i;
  }
}

TEST(FitPrefill, CleanDataHasNoHeldOutError) {
  StatusOr<PrefillFit> fit = fit_prefill(prefill_samples(law_wall, 0));
  ASSERT_TRUE(fit.ok()) << fit.status();
  EXPECT_LT(fit->error.p90_abs_rel, 1e-6);
  expect_relative(fit->law.c, kPrefillLaw.c, 1e-6, "c");
}

TEST(FitPrefill, HeldOutErrorExposesDataTheLawCannotFit) {
  StatusOr<PrefillFit> fit = fit_prefill(prefill_samples(step_wall, 0));
  ASSERT_TRUE(fit.ok()) << fit.status();
  EXPECT_GT(fit->error.median_abs_rel, 0.2);
  EXPECT_GT(fit->error.p90_abs_rel, 0.3);
}

TEST(FitPrefill, NeedsFourDistinctSizes) {
  std::vector<StepSample> samples;
  for (int64_t l : {16, 64, 256})
    for (int r = 0; r < 5; ++r) samples.push_back(prefill_step(l, law_wall(l)));
  StatusOr<PrefillFit> fit = fit_prefill(samples);
  EXPECT_EQ(fit.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(fit.status().message().find("3 prefill sizes"), std::string::npos) << fit.status();
  EXPECT_NE(fit.status().message().find("at least 4"), std::string::npos) << fit.status();
  // A fourth size seen in passing (fewer than kMinPrefillGroupSamples steps) does not count.
  for (int r = 0; r < kMinPrefillGroupSamples - 1; ++r) samples.push_back(prefill_step(1024, law_wall(1024)));
  EXPECT_EQ(fit_prefill(samples).status().code(), absl::StatusCode::kFailedPrecondition);
  samples.push_back(prefill_step(1024, law_wall(1024)));
  EXPECT_TRUE(fit_prefill(samples).ok());
}

TEST(FitPrefill, RejectsNegativeTime) {
  std::vector<StepSample> samples = prefill_samples(law_wall, 0);
  samples.push_back(prefill_step(16, -1));
  EXPECT_EQ(fit_prefill(samples).status().code(), absl::StatusCode::kInvalidArgument);
}

// ---- Decode ----

const std::vector<int> kBatches = {1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128};
const std::vector<int64_t> kContexts = {128, 512, 2048};
// Memory-bound below B = 32, compute-bound from it.
const DecodeLaw::Regime kLow{5e-3, 1e-4, 5e-8}, kHigh{8e-3, 3e-4, 5e-8};

std::vector<StepSample> decode_samples(const DecodeLaw& law, double spread) {
  Noise noise(spread, 7);
  std::vector<StepSample> samples;
  for (int b : kBatches)
    for (int64_t ctx : kContexts) {
      const int64_t kv = b * ctx;
      const double wall = law.step_seconds(b, static_cast<double>(kv));
      for (int r = 0; r < 5; ++r) samples.push_back(decode_step(b, kv, wall * noise()));
      samples.push_back(decode_step(b, kv, wall * kOutlierFactor));
    }
  samples.push_back(prefill_step(512, 1.0));  // Not decode-only.
  return samples;
}

DecodeLaw kinked_law() {
  DecodeLaw law;
  law.lo = kLow;
  law.hi = kHigh;
  law.split = 32;
  return law;
}

DecodeLaw one_regime_law() {
  DecodeLaw law;
  law.lo = law.hi = kHigh;
  return law;
}

void expect_regime(const DecodeLaw::Regime& actual, const DecodeLaw::Regime& expected, double tolerance) {
  expect_relative(actual.a, expected.a, tolerance, "a");
  expect_relative(actual.b, expected.b, tolerance, "b");
  expect_relative(actual.c, expected.c, 3 * tolerance, "c");  // ΣK is the smallest term.
}

TEST(FitDecode, FindsTheRegimeSplitAtAKink) {
  StatusOr<DecodeFit> fit = fit_decode(decode_samples(kinked_law(), 0.01));
  ASSERT_TRUE(fit.ok()) << fit.status();
  EXPECT_EQ(fit->law.split, 32);
  expect_regime(fit->law.lo, kLow, 0.05);
  expect_regime(fit->law.hi, kHigh, 0.05);
  EXPECT_EQ(fit->error.points, static_cast<int>(kBatches.size() * kContexts.size()));
  EXPECT_LT(fit->error.median_abs_rel, 0.02);
  EXPECT_LT(fit->error.p90_abs_rel, 0.03);
}

TEST(FitDecode, KeepsOneRegimeWithoutAKink) {
  StatusOr<DecodeFit> fit = fit_decode(decode_samples(one_regime_law(), 0.01));
  ASSERT_TRUE(fit.ok()) << fit.status();
  EXPECT_TRUE(std::isinf(fit->law.split)) << fit->law.split;
  expect_regime(fit->law.lo, kHigh, 0.05);
  EXPECT_LT(fit->error.p90_abs_rel, 0.03);
}

TEST(FitDecode, OneRegimeFitOfAKinkShowsInItsHeldOutError) {
  // The same kink, but with too few groups above it to fit a second regime.
  std::vector<StepSample> samples;
  for (const StepSample& s : decode_samples(kinked_law(), 0))
    if (s.decode_seqs < 48) samples.push_back(s);
  StatusOr<DecodeFit> fit = fit_decode(samples);
  ASSERT_TRUE(fit.ok()) << fit.status();
  EXPECT_TRUE(std::isinf(fit->law.split));
  EXPECT_GT(fit->error.p90_abs_rel, 0.1);
}

TEST(FitDecode, BucketsNearbyKvTotalsTogetherAndDropsPassingBatches) {
  std::vector<StepSample> samples;
  for (int b : {1, 2, 4, 8}) {
    // ⌊8·log2(1 + ΣK)⌋ = 79 for ΣK in [938, 1023): one group.
    samples.push_back(decode_step(b, 940, 0.010));
    samples.push_back(decode_step(b, 1020, 0.012));
    samples.push_back(decode_step(b, 1000, 0.011));
    // The next bucket: another group.
    for (int r = 0; r < 3; ++r) samples.push_back(decode_step(b, 1024 + r, 0.020));
  }
  // A batch size seen in passing (the batch filling up): fewer than kMinDecodeGroupSamples steps.
  samples.push_back(decode_step(3, 1000, 0.5));
  samples.push_back(decode_step(3, 1001, 0.5));
  StatusOr<DecodeFit> fit = fit_decode(samples);
  ASSERT_TRUE(fit.ok()) << fit.status();
  ASSERT_EQ(fit->groups.size(), 8u);
  EXPECT_EQ(fit->groups[0].x, 1);
  EXPECT_EQ(fit->groups[0].samples, 3);
  EXPECT_NEAR(fit->groups[0].kv_tokens, (940 + 1020 + 1000) / 3.0, 1e-9);
  EXPECT_NEAR(fit->groups[0].measured_s, 0.011, 1e-12);  // The median.
  EXPECT_EQ(fit->groups[1].samples, 3);
  EXPECT_EQ(fit->groups[1].kv_tokens, 1025);
  for (const FitGroup& g : fit->groups) EXPECT_NE(g.x, 3);
}

TEST(FitDecode, NeedsFourGroups) {
  std::vector<StepSample> samples;
  for (int r = 0; r < kMinDecodeGroupSamples; ++r)
    for (int b : {1, 2, 4}) samples.push_back(decode_step(b, 100 * b, 0.01));
  StatusOr<DecodeFit> fit = fit_decode(samples);
  EXPECT_EQ(fit.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(fit.status().message().find("at least 4"), std::string::npos) << fit.status();
}

// ---- KV ----

const KvLaw kKvLaw{1e-3, 2e-6};

std::vector<std::pair<double, double>> kv_samples(const std::vector<double>& sizes, double spread) {
  Noise noise(spread, 3);
  std::vector<std::pair<double, double>> samples;
  for (double tokens : sizes) {
    for (int r = 0; r < 3; ++r) samples.emplace_back(tokens, kKvLaw.seconds(tokens) * noise());
    samples.emplace_back(tokens, kKvLaw.seconds(tokens) * kOutlierFactor);
  }
  return samples;
}

TEST(FitKv, ThreeSizesAreScoredLeaveOneOut) {
  StatusOr<KvFit> fit = fit_kv(kv_samples({128, 1024, 4096}, 0.01));
  ASSERT_TRUE(fit.ok()) << fit.status();
  expect_relative(fit->law.alpha, kKvLaw.alpha, 0.05, "alpha");
  expect_relative(fit->law.per_token, kKvLaw.per_token, 0.05, "per_token");
  EXPECT_EQ(fit->error.points, 3);
  EXPECT_EQ(fit->error.held_out, 3);
  EXPECT_LT(fit->error.p90_abs_rel, 0.05);
  for (const FitGroup& g : fit->groups) EXPECT_TRUE(g.held_out);
}

TEST(FitKv, ManySizesHoldOutEveryFourth) {
  StatusOr<KvFit> fit = fit_kv(kv_samples({64, 128, 256, 512, 1024, 2048, 4096, 8192}, 0.01));
  ASSERT_TRUE(fit.ok()) << fit.status();
  EXPECT_EQ(fit->error.points, 8);
  EXPECT_EQ(fit->error.held_out, 2);
  EXPECT_TRUE(fit->groups[3].held_out);
  EXPECT_FALSE(fit->groups[4].held_out);
  EXPECT_LT(fit->error.p90_abs_rel, 0.03);
}

TEST(FitKv, MinimisesRelativeNotAbsoluteError) {
  // Σ((α + β·l − y)/y)² over (0, 1), (1, 2), (2, 2): normal equations [1.5 0.75; 0.75 1.25]·x =
  // (2, 1.5), so α = 22/21 and β = 4/7 (absolute least squares would give 7/6 and 1/2).
  StatusOr<KvFit> fit = fit_kv({{0, 1}, {1, 2}, {2, 2}});
  ASSERT_TRUE(fit.ok()) << fit.status();
  EXPECT_NEAR(fit->law.alpha, 22.0 / 21, 1e-12);
  EXPECT_NEAR(fit->law.per_token, 4.0 / 7, 1e-12);
}

TEST(FitKv, LeaveOneOutExposesDataTheLawCannotFit) {
  StatusOr<KvFit> fit = fit_kv({{128, 0.001}, {1024, 0.1}, {4096, 0.002}});
  ASSERT_TRUE(fit.ok()) << fit.status();
  EXPECT_GT(fit->error.median_abs_rel, 0.5);
}

TEST(FitKv, AFullyHiddenTransferIsMeasuredAtTheClockResolution) {
  StatusOr<KvFit> fit = fit_kv({{128, 0}, {1024, 0}, {4096, 0}});
  ASSERT_TRUE(fit.ok()) << fit.status();
  EXPECT_LT(fit->law.seconds(4096), 2 * kTimeResolutionS);
  EXPECT_TRUE(std::isfinite(fit->error.p90_abs_rel));
}

TEST(FitKv, NeedsThreeSizesAndValidInput) {
  StatusOr<KvFit> fit = fit_kv({{128, 0.001}, {128, 0.0011}, {1024, 0.003}});
  EXPECT_EQ(fit.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(fit.status().message().find("at least 3"), std::string::npos) << fit.status();
  EXPECT_EQ(fit_kv({{-1, 0.001}, {128, 0.001}, {1024, 0.003}}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(fit_kv({{64, std::nan("")}, {128, 0.001}, {1024, 0.003}}).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace pdserve::tune
