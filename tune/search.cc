#include "tune/search.h"

#include <algorithm>
#include <cmath>

namespace pdserve::tune {

std::vector<Topology> enumerate_topologies(const SearchSpace& s) {
  std::vector<int> tps = s.tps;
  std::sort(tps.begin(), tps.end());
  tps.erase(std::unique(tps.begin(), tps.end()), tps.end());
  std::vector<Topology> out;
  if (s.aggregated)
    for (int tp : tps)
      for (int n = 1; n * tp <= s.ranks; ++n) {
        Topology t;
        t.aggregated = true;
        t.n_d = n;
        t.tp_d = tp;
        out.push_back(t);
      }
  if (s.disaggregated)
    for (int n_p = 1; n_p < s.ranks; ++n_p)
      for (int tp_p : tps)
        for (int n_d = 1; n_d < s.ranks; ++n_d)
          for (int tp_d : tps)
            for (KvMode mode : s.modes) {
              Topology t;
              t.n_p = n_p;
              t.tp_p = tp_p;
              t.n_d = n_d;
              t.tp_d = tp_d;
              t.mode = mode;
              if (t.ranks() <= s.ranks) out.push_back(t);
            }
  return out;
}

const char* bottleneck_name(Bottleneck b) {
  switch (b) {
    case Bottleneck::kPrefill: return "prefill";
    case Bottleneck::kDecode: return "decode";
    case Bottleneck::kKvCapacity: return "kv-capacity";
    case Bottleneck::kTransfer: return "transfer";
    case Bottleneck::kRouter: return "router";
    case Bottleneck::kInfeasible: return "infeasible";
  }
  return "?";
}

double expected_length(const LengthDist& d) {
  switch (d.kind) {
    case LengthDist::Kind::kFixed: return d.lo;
    case LengthDist::Kind::kUniform: return 0.5 * (d.lo + d.hi);
    case LengthDist::Kind::kEmpirical: {
      double sum = 0;
      for (int x : d.samples) sum += x;
      return d.samples.empty() ? 0 : sum / double(d.samples.size());
    }
  }
  return 0;
}

Bottleneck classify(const Prediction& p, const Workload& w, const Slo& slo) {
  if (p.rate <= 0) return Bottleneck::kInfeasible;
  // Which objective is closer to its bound decides the side; the largest term on that side
  // names the resource.
  const double ttft_use = slo.ttft_s > 0 ? p.ttft_pq_s / slo.ttft_s : 0;
  const double tpot_use = slo.tpot_s > 0 ? p.tpot_pq_s / slo.tpot_s : 0;
  if (ttft_use >= tpot_use) {
    if (p.router_wait_s > p.prefill_wait_s && p.router_wait_s > p.prefill_s) return Bottleneck::kRouter;
    return Bottleneck::kPrefill;
  }
  if (p.kv_occupancy >= 0.95) return Bottleneck::kKvCapacity;
  const double osl = std::max(2.0, expected_length(w.output));
  if ((p.kv_transfer_s + p.handoff_s) / (osl - 1) > 0.5 * p.tpot_p50_s) return Bottleneck::kTransfer;
  return Bottleneck::kDecode;
}

std::string topology_name(const Topology& t) {
  if (t.aggregated) return std::to_string(t.n_d) + "x aggregated TP" + std::to_string(t.tp_d);
  return std::to_string(t.n_p) + "P TP" + std::to_string(t.tp_p) + " + " + std::to_string(t.n_d) + "D TP" +
         std::to_string(t.tp_d) + (t.mode == KvMode::kPush ? " push" : " pull");
}

std::vector<Candidate> rank_candidates(const std::vector<Topology>& topologies, const ScoreFn& score,
                                       const Workload& workload, const Slo& slo, Objective objective,
                                       double target_rate) {
  const double osl = expected_length(workload.output);
  std::vector<Candidate> out;
  for (const Topology& t : topologies) {
    Candidate c;
    c.topology = t;
    StatusOr<std::pair<double, Prediction>> s = score(t);
    if (!s.ok()) {
      c.error = std::string(s.status().message());
    } else {
      c.goodput_rps = s->first;
      c.at_goodput = s->second;
      c.bottleneck = c.goodput_rps > 0 ? classify(c.at_goodput, workload, slo) : Bottleneck::kInfeasible;
      c.output_tok_s_per_rank = c.goodput_rps * osl / std::max(1, t.ranks());
      c.tok_s_per_user = c.at_goodput.tpot_p50_s > 0 ? 1.0 / c.at_goodput.tpot_p50_s : 0;
    }
    out.push_back(std::move(c));
  }
  for (Candidate& a : out) {
    if (a.goodput_rps <= 0) continue;
    a.on_pareto_front = std::none_of(out.begin(), out.end(), [&](const Candidate& b) {
      return b.goodput_rps > 0 && b.output_tok_s_per_rank >= a.output_tok_s_per_rank && b.tok_s_per_user >= a.tok_s_per_user &&
             (b.output_tok_s_per_rank > a.output_tok_s_per_rank || b.tok_s_per_user > a.tok_s_per_user);
    });
  }
  auto per_rank = [](const Candidate& c) { return c.goodput_rps / std::max(1, c.topology.ranks()); };
  // stable_sort keeps enumeration order among equals, so the ranking is deterministic.
  std::stable_sort(out.begin(), out.end(), [&](const Candidate& a, const Candidate& b) {
    switch (objective) {
      case Objective::kMinRanks: {
        const bool am = a.goodput_rps >= target_rate && a.goodput_rps > 0;
        const bool bm = b.goodput_rps >= target_rate && b.goodput_rps > 0;
        if (am != bm) return am;
        if (am && a.topology.ranks() != b.topology.ranks()) return a.topology.ranks() < b.topology.ranks();
        return a.goodput_rps > b.goodput_rps;
      }
      case Objective::kPareto:
        if (a.on_pareto_front != b.on_pareto_front) return a.on_pareto_front;
        [[fallthrough]];
      case Objective::kGoodputPerRank:
        if (per_rank(a) != per_rank(b)) return per_rank(a) > per_rank(b);
        return a.topology.ranks() < b.topology.ranks();
    }
    return false;
  });
  return out;
}

}  // namespace pdserve::tune
