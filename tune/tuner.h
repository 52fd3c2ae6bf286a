// `pdserve tune`'s stages and what they hand each other. Every stage reads its inputs from and
// writes its outputs to the --out directory (profile.json, plan.json, validation.json), so each
// runs alone (`pdserve tune profile|plan|gate|validate|report`) or all in a row, and a plan can
// be made offline from a profile recorded on another machine (--import-profile).
#pragma once

#include <string>
#include <vector>

#include "tune/gate_checks.h"
#include "tune/local_cluster.h"
#include "tune/search.h"
#include "tune/types.h"

namespace pdserve::tune {

enum class Stage { kProfile, kPlan, kGate, kValidate, kReport };

struct TuneConfig {
  ClusterOptions cluster;  // model, device, pdserve binary, work_dir (= out/work)
  int ranks = 1;
  std::vector<int> tps = {1, 2, 4, 8};  // Capped to ranks.
  std::vector<KvMode> modes = {KvMode::kPush};
  bool aggregated = true, disaggregated = true;
  Workload workload;
  Slo slo;
  Objective objective = Objective::kGoodputPerRank;
  double target_rate = 0;  // --rate: min-ranks's target; 0 for the others.
  double budget_s = 1800;
  std::string import_profile;
  std::string out;
  int validate_top = 3;
  double point_duration_s = 20;
  GatePolicy gate_policy = GatePolicy::kExact;
  int gate_prefix_tokens = 16;
  bool baselines = true;
  double goodput_error_bound = 0.25;  // Exit 4 above it.
  int sim_rescore_top = 20;
};

// Exit codes (docs/tune.md).
inline constexpr int kTuneOk = 0;
inline constexpr int kTuneNoCandidate = 2;
inline constexpr int kTuneGateFailed = 3;
inline constexpr int kTuneValidationError = 4;
inline constexpr int kTuneUsage = 1;  // Bad input, or a stage could not run.

// Runs `stages` in order; the process exit code.
int run_tune(const TuneConfig& config, const std::vector<Stage>& stages);

// Whether `profile` measured the device, dtypes and GEMM precision `config` plans, validates and
// deploys (check_profile_fits): the plan, validate and report stages refuse another.
Status profile_fits(const Profile& profile, const TuneConfig& config);

}  // namespace pdserve::tune
