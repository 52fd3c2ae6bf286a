#include "tune/fit.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>

#include "common/percentile.h"
#include "tune/nnls.h"

namespace pdserve::tune {
namespace {

// Drops the groups of fewer than `min_samples` steps (`samples` counts a group's).
template <typename Map, typename Count>
void erase_groups_smaller_than(int min_samples, Map* groups, Count samples) {
  std::erase_if(*groups, [&](const auto& kv) { return static_cast<int>(samples(kv.second)) < min_samples; });
}

double floored(double seconds) { return std::max(seconds, kTimeResolutionS); }

Status check_time(const char* fit, double seconds) {
  if (!std::isfinite(seconds) || seconds < 0)
    return absl::InvalidArgumentError(absl::StrCat(fit, ": a measured time is ", seconds, " s"));
  return absl::OkStatus();
}

bool is_held_out(size_t index) { return index % 4 == 3; }

// Coefficients ≥ 0 minimising Σ((features_i·x − measured_i)/measured_i)²: NNLS on rows
// divided by their measurement.
StatusOr<std::vector<double>> fit_relative(const std::vector<std::vector<double>>& features,
                                           const std::vector<double>& measured) {
  const int rows = static_cast<int>(features.size());
  const int cols = static_cast<int>(features.front().size());
  Matrix a(rows, cols);
  std::vector<double> y(rows);
  for (int i = 0; i < rows; ++i) {
    const double w = 1 / floored(measured[i]);
    for (int j = 0; j < cols; ++j) a.at(i, j) = features[i][j] * w;
    y[i] = measured[i] * w;
  }
  return nnls(a, y);
}

double abs_rel_error(double predicted, double measured) {
  return std::abs(predicted - measured) / floored(measured);
}

FitError score(const std::vector<double>& abs_rel_errors, int points) {
  FitError e;
  e.points = points;
  e.held_out = static_cast<int>(abs_rel_errors.size());
  if (!abs_rel_errors.empty()) {
    e.median_abs_rel = percentile(abs_rel_errors, 50);
    e.p90_abs_rel = percentile(abs_rel_errors, 90);
  }
  return e;
}

// ---- Prefill ----

std::vector<double> prefill_features(double tokens) { return {1, tokens, tokens * tokens}; }

StatusOr<PrefillLaw> fit_prefill_law(const std::vector<const FitGroup*>& groups) {
  std::vector<std::vector<double>> features;
  std::vector<double> measured;
  for (const FitGroup* g : groups) {
    features.push_back(prefill_features(g->x));
    measured.push_back(g->measured_s);
  }
  PD_ASSIGN_OR_RETURN(std::vector<double> x, fit_relative(features, measured));
  return PrefillLaw{x[0], x[1], x[2]};
}

// ---- Decode ----

std::vector<double> decode_features(const FitGroup& g) { return {1, g.x, g.kv_tokens}; }

struct RegimeFit {
  DecodeLaw::Regime regime;
  double squared_rel_error = 0;
};

StatusOr<RegimeFit> fit_regime(const std::vector<const FitGroup*>& groups) {
  std::vector<std::vector<double>> features;
  std::vector<double> measured;
  for (const FitGroup* g : groups) {
    features.push_back(decode_features(*g));
    measured.push_back(g->measured_s);
  }
  PD_ASSIGN_OR_RETURN(std::vector<double> x, fit_relative(features, measured));
  RegimeFit fit;
  fit.regime = DecodeLaw::Regime{x[0], x[1], x[2]};
  for (const FitGroup* g : groups) {
    const double e = abs_rel_error(fit.regime.a + fit.regime.b * g->x + fit.regime.c * g->kv_tokens, g->measured_s);
    fit.squared_rel_error += e * e;
  }
  return fit;
}

// One regime, or two split at the distinct B that lowers the total squared relative error
// most, when that is below kSplitGain of one regime's.
StatusOr<DecodeLaw> fit_decode_law(const std::vector<const FitGroup*>& groups) {
  PD_ASSIGN_OR_RETURN(RegimeFit one, fit_regime(groups));
  DecodeLaw law;
  law.lo = law.hi = one.regime;
  std::vector<double> batches;
  for (const FitGroup* g : groups) batches.push_back(g->x);
  std::sort(batches.begin(), batches.end());
  batches.erase(std::unique(batches.begin(), batches.end()), batches.end());
  double best_error = kSplitGain * one.squared_rel_error;
  for (size_t k = 1; k < batches.size(); ++k) {
    std::vector<const FitGroup*> lo, hi;
    for (const FitGroup* g : groups) (g->x < batches[k] ? lo : hi).push_back(g);
    if (static_cast<int>(lo.size()) < kMinGroupsPerRegime || static_cast<int>(hi.size()) < kMinGroupsPerRegime) continue;
    PD_ASSIGN_OR_RETURN(RegimeFit lo_fit, fit_regime(lo));
    PD_ASSIGN_OR_RETURN(RegimeFit hi_fit, fit_regime(hi));
    const double error = lo_fit.squared_rel_error + hi_fit.squared_rel_error;
    if (error < best_error) {
      best_error = error;
      law.lo = lo_fit.regime;
      law.hi = hi_fit.regime;
      law.split = batches[k];
    }
  }
  return law;
}

int64_t kv_bucket(int64_t kv_tokens) {
  return static_cast<int64_t>(std::floor(kKvBucketsPerOctave * std::log2(1.0 + static_cast<double>(kv_tokens))));
}

// ---- KV ----

StatusOr<KvLaw> fit_kv_law(const std::vector<const FitGroup*>& groups) {
  std::vector<std::vector<double>> features;
  std::vector<double> measured;
  for (const FitGroup* g : groups) {
    features.push_back({1, g->x});
    measured.push_back(g->measured_s);
  }
  PD_ASSIGN_OR_RETURN(std::vector<double> x, fit_relative(features, measured));
  return KvLaw{x[0], x[1]};
}

// Scores the held-out groups by the law fitted on the others, then refits on all groups and
// records each group's prediction by that law.
template <typename Law>
StatusOr<std::pair<Law, FitError>> hold_out_and_refit(std::vector<FitGroup>& groups,
                                                      StatusOr<Law> (*fit)(const std::vector<const FitGroup*>&),
                                                      double (*predict)(const Law&, const FitGroup&)) {
  std::vector<const FitGroup*> train, held_out, all;
  for (size_t i = 0; i < groups.size(); ++i) {
    groups[i].held_out = is_held_out(i);
    (groups[i].held_out ? held_out : train).push_back(&groups[i]);
    all.push_back(&groups[i]);
  }
  PD_ASSIGN_OR_RETURN(Law train_law, fit(train));
  std::vector<double> errors;
  for (const FitGroup* g : held_out) errors.push_back(abs_rel_error(predict(train_law, *g), g->measured_s));
  PD_ASSIGN_OR_RETURN(Law law, fit(all));
  for (FitGroup& g : groups) g.predicted_s = predict(law, g);
  return std::make_pair(law, score(errors, static_cast<int>(groups.size())));
}

double predict_prefill(const PrefillLaw& law, const FitGroup& g) { return law.step_seconds(g.x); }
double predict_decode(const DecodeLaw& law, const FitGroup& g) { return law.step_seconds(g.x, g.kv_tokens); }
double predict_kv(const KvLaw& law, const FitGroup& g) { return law.seconds(g.x); }

}  // namespace

StatusOr<PrefillFit> fit_prefill(const std::vector<StepSample>& samples) {
  std::map<int64_t, std::vector<double>> by_tokens;
  size_t used = 0;
  for (const StepSample& s : samples) {
    if (s.decode_seqs != 0 || s.prefill_tokens <= 0) continue;
    PD_RETURN_IF_ERROR(check_time("fit_prefill", s.wall_s));
    by_tokens[s.prefill_tokens].push_back(s.wall_s);
    ++used;
  }
  erase_groups_smaller_than(kMinPrefillGroupSamples, &by_tokens, [](const std::vector<double>& w) { return w.size(); });
  if (static_cast<int>(by_tokens.size()) < kMinPrefillGroups)
    return absl::FailedPreconditionError(absl::StrCat("fit_prefill: ", by_tokens.size(), " prefill sizes of at least ",
                                                      kMinPrefillGroupSamples, " steps among ", used,
                                                      " prefill-only steps; at least ", kMinPrefillGroups, " are needed"));
  PrefillFit fit;
  for (const auto& [tokens, walls] : by_tokens) {
    FitGroup g;
    g.x = static_cast<double>(tokens);
    g.samples = static_cast<int>(walls.size());
    g.measured_s = percentile(walls, 50);
    fit.groups.push_back(g);
  }
  PD_ASSIGN_OR_RETURN(auto result, hold_out_and_refit(fit.groups, &fit_prefill_law, &predict_prefill));
  std::tie(fit.law, fit.error) = result;
  return fit;
}

StatusOr<DecodeFit> fit_decode(const std::vector<StepSample>& samples) {
  struct Bucket {
    std::vector<double> walls;
    double kv_sum = 0;
  };
  std::map<std::pair<int, int64_t>, Bucket> by_work;
  size_t used = 0;
  for (const StepSample& s : samples) {
    if (s.prefill_tokens != 0 || s.decode_seqs <= 0) continue;
    PD_RETURN_IF_ERROR(check_time("fit_decode", s.wall_s));
    Bucket& b = by_work[{s.decode_seqs, kv_bucket(s.kv_tokens)}];
    b.walls.push_back(s.wall_s);
    b.kv_sum += static_cast<double>(s.kv_tokens);
    ++used;
  }
  erase_groups_smaller_than(kMinDecodeGroupSamples, &by_work, [](const auto& b) { return b.walls.size(); });
  if (static_cast<int>(by_work.size()) < kMinDecodeGroups)
    return absl::FailedPreconditionError(absl::StrCat("fit_decode: ", by_work.size(), " (batch, ΣK) groups of at least ",
                                                      kMinDecodeGroupSamples, " steps among ", used,
                                                      " decode-only steps; at least ", kMinDecodeGroups, " are needed"));
  DecodeFit fit;
  for (const auto& [key, bucket] : by_work) {
    FitGroup g;
    g.x = key.first;
    g.samples = static_cast<int>(bucket.walls.size());
    g.kv_tokens = bucket.kv_sum / g.samples;
    g.measured_s = percentile(bucket.walls, 50);
    fit.groups.push_back(g);
  }
  PD_ASSIGN_OR_RETURN(auto result, hold_out_and_refit(fit.groups, &fit_decode_law, &predict_decode));
  std::tie(fit.law, fit.error) = result;
  return fit;
}

StatusOr<KvFit> fit_kv(const std::vector<std::pair<double, double>>& tokens_seconds) {
  std::map<double, std::vector<double>> by_tokens;
  for (const auto& [tokens, seconds] : tokens_seconds) {
    if (!std::isfinite(tokens) || tokens < 0)
      return absl::InvalidArgumentError(absl::StrCat("fit_kv: a transfer of ", tokens, " tokens"));
    PD_RETURN_IF_ERROR(check_time("fit_kv", seconds));
    by_tokens[tokens].push_back(seconds);
  }
  if (static_cast<int>(by_tokens.size()) < kMinKvSizes)
    return absl::FailedPreconditionError(absl::StrCat("fit_kv: ", by_tokens.size(), " distinct prompt sizes among ",
                                                      tokens_seconds.size(), " transfers; at least ", kMinKvSizes, " are needed"));
  KvFit fit;
  for (const auto& [tokens, seconds] : by_tokens) {
    FitGroup g;
    g.x = tokens;
    g.samples = static_cast<int>(seconds.size());
    g.measured_s = percentile(seconds, 50);
    fit.groups.push_back(g);
  }
  if (fit.groups.size() >= 4) {
    PD_ASSIGN_OR_RETURN(auto result, hold_out_and_refit(fit.groups, &fit_kv_law, &predict_kv));
    std::tie(fit.law, fit.error) = result;
    return fit;
  }
  // Too few sizes to spare every 4th: leave each out in turn.
  std::vector<double> errors;
  for (size_t left_out = 0; left_out < fit.groups.size(); ++left_out) {
    std::vector<const FitGroup*> train;
    for (size_t i = 0; i < fit.groups.size(); ++i)
      if (i != left_out) train.push_back(&fit.groups[i]);
    PD_ASSIGN_OR_RETURN(KvLaw law, fit_kv_law(train));
    errors.push_back(abs_rel_error(predict_kv(law, fit.groups[left_out]), fit.groups[left_out].measured_s));
  }
  std::vector<const FitGroup*> all;
  for (FitGroup& g : fit.groups) {
    g.held_out = true;
    all.push_back(&g);
  }
  PD_ASSIGN_OR_RETURN(fit.law, fit_kv_law(all));
  for (FitGroup& g : fit.groups) g.predicted_s = predict_kv(fit.law, g);
  fit.error = score(errors, static_cast<int>(fit.groups.size()));
  return fit;
}

}  // namespace pdserve::tune
