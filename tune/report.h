// Stage 5 of `pdserve tune`: the outputs in --out, from profile.json, plan.json and
// validation.json (whichever exist): report.md and report.json (schema pdserve.tune/v1), the
// candidates and validation CSVs, the SVG plots, the chart's values.yaml and up.sh. It also
// decides the run's exit code (docs/tune.md): the recommendation is the best-ranked candidate
// that passed the gate, and its measured goodput must be within the bound of its prediction.
// Everything is written deterministically: the same files in give the same bytes out.
#pragma once

#include <string>
#include <vector>

#include "common/status.h"
#include "tune/profiler.h"
#include "tune/tuner.h"
#include "tune/validate.h"

namespace pdserve::tune {

// Writes the outputs; the exit code.
int write_report(const TuneConfig& config);

// The profile's raw points, for the fit plots (profile_points.json).
Status write_profile_points(const std::string& path, const ProfileData& data);
StatusOr<ProfileData> read_profile_points(const std::string& path);

// Kendall's τ-b between two rankings' scores (pairs tied in either count as neither); 0 for
// fewer than two items.
double kendall_tau(const std::vector<double>& a, const std::vector<double>& b);

// (best measured − the pick's measured) / best measured, over the measured values (the pick's
// index into them); 0 when nothing is measured.
double regret(const std::vector<double>& measured, size_t pick);

// Signed relative error (predicted − measured) / measured; 0 when measured is 0.
double relative_error(double predicted, double measured);

}  // namespace pdserve::tune
