// The planners pdserve tune is measured against, as formulas over the same profile, so the
// report can show what each would have picked and validation can measure their picks beside
// ours (tune.md §6.4):
// - Dynamo-style: prefill capacity 1/E[S] per worker (no queue: ρ_max = 1) and TTFT = E[S];
//   decode capacity B*/(E[OSL]·T_d(B*)) at the largest batch B* meeting the TPOT SLO.
// - AIConfigurator-style: rate matching min(0.9·prefill, 0.92·decode) with TTFT·1.8·1.1 and
//   TPOT·1.08 checked against the SLOs (its fixed factors), no KV transfer term.
// Neither models queueing, transfer or admission: that is the point of the comparison.
#pragma once

#include "common/status.h"
#include "tune/types.h"

namespace pdserve::tune {

enum class BaselinePlanner { kDynamo, kAic };
const char* baseline_name(BaselinePlanner planner);

// The goodput (requests/s) the planner's formula predicts for the topology; 0 when its TTFT or
// TPOT check fails. NotFound when the profile lacks one of the topology's TP sizes.
StatusOr<double> baseline_goodput(BaselinePlanner planner, const Profile& profile, const Topology& topology,
                                  const Workload& workload, const Slo& slo);

}  // namespace pdserve::tune
