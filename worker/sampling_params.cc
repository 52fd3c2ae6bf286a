#include "worker/sampling_params.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "proto/engine_sampling.h"

namespace pdserve::worker {

StatusOr<engine::SamplingParams> to_engine_params(const v1::SamplingParams& in, int resumed_tokens) {
  engine::SamplingParams p = engine_sampling(in);
  // Checked over the whole output, as min_tokens counts it.
  engine::SamplingParams whole = p;
  whole.max_tokens += std::max(0, resumed_tokens);
  PD_RETURN_IF_ERROR(whole.validate());
  if (p.max_tokens <= 0)
    return absl::InvalidArgumentError(absl::StrCat("max_tokens must be > 0, got ", p.max_tokens));
  return p;
}

}  // namespace pdserve::worker
