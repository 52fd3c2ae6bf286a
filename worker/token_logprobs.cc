#include "worker/token_logprobs.h"

#include <algorithm>

namespace pdserve::worker {

v1::TokenLogprob to_wire(const engine::TokenLogprob& lp) {
  v1::TokenLogprob out;
  out.set_token_id(lp.token);
  out.set_logprob(lp.logprob);
  for (const auto& [id, logprob] : lp.top) {
    out.add_top_ids(id);
    out.add_top_logprobs(logprob);
  }
  return out;
}

void append_wire(const std::vector<engine::TokenLogprob>& lps,
                 google::protobuf::RepeatedPtrField<v1::TokenLogprob>* out) {
  out->Reserve(out->size() + int(lps.size()));
  for (const engine::TokenLogprob& lp : lps) *out->Add() = to_wire(lp);
}

engine::TokenLogprob from_wire(const v1::TokenLogprob& lp) {
  engine::TokenLogprob out;
  out.token = lp.token_id();
  out.logprob = lp.logprob();
  const int n = std::min(lp.top_ids_size(), lp.top_logprobs_size());
  for (int i = 0; i < n; ++i) out.top.emplace_back(lp.top_ids(i), lp.top_logprobs(i));
  return out;
}

}  // namespace pdserve::worker
