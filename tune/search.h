// The tuner's search: every topology within the rank budget (P/D with both P ≤ D and P > D
// TPs, and aggregated), each scored by a goodput model, ranked by the operator's objective,
// and labelled with what limits it. The models are passed in as functions, so the same search
// ranks by the analytic model, the simulator, or a baseline planner's formula.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "common/status.h"
#include "tune/types.h"

namespace pdserve::tune {

struct SearchSpace {
  int ranks = 1;              // The budget N.
  std::vector<int> tps = {1};  // Allowed TP sizes (each must be in the profile).
  bool aggregated = true, disaggregated = true;
  std::vector<KvMode> modes = {KvMode::kPush};
};

// Every topology using at most space.ranks ranks, in a fixed order (aggregated first, then
// P/D by n_p, tp_p, n_d, tp_d, mode), so that ties rank the same way every run.
std::vector<Topology> enumerate_topologies(const SearchSpace& space);

enum class Objective { kGoodputPerRank, kMinRanks, kPareto };

// What limits a candidate at its goodput.
enum class Bottleneck { kPrefill, kDecode, kKvCapacity, kTransfer, kRouter, kInfeasible };
const char* bottleneck_name(Bottleneck b);

struct Candidate {
  Topology topology;
  double goodput_rps = 0;   // λ*: the largest rate meeting the attainment target (0: none).
  Prediction at_goodput;    // The model's prediction at λ* (at a low rate when λ* = 0).
  Bottleneck bottleneck = Bottleneck::kInfeasible;
  double output_tok_s_per_rank = 0;  // λ*·E[OSL] / ranks.
  double tok_s_per_user = 0;         // 1 / TPOT p50 at λ*.
  bool on_pareto_front = false;
  std::string error;  // Why the model could not score it (then goodput 0).
};

// Scores a topology: its goodput and the prediction there.
using ScoreFn = std::function<StatusOr<std::pair<double, Prediction>>(const Topology&)>;

// Scores every topology (a model error is recorded on the candidate, not fatal), labels the
// bottleneck, marks the Pareto front (output tok/s/rank vs tok/s/user, among candidates with
// goodput > 0) and sorts by the objective: goodput per rank (ties: fewer ranks); min-ranks,
// the fewest ranks whose goodput reaches `target_rate` (then goodput); pareto, the front first.
std::vector<Candidate> rank_candidates(const std::vector<Topology>& topologies, const ScoreFn& score,
                                       const Workload& workload, const Slo& slo, Objective objective,
                                       double target_rate);

// The label for a prediction at the candidate's goodput.
Bottleneck classify(const Prediction& p, const Workload& workload, const Slo& slo);

// "1P TP1 + 1D TP2 push", "2× aggregated TP1".
std::string topology_name(const Topology& t);

// The mean of a length distribution (0 for an empty trace).
double expected_length(const LengthDist& d);

}  // namespace pdserve::tune
