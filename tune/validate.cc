#include "tune/validate.h"

#include <algorithm>
#include <cmath>
#include <iostream>
#include <map>

#include "tune/profiler.h"

namespace pdserve::tune {

MeasuredPoint measure_point(const std::vector<RequestSample>& requests, const Slo& slo) {
  MeasuredPoint m;
  m.requests = int(requests.size());
  int ok = 0;
  for (const RequestSample& r : requests) {
    if (!r.ok) {
      ++m.failed;
      continue;
    }
    ++ok;
    m.queued_s += r.queued_s;
    m.prefill_s += r.prefill_s;
    m.kv_transfer_s += r.kv_transfer_s;
    m.overhead_s += std::max(0.0, r.ttft_s - r.queued_s - r.prefill_s);
  }
  if (ok > 0) {
    m.queued_s /= ok;
    m.prefill_s /= ok;
    m.kv_transfer_s /= ok;
    m.overhead_s /= ok;
  }
  m.attainment = attainment(requests, slo);
  m.ttft_p50_s = sample_percentile(requests, &RequestSample::ttft_s, 50);
  m.ttft_pq_s = sample_percentile(requests, &RequestSample::ttft_s, slo.percentile);
  m.tpot_p50_s = sample_percentile(requests, &RequestSample::tpot_s, 50);
  m.tpot_pq_s = sample_percentile(requests, &RequestSample::tpot_s, slo.percentile);
  return m;
}

double load_timeout_s(int num_prompts, double rate, double point_duration_s) {
  const double arrivals_s = rate > 0 ? num_prompts / rate : 0;
  return std::max({120.0, 10 * point_duration_s, 3 * arrivals_s});
}

double interpolate_goodput(const std::vector<MeasuredPoint>& points, double alpha, bool* bound) {
  *bound = false;
  std::map<double, std::pair<double, int>> by_rate;  // rate → (Σ margin, count)
  for (const MeasuredPoint& p : points) {
    auto& [sum, n] = by_rate[p.rate];
    sum += p.attainment - alpha;
    ++n;
  }
  if (by_rate.empty()) return -1;
  std::vector<std::pair<double, double>> m;  // (rate, mean margin), ascending rate
  for (const auto& [rate, sn] : by_rate) m.emplace_back(rate, sn.first / sn.second);
  // The last rate that still meets the target, and the next one that does not.
  for (size_t i = 0; i + 1 < m.size(); ++i)
    if (m[i].second >= 0 && m[i + 1].second < 0) {
      const double f = m[i].second / (m[i].second - m[i + 1].second);
      return m[i].first + f * (m[i + 1].first - m[i].first);
    }
  *bound = true;
  return m.front().second < 0 ? m.front().first : m.back().first;
}

Validation validate_topology(const ValidateOptions& o, const Topology& t, const std::string& label,
                             double predicted_goodput, const PredictAtFn& predict, const GateFn& gate) {
  Validation v;
  v.topology = t;
  v.label = label;
  v.predicted_goodput = predicted_goodput;
  const std::string tag = "validate-" + std::to_string(t.aggregated ? 0 : t.n_p) + "p" + std::to_string(t.tp_p) +
                          "-" + std::to_string(t.n_d) + (t.aggregated ? "a" : "d") + std::to_string(t.tp_d) +
                          (t.aggregated ? "" : t.mode == KvMode::kPush ? "-push" : "-pull");
  StatusOr<LocalCluster> cluster = LocalCluster::start(t, o.cluster, tag);
  if (!cluster.ok()) {
    v.error = std::string(cluster.status().message());
    return v;
  }
  StatusOr<GateVerdict> g = gate(cluster->endpoints(), t);
  v.gate_run = true;
  if (!g.ok()) {
    v.gate = {false, "the gate could not run: " + std::string(g.status().message())};
    return v;
  }
  v.gate = *g;
  if (!v.gate.pass) return v;
  if (predicted_goodput <= 0) {
    v.error = "no predicted goodput to load it at";
    return v;
  }
  // Each worker's newest step seen, so that a point reads only its own steps.
  std::vector<uint64_t> seen(cluster->endpoints().workers.size(), 0);
  auto steps_since = [&](bool keep) {
    std::vector<std::pair<std::vector<StepSample>, const TpProfile*>> out;
    for (size_t i = 0; i < seen.size(); ++i) {
      const WorkerEndpoint& w = cluster->endpoints().workers[i];
      StatusOr<std::vector<StepSample>> s = read_steps(w.grpc, seen[i], &seen[i]);
      if (!s.ok() || !keep || o.profile == nullptr) continue;
      const auto tp = o.profile->by_tp.find(w.tp);
      if (tp != o.profile->by_tp.end()) out.emplace_back(std::move(*s), &tp->second);
    }
    return out;
  };
  auto run_point = [&](double factor) -> Status {
    steps_since(false);
    LoadSpec s;
    s.router = cluster->endpoints().router;
    PD_RETURN_IF_ERROR(apply_workload(o.workload, &s));
    s.rate = factor * predicted_goodput;
    s.num_prompts = std::clamp(int(std::lround(s.rate * o.point_duration_s)), o.min_requests, o.max_requests);
    s.seed = o.workload.seed + v.points.size();
    std::cerr << "tune: " << label << ": " << s.num_prompts << " requests at " << s.rate << "/s (" << factor
              << "x the predicted goodput)\n";
    PD_ASSIGN_OR_RETURN(LoadResult r,
                        run_load(o.cluster.pdserve, s, o.cluster.work_dir, tag + "-" + std::to_string(v.points.size()),
                                 load_timeout_s(s.num_prompts, s.rate, o.point_duration_s)));
    MeasuredPoint m = measure_point(r.requests, o.slo);
    m.slowdown = merge_slowdowns(steps_since(true));
    m.factor = factor;
    m.rate = s.rate;
    StatusOr<Prediction> p = predict(t, s.rate);
    if (p.ok()) m.predicted = *p;
    v.points.push_back(m);
    return absl::OkStatus();
  };
  for (double f : o.loads)
    if (Status s = run_point(f); !s.ok()) {
      v.error = std::string(s.message());
      return v;
    }
  v.measured_goodput = interpolate_goodput(v.points, o.slo.attainment, &v.measured_is_bound);
  for (int extra = 0; extra < o.extra_points && v.measured_is_bound; ++extra) {
    const auto [lo, hi] = std::minmax_element(v.points.begin(), v.points.end(),
                                              [](const MeasuredPoint& a, const MeasuredPoint& b) { return a.factor < b.factor; });
    const bool too_fast = v.measured_goodput >= hi->rate;  // Every point met the target.
    if (Status s = run_point(too_fast ? hi->factor * 1.5 : lo->factor * 0.5); !s.ok()) {
      v.error = std::string(s.message());
      break;
    }
    v.measured_goodput = interpolate_goodput(v.points, o.slo.attainment, &v.measured_is_bound);
  }
  // The noise: the same load twice.
  std::map<double, std::vector<double>> same;
  for (const MeasuredPoint& p : v.points) same[p.factor].push_back(p.attainment);
  for (const auto& [f, a] : same)
    if (a.size() >= 2) v.noise = std::max(v.noise, std::abs(a[0] - a[1]));
  cluster->stop();
  return v;
}

}  // namespace pdserve::tune
