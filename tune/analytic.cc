#include "tune/analytic.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>
#include <vector>

#include "tune/decode_model.h"
#include "tune/queue_model.h"

namespace pdserve::tune {
namespace {
constexpr double kInf = std::numeric_limits<double>::infinity();
using Points = std::vector<std::pair<int, double>>;

// The workload's lengths, summarized once per prediction.
struct Lengths {
  Points input;
  double mean_input = 0, mean_output = 0, mean_steps = 0;  // Steps: E[OSL − 1].
  double reservation = 0;                                   // E[KV tokens reserved].
};

StatusOr<Lengths> summarize(const Workload& workload, const TpProfile& decode) {
  Lengths l;
  PD_ASSIGN_OR_RETURN(l.input, length_points(workload.input));
  PD_ASSIGN_OR_RETURN(const Points output, length_points(workload.output));
  for (const auto& [tokens, weight] : l.input) l.mean_input += weight * tokens;
  for (const auto& [tokens, weight] : output) {
    l.mean_output += weight * tokens;
    l.mean_steps += weight * std::max(tokens - 1, 0);
  }
  // The router reserves whole blocks (router::blocks_needed); half a block is lost on average.
  l.reservation = l.mean_input + l.mean_output + decode.block_size / 2.0;
  if (decode.max_context > 0) l.reservation = std::min<double>(l.reservation, decode.max_context);
  return l;
}

double expect(const Points& points, const std::function<double(int)>& f) {
  double sum = 0;
  for (const auto& [tokens, weight] : points) sum += weight * f(tokens);
  return sum;
}

// The largest batch in [1, batch_max] whose TPOT meets the SLO (0 when none does).
int largest_passing_batch(const std::function<double(double)>& tpot, double batch_max, double tpot_slo) {
  int b = 0;
  while (b + 1 <= batch_max && tpot(b + 1) <= tpot_slo) ++b;
  return b;
}

// The fields every topology shares once its prefill service and decode batch are known.
struct Pieces {
  double lambda_prefill = 0;
  ServiceMoments service;
  std::function<double(int)> service_of;  // Seconds of one prompt of l tokens.
  DecodeFixedPoint decode;
  std::function<double(double)> tpot_at;  // TPOT at a batch.
  double reservation = 0;
  int64_t kv_tokens = 0;
  double overhead = 0;  // Profile::router_overhead_s.
};

Prediction assemble(const Pieces& p, const Points& input, const Workload& workload, const Slo& slo, double rate) {
  Prediction out;
  out.rate = rate;
  out.overhead_s = p.overhead;
  out.prefill_s = p.service.mean;
  out.prefill_utilization = p.lambda_prefill * p.service.mean;
  out.decode_batch = p.decode.batch;
  out.kv_occupancy = p.kv_tokens > 0 ? p.decode.batch * p.reservation / double(p.kv_tokens) : 0;
  out.stable = out.prefill_utilization < 1 && p.decode.feasible;
  if (!out.stable) {
    out.prefill_wait_s = out.ttft_p50_s = out.ttft_pq_s = out.tpot_p50_s = out.tpot_pq_s = kInf;
    return out;
  }
  const double q = slo.percentile / 100;
  out.prefill_wait_s = kingman_mean_wait(p.lambda_prefill, p.service, arrival_cv2(workload));
  const WaitTail tail{out.prefill_utilization, out.prefill_wait_s};
  Points sorted = input;
  std::sort(sorted.begin(), sorted.end());
  const auto service_quantile = [&](double level) {
    double cumulative = 0;
    for (const auto& [tokens, weight] : sorted) {
      cumulative += weight;
      if (cumulative >= level - 1e-12) return p.service_of(tokens);
    }
    return p.service_of(sorted.back().first);
  };
  out.ttft_p50_s = tail.quantile(0.5) + service_quantile(0.5) + out.overhead_s;
  out.ttft_pq_s = tail.quantile(q) + service_quantile(q) + out.overhead_s;
  const auto batch_quantile = [&](double level) {
    return std::clamp<double>(poisson_quantile(p.decode.batch, level), 1, std::max(p.decode.batch_max, 1.0));
  };
  out.tpot_p50_s = p.tpot_at(batch_quantile(0.5));
  out.tpot_pq_s = p.tpot_at(batch_quantile(q));
  const double ttft_ok = expect(input, [&](int l) { return tail.cdf(slo.ttft_s - p.service_of(l) - out.overhead_s); });
  const int passing = largest_passing_batch(p.tpot_at, p.decode.batch_max, slo.tpot_s);
  // The sequence itself is in the batch it sees, so a passing batch of b admits b − 1 others.
  const double tpot_ok = passing == 0 ? 0 : poisson_cdf(p.decode.batch, passing - 1);
  out.attainment = ttft_ok * tpot_ok;
  return out;
}

StatusOr<Prediction> predict_pd(const Profile& profile, const Topology& t, const Workload& workload, const Slo& slo,
                                double rate) {
  PD_ASSIGN_OR_RETURN(const TpProfile* prefill, find_tp(profile, t.tp_p));
  PD_ASSIGN_OR_RETURN(const TpProfile* decode, find_tp(profile, t.tp_d));
  PD_ASSIGN_OR_RETURN(const KvLaw kv, find_kv_law(profile, t));
  PD_ASSIGN_OR_RETURN(const Lengths lengths, summarize(workload, *decode));
  Pieces p;
  p.lambda_prefill = rate / t.n_p;
  PD_ASSIGN_OR_RETURN(p.service, prefill_moments(prefill->prefill, workload.input, prefill->max_batch_tokens));
  p.service_of = [&](int l) { return prefill_service_seconds(prefill->prefill, l, prefill->max_batch_tokens); };
  const double context = lengths.mean_input + lengths.mean_output / 2;
  const auto step = [&](double b) { return decode->decode.step_seconds(b, b * context); };
  p.reservation = lengths.reservation;
  p.kv_tokens = decode->kv_tokens;
  PD_ASSIGN_OR_RETURN(p.decode, solve_decode_fixed_point(step, {rate / t.n_d, lengths.mean_steps, p.reservation,
                                                                decode->kv_tokens, decode->max_running}));
  const double mean_kv = expect(lengths.input, [&](int l) { return kv.seconds(l); });
  // The transfer and hand-off come before the second token, so TPOT carries them amortized.
  const double amortized = lengths.mean_steps > 0 ? (mean_kv + profile.handoff_s) / lengths.mean_steps : 0;
  p.tpot_at = [&](double b) { return lengths.mean_steps > 0 ? step(b) + amortized : 0.0; };
  p.overhead = first_token_overhead(profile, t);
  Prediction out = assemble(p, lengths.input, workload, slo, rate);
  out.kv_transfer_s = mean_kv;
  out.handoff_s = profile.handoff_s;
  return out;
}
}  // namespace

namespace {
StatusOr<Prediction> predict_aggregated(const Profile& profile, const Topology& t, const Workload& workload,
                                        const Slo& slo, double rate) {
  PD_ASSIGN_OR_RETURN(const TpProfile* engine, find_tp(profile, t.tp_d));
  PD_ASSIGN_OR_RETURN(const Lengths lengths, summarize(workload, *engine));
  const double lambda = rate / t.n_d;
  const PrefillLaw& prefill = engine->prefill;
  const double context = lengths.mean_input + lengths.mean_output / 2;
  const auto decode_step = [&](double b) { return engine->decode.step_seconds(b, b * context); };
  const auto chunk_at = [&](double b) { return std::max(engine->max_batch_tokens - int(std::lround(b)), 1); };
  // One prompt's seconds of mixed steps while B sequences decode (header: S(l)).
  const auto service_at = [&](double b, int l) {
    const int chunk = chunk_at(b);
    const double chunks = std::ceil(double(l) / chunk);
    const double with_decodes = 1 - std::exp(-b);
    return prefill_service_seconds(prefill, l, chunk) + chunks * with_decodes * (decode_step(b) - prefill.a);
  };
  const auto step_at = [&](double b) {
    const double busy = lambda * expect(lengths.input, [&](int l) { return service_at(b, l); });
    const double mixed_steps = lambda * expect(lengths.input, [&](int l) { return std::ceil(double(l) / chunk_at(b)); });
    const double steps_per_s = mixed_steps + std::max(1 - busy, 0.0) / decode_step(b);
    return 1 / steps_per_s;
  };
  Pieces p;
  p.lambda_prefill = lambda;
  p.reservation = lengths.reservation;
  p.kv_tokens = engine->kv_tokens;
  p.overhead = profile.router_overhead_s;
  PD_ASSIGN_OR_RETURN(p.decode, solve_decode_fixed_point(step_at, {lambda, lengths.mean_steps, p.reservation,
                                                                   engine->kv_tokens, engine->max_running}));
  const double b = p.decode.batch;
  for (const auto& [l, weight] : lengths.input) {
    const double s = service_at(b, l);
    p.service.mean += weight * s;
    p.service.second += weight * s * s;
  }
  p.service_of = [&](int l) { return service_at(b, l); };
  p.tpot_at = [&](double batch) { return lengths.mean_steps > 0 ? step_at(batch) : 0.0; };
  return assemble(p, lengths.input, workload, slo, rate);
}
}  // namespace

double first_token_overhead(const Profile& profile, const Topology& topology) {
  return !topology.aggregated && profile.pd_overhead_s > 0 ? profile.pd_overhead_s : profile.router_overhead_s;
}

StatusOr<const TpProfile*> find_tp(const Profile& profile, int tp) {
  const auto it = profile.by_tp.find(tp);
  if (it == profile.by_tp.end()) return absl::NotFoundError(absl::StrCat("profile has no TP", tp));
  return &it->second;
}

StatusOr<KvLaw> find_kv_law(const Profile& profile, const Topology& topology) {
  for (const KvPairProfile& pair : profile.kv)
    if (pair.tp_p == topology.tp_p && pair.tp_d == topology.tp_d && pair.mode == topology.mode) return pair.law;
  return absl::NotFoundError(absl::StrCat("profile has no KV law for TP", topology.tp_p, "→TP", topology.tp_d,
                                          topology.mode == KvMode::kPush ? " push" : " pull"));
}

StatusOr<Prediction> predict_analytic(const Profile& profile, const Topology& topology, const Workload& workload,
                                      const Slo& slo, double rate) {
  if (topology.n_d < 1 || (!topology.aggregated && topology.n_p < 1))
    return absl::InvalidArgumentError("topology without workers");
  if (rate < 0) return absl::InvalidArgumentError("negative rate");
  return topology.aggregated ? predict_aggregated(profile, topology, workload, slo, rate)
                             : predict_pd(profile, topology, workload, slo, rate);
}

StatusOr<double> goodput(const Predictor& predictor, const Slo& slo, const GoodputSearch& search) {
  const auto passes = [&](double rate) -> StatusOr<bool> {
    PD_ASSIGN_OR_RETURN(const Prediction p, predictor(rate));
    return p.attainment >= slo.attainment;
  };
  double lo = 0, hi = search.initial_rate;
  PD_ASSIGN_OR_RETURN(bool ok, passes(hi));
  if (ok) {
    int steps = 0;
    for (; ok; hi *= 2) {
      if (++steps > search.max_steps) return absl::FailedPreconditionError("no rate breaks the SLO");
      lo = hi;
      PD_ASSIGN_OR_RETURN(ok, passes(2 * hi));
    }
  } else {
    for (int steps = 0; !ok; ++steps) {
      if (steps == search.max_steps) return 0.0;
      hi /= 2;
      PD_ASSIGN_OR_RETURN(ok, passes(hi));
      if (ok) {
        lo = hi;
        hi *= 2;  // The last failing rate.
      }
    }
  }
  // lo passes, hi fails.
  while (hi - lo > search.rel_tol * lo) {
    const double mid = (lo + hi) / 2;
    PD_ASSIGN_OR_RETURN(const bool mid_ok, passes(mid));
    (mid_ok ? lo : hi) = mid;
  }
  return lo;
}

}  // namespace pdserve::tune
