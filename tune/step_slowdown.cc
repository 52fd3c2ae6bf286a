#include "tune/step_slowdown.h"

#include "common/percentile.h"

namespace pdserve::tune {
namespace {

void ratios(const std::vector<StepSample>& steps, const TpProfile& tp, std::vector<double>* prefill,
            std::vector<double>* decode) {
  for (const StepSample& s : steps) {
    if (s.wall_s <= 0) continue;
    if (s.decode_seqs == 0 && s.prefill_tokens > 0) {
      const double law = tp.prefill.step_seconds(double(s.prefill_tokens));
      if (law > 0) prefill->push_back(s.wall_s / law);
    } else if (s.prefill_tokens == 0 && s.decode_seqs > 0) {
      const double law = tp.decode.step_seconds(s.decode_seqs, double(s.kv_tokens));
      if (law > 0) decode->push_back(s.wall_s / law);
    }
  }
}

}  // namespace

StepSlowdown step_slowdown(const std::vector<StepSample>& steps, const TpProfile& tp) {
  return merge_slowdowns({{steps, &tp}});
}

StepSlowdown merge_slowdowns(const std::vector<std::pair<std::vector<StepSample>, const TpProfile*>>& workers) {
  std::vector<double> prefill, decode;
  for (const auto& [steps, tp] : workers)
    if (tp != nullptr) ratios(steps, *tp, &prefill, &decode);
  StepSlowdown s;
  s.prefill_steps = int(prefill.size());
  s.decode_steps = int(decode.size());
  s.prefill = percentile(std::move(prefill), 50);
  s.decode = percentile(std::move(decode), 50);
  return s;
}

}  // namespace pdserve::tune
