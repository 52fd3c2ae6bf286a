#include "tune/baselines.h"

#include <algorithm>

#include "tune/analytic.h"
#include "tune/queue_model.h"

namespace pdserve::tune {
namespace {

struct Factors {
  double prefill_capacity, decode_capacity, ttft, tpot;
};

Factors factors(BaselinePlanner p) {
  if (p == BaselinePlanner::kAic) return {0.9, 0.92, 1.8 * 1.1, 1.08};
  return {1.0, 1.0, 1.0, 1.0};
}

// Requests/s one decode worker sustains at the largest batch whose step meets the TPOT SLO
// (and fits the KV reservation and max_running); 0 when even batch 1 misses it.
double decode_capacity(const TpProfile& d, double isl, double osl, double max_tokens, double tpot_slo, double tpot_factor) {
  const double reserve = isl + max_tokens;
  const int cap = int(std::min<double>(d.max_running, reserve > 0 ? double(d.kv_tokens) / reserve : d.max_running));
  double best = 0;
  for (int b = 1; b <= cap; ++b) {
    const double step = d.decode.step_seconds(b, b * (isl + osl / 2));
    if (step <= 0 || step * tpot_factor > tpot_slo) break;
    best = std::max(best, b / (osl * step));
  }
  return best;
}

}  // namespace

const char* baseline_name(BaselinePlanner planner) { return planner == BaselinePlanner::kAic ? "aic" : "dynamo"; }

StatusOr<double> baseline_goodput(BaselinePlanner planner, const Profile& profile, const Topology& t,
                                  const Workload& w, const Slo& slo) {
  const Factors f = factors(planner);
  PD_ASSIGN_OR_RETURN(const double isl, mean_length(w.input));
  PD_ASSIGN_OR_RETURN(const double osl, mean_length(w.output));
  PD_ASSIGN_OR_RETURN(const TpProfile* d, find_tp(profile, t.tp_d));
  const TpProfile* p = d;
  if (!t.aggregated) {
    PD_ASSIGN_OR_RETURN(p, find_tp(profile, t.tp_p));
  }
  PD_ASSIGN_OR_RETURN(const ServiceMoments s, prefill_moments(p->prefill, w.input, p->max_batch_tokens));
  if (s.mean <= 0 || s.mean * f.ttft > slo.ttft_s) return 0.0;
  const double decode = decode_capacity(*d, isl, osl, osl, slo.tpot_s, f.tpot);
  if (t.aggregated) {
    // One engine time-shares both phases: a request costs its prefill plus its share of the
    // decode steps.
    if (decode <= 0) return 0.0;
    const double per_request = s.mean / f.prefill_capacity + 1.0 / (f.decode_capacity * decode);
    return t.n_d / per_request;
  }
  return std::min(f.prefill_capacity * t.n_p / s.mean, f.decode_capacity * t.n_d * decode);
}

}  // namespace pdserve::tune
