// How much slower the engine's steps ran under a validation load than the profile's laws say
// they take: the workers' own step records (Info's step window) from a load point, each step's
// wall time over what its law predicts for its shape, the median per kind (prefill-only steps,
// decode-only steps). On shared CPU ranks the benchmark client, the router and the other
// workers take cores the profile's single worker had to itself; this measures that
// interference directly, so the report can say why latencies under load exceed the prediction
// and the recalibration round can scale the laws by what was measured.
#pragma once

#include <vector>

#include "tune/step_sample.h"
#include "tune/types.h"

namespace pdserve::tune {

struct StepSlowdown {
  double prefill = 0, decode = 0;  // Median measured/predicted; 0: no such step.
  int prefill_steps = 0, decode_steps = 0;
};

// The slowdown of `steps`, which ran on workers profiled as `tp` (mixed steps are left out).
StepSlowdown step_slowdown(const std::vector<StepSample>& steps, const TpProfile& tp);

// The medians over several workers' ratios (each worker's steps weighted by their number).
StepSlowdown merge_slowdowns(const std::vector<std::pair<std::vector<StepSample>, const TpProfile*>>& workers);

}  // namespace pdserve::tune
