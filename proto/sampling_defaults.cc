#include "proto/sampling_defaults.h"

namespace pdserve {

v1::SamplingDefaults sampling_defaults_proto(const engine::GenerationDefaults& d) {
  v1::SamplingDefaults out;
  if (d.temperature) out.set_temperature(*d.temperature);
  if (d.top_k) out.set_top_k(*d.top_k);
  if (d.top_p) out.set_top_p(*d.top_p);
  if (d.repetition_penalty) out.set_repetition_penalty(*d.repetition_penalty);
  for (const std::string& s : d.not_applied) out.add_not_applied(s);
  return out;
}

void apply_sampling_defaults(const v1::SamplingDefaults& d, v1::SamplingParams* p) {
  if (!p->has_temperature() && d.has_temperature()) p->set_temperature(d.temperature());
  if (!p->has_top_k() && d.has_top_k()) p->set_top_k(d.top_k());
  if (!p->has_top_p() && d.has_top_p()) p->set_top_p(d.top_p());
  if (!p->has_repetition_penalty() && d.has_repetition_penalty()) p->set_repetition_penalty(d.repetition_penalty());
}

void set_neutral_sampling(v1::SamplingParams* p) {
  p->set_temperature(0.0f);
  p->set_top_k(0);
  p->set_top_p(1.0f);
  p->set_repetition_penalty(1.0f);
}

}  // namespace pdserve
