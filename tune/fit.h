// Fits the tuner's step laws (tune/types.h) to measured engine steps and KV transfers
// (tune.md §6.3): robust per-group medians, non-negative least squares on relative error, a
// fitted decode regime split, and each law's error on groups the fit did not see, so that the
// report can say how far the profile is to be trusted.
//
// Protocol shared by the three fits:
//  - samples are grouped by the work they did and each group is represented by its MEDIAN
//    time, so that a noisy step (a shared box) or an outlier moves nothing;
//  - coefficients minimise Σ((predicted − measured)/measured)², so that a 16-token step
//    counts as much as an 8192-token one (the laws span orders of magnitude of time);
//  - groups are ordered by their work and every 4th (indices 3, 7, 11, …) is held out: the
//    law fitted on the others is scored on them (FitError), then the returned law is refitted
//    on all groups.
#pragma once

#include <utility>
#include <vector>

#include "common/status.h"
#include "tune/step_sample.h"
#include "tune/types.h"

namespace pdserve::tune {

// Times below this are read as this (the clock's resolution), so that a relative error or
// weight is defined for a transfer the prefill fully hid (0 s).
inline constexpr double kTimeResolutionS = 1e-6;

// One group of samples as fitted: its work, its median time and the law's prediction.
struct FitGroup {
  double x = 0;                 // Prefill: Σl. Decode: B. KV: tokens.
  double kv_tokens = 0;         // Decode only: the group's mean ΣK.
  int samples = 0;
  double measured_s = 0;        // Median over the group's samples.
  double predicted_s = 0;       // By the returned law (fitted on all groups).
  bool held_out = false;        // Scored in FitError.
};

struct PrefillFit {
  PrefillLaw law;
  FitError error;
  std::vector<FitGroup> groups;  // Ascending Σl.
};

struct DecodeFit {
  DecodeLaw law;
  FitError error;
  std::vector<FitGroup> groups;  // Ascending (B, ΣK bucket).
};

struct KvFit {
  KvLaw law;
  FitError error;
  std::vector<FitGroup> groups;  // Ascending tokens.
};

// Distinct Σl needed by fit_prefill: 3 to fit a, b, c and 1 to hold out.
inline constexpr int kMinPrefillGroups = 4;
// Samples a prefill group needs to be fitted and scored: the profiler computes each prompt
// length several times, while the totals of prompts that happened to share a step are seen once
// or twice — single noisy steps whose median is no median.
inline constexpr int kMinPrefillGroupSamples = 3;
// Decode groups needed by fit_decode (3 coefficients + 1 held out), and by each side of a
// regime split (more than its 3 coefficients, so that a side is not fitted exactly by
// construction).
inline constexpr int kMinDecodeGroups = 4;
inline constexpr int kMinGroupsPerRegime = 4;
// A split is kept only when it brings the total squared relative error below this fraction of
// the one-regime fit's: three more coefficients always lower it somewhat on noise alone.
inline constexpr double kSplitGain = 0.5;
// Distinct sizes needed by fit_kv: 2 coefficients + 1 to score.
inline constexpr int kMinKvSizes = 3;
// ΣK buckets per octave when grouping decode steps: a run at fixed B grows ΣK by B per step,
// and steps within 2^(1/8) ≈ 9% of ΣK of each other are taken as the same work.
inline constexpr int kKvBucketsPerOctave = 8;
// Samples a decode group needs to be fitted and scored: a batch the profiler drives runs for
// tens of steps, while the batch sizes passed through as it fills and drains are seen once or
// twice — single noisy steps whose median is no median.
inline constexpr int kMinDecodeGroupSamples = 3;

// a + b·Σl + c·Σl² from prefill-only steps (decode_seqs == 0, prefill_tokens > 0), grouped by
// prefill_tokens, groups of fewer than kMinPrefillGroupSamples steps left out. FailedPrecondition when fewer than kMinPrefillGroups distinct Σl;
// InvalidArgument on a negative or non-finite wall time.
StatusOr<PrefillFit> fit_prefill(const std::vector<StepSample>& samples);

// a + b·B + c·ΣK from decode-only steps (prefill_tokens == 0, decode_seqs > 0), grouped by
// (B, ⌊kKvBucketsPerOctave·log2(1 + ΣK)⌋), groups of fewer than kMinDecodeGroupSamples steps
// left out. The regime split is chosen among the distinct B
// values (split = the smallest B of the upper regime) and kept only by kSplitGain; held-out
// scoring reruns the split choice on the training groups. FailedPrecondition when fewer than
// kMinDecodeGroups groups; InvalidArgument on a negative or non-finite wall time.
StatusOr<DecodeFit> fit_decode(const std::vector<StepSample>& samples);

// alpha + per_token·tokens from (tokens, seconds) transfers, grouped by tokens. With at least 4
// sizes every 4th is held out; with 3 (the profile's default) each size is left out in turn
// and scored by the law fitted on the other two. FailedPrecondition when fewer than
// kMinKvSizes sizes; InvalidArgument on negative tokens or a negative or non-finite time.
StatusOr<KvFit> fit_kv(const std::vector<std::pair<double, double>>& tokens_seconds);

}  // namespace pdserve::tune
