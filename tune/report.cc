#include "tune/report.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <iostream>
#include <map>
#include <optional>
#include <sstream>

#include "tune/deploy_values.h"
#include "tune/local_cluster.h"
#include "tune/plan_io.h"
#include "tune/profile_io.h"
#include "tune/search.h"
#include "tune/svg.h"

namespace pdserve::tune {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::string out_path(const TuneConfig& c, const std::string& name) { return (fs::path(c.out) / name).string(); }

std::string fixed(double v, int digits = 2) {
  if (!std::isfinite(v)) return "n/a";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  std::string s = buf;
  if (s == "-0.00" || s == "-0.0" || s == "-0") s = s.substr(1);
  return s;
}

std::string workload_text(const Workload& w) {
  auto len = [](const LengthDist& d) {
    return d.kind == LengthDist::Kind::kFixed ? std::to_string(d.lo) : std::to_string(d.lo) + "-" + std::to_string(d.hi);
  };
  std::string arrival = w.arrival == Arrival::kPoisson ? "poisson"
                        : w.arrival == Arrival::kGamma ? "gamma:cv=" + fixed(w.gamma_cv)
                                                       : "closed:" + std::to_string(w.concurrency);
  return "isl=" + len(w.input) + ",osl=" + len(w.output) + " " + arrival;
}

std::string slo_text(const Slo& s) {
  return "ttft=" + fixed(s.ttft_s * 1e3, 0) + "ms@p" + fixed(s.percentile, 0) + ",tpot=" + fixed(s.tpot_s * 1e3, 1) +
         "ms@p" + fixed(s.percentile, 0) + ",attainment=" + fixed(s.attainment);
}

struct Loaded {
  bool have_profile = false;
  Profile profile;
  json plan;  // null when absent
  std::vector<Candidate> candidates;
  std::vector<json> candidate_json;
  std::vector<Validation> validations;
  bool have_validation = false;
  ProfileData points;
  bool have_points = false;
  json recalibration;  // validation.json's, or null.
};

Loaded load_all(const TuneConfig& c) {
  Loaded l;
  StatusOr<Profile> p = load_profile(c.import_profile.empty() ? out_path(c, "profile.json") : c.import_profile);
  if (p.ok()) {
    l.profile = *p;
    l.have_profile = true;
  }
  if (StatusOr<json> plan = read_json_file(out_path(c, "plan.json")); plan.ok()) {
    l.plan = *plan;
    for (const json& j : plan->value("candidates", json::array())) {
      StatusOr<Candidate> cand = candidate_from_json(j);
      if (!cand.ok()) continue;
      l.candidates.push_back(*cand);
      l.candidate_json.push_back(j);
    }
  }
  for (const char* file : {"validation.json", "gate.json"}) {
    StatusOr<json> v = read_json_file(out_path(c, file));
    if (!v.ok()) continue;
    for (const json& j : v->value("validations", json::array()))
      if (StatusOr<Validation> val = validation_from_json(j); val.ok()) l.validations.push_back(*val);
    l.recalibration = v->value("recalibration", json());
    l.have_validation = std::string(file) == "validation.json";
    break;
  }
  if (StatusOr<ProfileData> pts = read_profile_points(out_path(c, "profile_points.json")); pts.ok()) {
    l.points = *pts;
    l.have_points = true;
  }
  return l;
}

const Validation* validation_of(const Loaded& l, const Topology& t) {
  for (const Validation& v : l.validations)
    if (v.topology == t) return &v;
  return nullptr;
}

// The point at `factor` (the first one), or null.
const MeasuredPoint* point_at(const Validation& v, double factor) {
  for (const MeasuredPoint& p : v.points)
    if (std::abs(p.factor - factor) < 1e-9) return &p;
  return nullptr;
}

json errors_of(const Validation& v) {
  json j = {{"topology", topology_name(v.topology)}};
  if (v.measured_goodput > 0) j["goodput_error"] = relative_error(v.predicted_goodput, v.measured_goodput);
  if (const MeasuredPoint* p = point_at(v, 0.8); p != nullptr) {
    const Prediction& q = p->predicted;
    j["at_0.8"] = {{"ttft_p50", relative_error(q.ttft_p50_s, p->ttft_p50_s)},
                   {"ttft_pq", relative_error(q.ttft_pq_s, p->ttft_pq_s)},
                   {"tpot_p50", relative_error(q.tpot_p50_s, p->tpot_p50_s)},
                   {"tpot_pq", relative_error(q.tpot_pq_s, p->tpot_pq_s)},
                   // Absolute errors of the TTFT's terms, in ms: a term of a millisecond or two
                   // has no meaningful relative error.
                   {"queue_ms", (q.router_wait_s - p->queued_s) * 1e3},
                   {"prefill_ms", (q.prefill_wait_s + q.prefill_s - p->prefill_s) * 1e3},
                   {"kv_transfer_ms", (q.kv_transfer_s - p->kv_transfer_s) * 1e3},
                   {"overhead_ms", (q.overhead_s - p->overhead_s) * 1e3}};
  }
  return j;
}

// --- plots -----------------------------------------------------------------------------

std::string pareto_svg(const Loaded& l, const Workload& w) {
  svg::Plot plot;
  plot.title = "Output tok/s per rank vs tok/s per user (at goodput)";
  plot.x.label = "tok/s per user (1 / TPOT p50)";
  plot.y.label = "output tok/s per rank";
  svg::Series agg{"aggregated (predicted)", svg::Mark::kScatter, false, {}};
  svg::Series pd{"P/D (predicted)", svg::Mark::kScatter, false, {}};
  svg::Series front{"Pareto front (predicted)", svg::Mark::kLine, true, {}};
  svg::Series measured{"measured", svg::Mark::kScatter, false, {}};
  std::vector<svg::Point> fp;
  for (const Candidate& c : l.candidates) {
    if (c.goodput_rps <= 0) continue;
    (c.topology.aggregated ? agg : pd).points.push_back({c.tok_s_per_user, c.output_tok_s_per_rank, 0});
    if (c.on_pareto_front) fp.push_back({c.tok_s_per_user, c.output_tok_s_per_rank, 0});
  }
  std::sort(fp.begin(), fp.end(), [](const svg::Point& a, const svg::Point& b) { return a.x < b.x; });
  front.points = fp;
  const double osl = expected_length(w.output);
  for (const Validation& v : l.validations)
    if (const MeasuredPoint* p = point_at(v, 1.0); p != nullptr && v.measured_goodput > 0 && p->tpot_p50_s > 0)
      measured.points.push_back({1.0 / p->tpot_p50_s, v.measured_goodput * osl / v.topology.ranks(), 0});
  plot.series = {agg, pd, front, measured};
  return svg::render(plot);
}

std::string ttft_svg(const Loaded& l, const Slo& slo) {
  svg::Plot plot;
  plot.title = "TTFT p" + fixed(slo.percentile, 0) + " vs request rate";
  plot.x.label = "requests per second";
  plot.y.label = "TTFT p" + fixed(slo.percentile, 0) + " (ms)";
  for (const Validation& v : l.validations) {
    if (v.points.empty()) continue;
    std::vector<MeasuredPoint> pts = v.points;
    std::sort(pts.begin(), pts.end(), [](const MeasuredPoint& a, const MeasuredPoint& b) { return a.rate < b.rate; });
    svg::Series pred{topology_name(v.topology) + " predicted", svg::Mark::kLine, true, {}};
    svg::Series meas{topology_name(v.topology) + " measured", svg::Mark::kScatter, false, {}};
    for (const MeasuredPoint& p : pts) {
      pred.points.push_back({p.rate, p.predicted.ttft_pq_s * 1e3, 0});
      meas.points.push_back({p.rate, p.ttft_pq_s * 1e3, 0});
    }
    plot.series.push_back(pred);
    plot.series.push_back(meas);
  }
  plot.references.push_back({svg::Orientation::kHorizontal, slo.ttft_s * 1e3, "TTFT SLO"});
  return svg::render(plot);
}

std::string heatmap_svg(const Loaded& l) {
  svg::Heatmap map;
  map.title = "Predicted goodput per rank by prefill x decode workers";
  map.x_label = "decode workers (TP_p -> TP_d, mode)";
  map.y_label = "prefill workers";
  map.value_label = "req/s per rank";
  std::vector<std::string> columns;
  std::vector<int> rows;
  std::map<std::pair<int, std::string>, svg::Heatmap::Cell> cells;
  for (const Candidate& c : l.candidates) {
    if (c.topology.aggregated) continue;
    const std::string col = std::to_string(c.topology.n_d) + "D " + std::to_string(c.topology.tp_p) + "->" +
                            std::to_string(c.topology.tp_d) + (c.topology.mode == KvMode::kPush ? " push" : " pull");
    if (std::find(columns.begin(), columns.end(), col) == columns.end()) columns.push_back(col);
    if (std::find(rows.begin(), rows.end(), c.topology.n_p) == rows.end()) rows.push_back(c.topology.n_p);
    svg::Heatmap::Cell cell;
    cell.value = c.goodput_rps / c.topology.ranks();
    const Validation* v = validation_of(l, c.topology);
    cell.failed = v != nullptr && v->gate_run && !v->gate.pass;
    cells[{c.topology.n_p, col}] = cell;
  }
  std::sort(rows.begin(), rows.end());
  std::sort(columns.begin(), columns.end());
  map.columns = columns;
  for (int r : rows) {
    map.rows.push_back(std::to_string(r) + "P");
    std::vector<svg::Heatmap::Cell> row;
    for (const std::string& col : columns) {
      auto it = cells.find({r, col});
      svg::Heatmap::Cell cell;
      cell.value = std::nan("");
      row.push_back(it == cells.end() ? cell : it->second);
    }
    map.cells.push_back(row);
  }
  return svg::render(map);
}

std::string parity_svg(const Loaded& l) {
  svg::Plot plot;
  plot.title = "Predicted vs measured (every validation point)";
  plot.x.label = "measured (ms)";
  plot.y.label = "predicted (ms)";
  plot.x.scale = plot.y.scale = svg::AxisScale::kLog10;
  svg::Series ttft50{"TTFT p50", svg::Mark::kScatter, false, {}}, ttftq{"TTFT pq", svg::Mark::kScatter, false, {}};
  svg::Series tpot50{"TPOT p50", svg::Mark::kScatter, false, {}}, tpotq{"TPOT pq", svg::Mark::kScatter, false, {}};
  double lo = 1e300, hi = 0;
  for (const Validation& v : l.validations)
    for (const MeasuredPoint& p : v.points) {
      ttft50.points.push_back({p.ttft_p50_s * 1e3, p.predicted.ttft_p50_s * 1e3, 0});
      ttftq.points.push_back({p.ttft_pq_s * 1e3, p.predicted.ttft_pq_s * 1e3, 0});
      tpot50.points.push_back({p.tpot_p50_s * 1e3, p.predicted.tpot_p50_s * 1e3, 0});
      tpotq.points.push_back({p.tpot_pq_s * 1e3, p.predicted.tpot_pq_s * 1e3, 0});
      for (double x : {p.ttft_p50_s, p.ttft_pq_s, p.tpot_p50_s, p.tpot_pq_s})
        if (x > 0) {
          lo = std::min(lo, x * 1e3);
          hi = std::max(hi, x * 1e3);
        }
    }
  plot.series = {ttft50, ttftq, tpot50, tpotq};
  if (hi > 0) {
    plot.series.push_back({"y = x", svg::Mark::kLine, false, {{lo, lo, 0}, {hi, hi, 0}}});
    plot.series.push_back({"+15%", svg::Mark::kLine, true, {{lo, lo * 1.15, 0}, {hi, hi * 1.15, 0}}});
    plot.series.push_back({"-15%", svg::Mark::kLine, true, {{lo, lo * 0.85, 0}, {hi, hi * 0.85, 0}}});
  }
  return svg::render(plot);
}

std::string breakdown_svg(const Loaded& l) {
  svg::StackedBars bars;
  bars.title = "TTFT breakdown at 0.8x goodput (mean ms)";
  bars.y_label = "ms";
  bars.segments = {"router queue", "prefill (queue + compute)", "rest (RPCs, router)"};
  for (const Validation& v : l.validations) {
    const MeasuredPoint* p = point_at(v, 0.8);
    if (p == nullptr) continue;
    const Prediction& q = p->predicted;
    bars.bars.push_back({topology_name(v.topology) + " predicted",
                         {q.router_wait_s * 1e3, (q.prefill_wait_s + q.prefill_s) * 1e3, q.overhead_s * 1e3}});
    bars.bars.push_back({topology_name(v.topology) + " measured",
                         {p->queued_s * 1e3, p->prefill_s * 1e3, p->overhead_s * 1e3}});
  }
  return svg::render(bars);
}

std::string profile_prefill_svg(const Loaded& l) {
  svg::Plot plot;
  plot.title = "Prefill step time vs prompt tokens in the step";
  plot.x.label = "prompt tokens in the step";
  plot.y.label = "step time (ms)";
  for (const auto& [tp, tpp] : l.profile.by_tp) {
    svg::Series pts{"TP" + std::to_string(tp) + " measured", svg::Mark::kScatter, false, {}};
    double max_tokens = tpp.max_batch_tokens;
    if (auto it = l.points.steps.find(tp); it != l.points.steps.end())
      for (const StepSample& s : it->second)
        if (s.decode_seqs == 0 && s.prefill_tokens > 0) pts.points.push_back({double(s.prefill_tokens), s.wall_s * 1e3, 0});
    svg::Series fit{"TP" + std::to_string(tp) + " fit", svg::Mark::kLine, false, {}};
    for (int i = 0; i <= 16; ++i) {
      const double x = max_tokens * i / 16;
      fit.points.push_back({x, tpp.prefill.step_seconds(x) * 1e3, 0});
    }
    plot.series.push_back(pts);
    plot.series.push_back(fit);
  }
  return svg::render(plot);
}

std::string profile_decode_svg(const Loaded& l) {
  svg::Plot plot;
  plot.title = "Decode step time vs batch";
  plot.x.label = "sequences in the step";
  plot.y.label = "step time (ms)";
  for (const auto& [tp, tpp] : l.profile.by_tp) {
    svg::Series pts{"TP" + std::to_string(tp) + " measured", svg::Mark::kScatter, false, {}};
    std::map<int, std::pair<double, int>> kv_by_batch;  // B → (Σ ΣK, n), for the fit line's context.
    if (auto it = l.points.steps.find(tp); it != l.points.steps.end())
      for (const StepSample& s : it->second)
        if (s.prefill_tokens == 0 && s.decode_seqs > 0) {
          pts.points.push_back({double(s.decode_seqs), s.wall_s * 1e3, 0});
          auto& [sum, n] = kv_by_batch[s.decode_seqs];
          sum += double(s.kv_tokens);
          ++n;
        }
    svg::Series fit{"TP" + std::to_string(tp) + " fit (at the measured context)", svg::Mark::kLine, false, {}};
    for (const auto& [b, sn] : kv_by_batch) fit.points.push_back({double(b), tpp.decode.step_seconds(b, sn.first / sn.second) * 1e3, 0});
    plot.series.push_back(pts);
    plot.series.push_back(fit);
  }
  return svg::render(plot);
}

std::string profile_kv_svg(const Loaded& l) {
  svg::Plot plot;
  plot.title = "KV transfer time vs prompt tokens";
  plot.x.label = "prompt tokens";
  plot.y.label = "transfer (ms)";
  for (const KvPairProfile& k : l.profile.kv) {
    const std::string name = "TP" + std::to_string(k.tp_p) + "->TP" + std::to_string(k.tp_d) +
                             (k.mode == KvMode::kPush ? " push" : " pull");
    svg::Series pts{name + " measured", svg::Mark::kScatter, false, {}};
    double max_x = 256;
    for (const KvPoint& p : l.points.kv)
      if (p.tp_p == k.tp_p && p.tp_d == k.tp_d && p.mode == k.mode) {
        pts.points.push_back({double(p.prompt_tokens), p.seconds * 1e3, 0});
        max_x = std::max(max_x, double(p.prompt_tokens));
      }
    svg::Series fit{name + " fit", svg::Mark::kLine, false, {{0, k.law.seconds(0) * 1e3, 0}, {max_x, k.law.seconds(max_x) * 1e3, 0}}};
    plot.series.push_back(pts);
    plot.series.push_back(fit);
  }
  return svg::render(plot);
}

// --- tables ----------------------------------------------------------------------------

std::string candidates_csv(const Loaded& l) {
  std::ostringstream o;
  o << "rank,topology,ranks,model,goodput_rps,goodput_rps_per_rank,output_tok_s_per_rank,tok_s_per_user,ttft_p50_ms,"
       "ttft_pq_ms,tpot_p50_ms,tpot_pq_ms,prefill_utilization,decode_batch,kv_occupancy,bottleneck,pareto,error\n";
  for (size_t i = 0; i < l.candidates.size(); ++i) {
    const Candidate& c = l.candidates[i];
    const Prediction& p = c.at_goodput;
    o << i + 1 << ",\"" << topology_name(c.topology) << "\"," << c.topology.ranks() << ","
      << l.candidate_json[i].value("model", "") << "," << fixed(c.goodput_rps, 3) << ","
      << fixed(c.goodput_rps / c.topology.ranks(), 3) << "," << fixed(c.output_tok_s_per_rank, 1) << ","
      << fixed(c.tok_s_per_user, 1) << "," << fixed(p.ttft_p50_s * 1e3) << "," << fixed(p.ttft_pq_s * 1e3) << ","
      << fixed(p.tpot_p50_s * 1e3, 3) << "," << fixed(p.tpot_pq_s * 1e3, 3) << "," << fixed(p.prefill_utilization, 3)
      << "," << fixed(p.decode_batch, 2) << "," << fixed(p.kv_occupancy, 3) << "," << bottleneck_name(c.bottleneck)
      << "," << (c.on_pareto_front ? "yes" : "no") << ",\"" << c.error << "\"\n";
  }
  return o.str();
}

std::string validation_csv(const Loaded& l) {
  std::ostringstream o;
  o << "topology,label,gate,factor,rate,requests,failed,attainment,predicted_attainment,ttft_p50_ms,pred_ttft_p50_ms,"
       "ttft_pq_ms,pred_ttft_pq_ms,tpot_p50_ms,pred_tpot_p50_ms,tpot_pq_ms,pred_tpot_pq_ms\n";
  for (const Validation& v : l.validations)
    for (const MeasuredPoint& p : v.points)
      o << "\"" << topology_name(v.topology) << "\",\"" << v.label << "\","
        << (v.gate_run ? (v.gate.pass ? "pass" : "fail") : "not-run") << "," << fixed(p.factor) << "," << fixed(p.rate, 3)
        << "," << p.requests << "," << p.failed << "," << fixed(p.attainment, 3) << "," << fixed(p.predicted.attainment, 3)
        << "," << fixed(p.ttft_p50_s * 1e3) << "," << fixed(p.predicted.ttft_p50_s * 1e3) << "," << fixed(p.ttft_pq_s * 1e3)
        << "," << fixed(p.predicted.ttft_pq_s * 1e3) << "," << fixed(p.tpot_p50_s * 1e3, 3) << ","
        << fixed(p.predicted.tpot_p50_s * 1e3, 3) << "," << fixed(p.tpot_pq_s * 1e3, 3) << ","
        << fixed(p.predicted.tpot_pq_s * 1e3, 3) << "\n";
  return o.str();
}

json profile_summary(const Profile& p) {
  json tps = json::object();
  for (const auto& [tp, t] : p.by_tp)
    tps[std::to_string(tp)] = {
        {"prefill", {{"a", t.prefill.a}, {"b", t.prefill.b}, {"c", t.prefill.c}}},
        {"prefill_heldout_median_err", t.prefill_error.median_abs_rel},
        {"prefill_heldout_p90_err", t.prefill_error.p90_abs_rel},
        {"decode", {{"lo", {t.decode.lo.a, t.decode.lo.b, t.decode.lo.c}},
                    {"hi", {t.decode.hi.a, t.decode.hi.b, t.decode.hi.c}},
                    {"split", std::isfinite(t.decode.split) ? json(t.decode.split) : json(nullptr)}}},
        {"decode_heldout_median_err", t.decode_error.median_abs_rel},
        {"decode_heldout_p90_err", t.decode_error.p90_abs_rel},
        {"kv_tokens", t.kv_tokens},
        {"max_running", t.max_running},
        {"max_batch_tokens", t.max_batch_tokens}};
  json kv = json::array();
  for (const KvPairProfile& k : p.kv)
    kv.push_back({{"tp_p", k.tp_p}, {"tp_d", k.tp_d}, {"mode", k.mode == KvMode::kPush ? "push" : "pull"},
                  {"alpha_ms", k.law.alpha * 1e3}, {"per_token_us", k.law.per_token * 1e6},
                  {"heldout_median_err", k.error.median_abs_rel}});
  return {{"key", profile_key(p)}, {"device", device_flag(p.device)}, {"model_sha256", p.model_sha256},
          {"tp", tps}, {"kv", kv}, {"router_overhead_ms", p.router_overhead_s * 1e3},
          {"pd_overhead_ms", p.pd_overhead_s * 1e3}, {"handoff_ms", p.handoff_s * 1e3}};
}

}  // namespace

double relative_error(double predicted, double measured) { return measured != 0 ? (predicted - measured) / measured : 0; }

double kendall_tau(const std::vector<double>& a, const std::vector<double>& b) {
  const size_t n = std::min(a.size(), b.size());
  long concordant = 0, discordant = 0, ties_a = 0, ties_b = 0;
  for (size_t i = 0; i < n; ++i)
    for (size_t j = i + 1; j < n; ++j) {
      const double da = a[i] - a[j], db = b[i] - b[j];
      if (da == 0 && db == 0) continue;
      if (da == 0) ++ties_a;
      else if (db == 0) ++ties_b;
      else if ((da > 0) == (db > 0)) ++concordant;
      else ++discordant;
    }
  const double denom = std::sqrt(double(concordant + discordant + ties_a) * double(concordant + discordant + ties_b));
  return denom > 0 ? double(concordant - discordant) / denom : 0;
}

double regret(const std::vector<double>& measured, size_t pick) {
  if (measured.empty() || pick >= measured.size()) return 0;
  const double best = *std::max_element(measured.begin(), measured.end());
  return best > 0 ? (best - measured[pick]) / best : 0;
}

Status write_profile_points(const std::string& path, const ProfileData& data) {
  json steps = json::object();
  for (const auto& [tp, samples] : data.steps) {
    json arr = json::array();
    for (const StepSample& s : samples)
      arr.push_back({s.prefill_tokens, s.prefill_seqs, s.decode_seqs, s.kv_tokens, s.wall_s});
    steps[std::to_string(tp)] = arr;
  }
  json kv = json::array();
  for (const KvPoint& p : data.kv)
    kv.push_back({{"tp_p", p.tp_p}, {"tp_d", p.tp_d}, {"mode", p.mode == KvMode::kPush ? "push" : "pull"},
                  {"prompt_tokens", p.prompt_tokens}, {"seconds", p.seconds}});
  return write_text_file(path, json({{"schema", "pdserve.tune.points/v1"},
                                     {"step_columns", {"prefill_tokens", "prefill_seqs", "decode_seqs", "kv_tokens", "wall_s"}},
                                     {"steps", steps},
                                     {"kv", kv}})
                                   .dump(1) +
                                   "\n");
}

StatusOr<ProfileData> read_profile_points(const std::string& path) {
  PD_ASSIGN_OR_RETURN(json j, read_json_file(path));
  ProfileData d;
  const json steps = j.value("steps", json::object());  // Named: items() refers into it.
  for (const auto& [tp, arr] : steps.items())
    for (const json& s : arr)
      d.steps[std::stoi(tp)].push_back({s[0].get<int64_t>(), s[1].get<int>(), s[2].get<int>(), s[3].get<int64_t>(),
                                        s[4].get<double>()});
  for (const json& p : j.value("kv", json::array()))
    d.kv.push_back({p.value("tp_p", 1), p.value("tp_d", 1), p.value("mode", "push") == "push" ? KvMode::kPush : KvMode::kPull,
                    p.value("prompt_tokens", 0), p.value("seconds", 0.0)});
  return d;
}

int write_report(const TuneConfig& c) {
  const Loaded l = load_all(c);
  if (l.candidates.empty()) {
    std::cerr << "error: report: no plan (plan.json) in " << c.out << "\n";
    return kTuneUsage;
  }
  // Its values.yaml and up.sh deploy the flags' dtypes and precision: they must be the profile's.
  if (l.have_profile) {
    if (Status s = profile_fits(l.profile, c); !s.ok()) {
      std::cerr << "error: report: " << s.message() << "\n";
      return kTuneUsage;
    }
  }
  // The recommendation: the best-ranked candidate that passed the gate where one was run; a
  // candidate that failed it is excluded.
  const Candidate* rec = nullptr;
  const Validation* rec_v = nullptr;
  std::vector<std::string> excluded;
  for (const Candidate& cand : l.candidates) {
    if (cand.goodput_rps <= 0) break;
    const Validation* v = validation_of(l, cand.topology);
    if (v != nullptr && v->gate_run && !v->gate.pass) {
      excluded.push_back(topology_name(cand.topology) + ": " + v->gate.detail);
      continue;
    }
    if (!l.validations.empty() && (v == nullptr || !v->gate_run)) continue;  // Only gated ones.
    rec = &cand;
    rec_v = v;
    break;
  }
  int code = kTuneOk;
  const bool any_good = !l.candidates.empty() && l.candidates.front().goodput_rps > 0;
  if (!any_good) code = kTuneNoCandidate;
  else if (rec == nullptr) code = kTuneGateFailed;

  // Errors over the measured topologies.
  json per = json::array();
  std::vector<double> predicted_per_rank, measured_per_rank;
  size_t rec_index = 0;
  for (const Validation& v : l.validations) {
    per.push_back(errors_of(v));
    if (v.measured_goodput > 0) {
      if (rec != nullptr && v.topology == rec->topology) rec_index = measured_per_rank.size();
      predicted_per_rank.push_back(v.predicted_goodput / v.topology.ranks());
      measured_per_rank.push_back(v.measured_goodput / v.topology.ranks());
    }
  }
  double rec_error = 0;
  if (rec_v != nullptr && rec_v->measured_goodput > 0) rec_error = relative_error(rec_v->predicted_goodput, rec_v->measured_goodput);
  // After a recalibration round, the recommendation's error is the recalibrated prediction's.
  std::optional<double> rec_error_after;
  if (rec != nullptr && l.recalibration.is_object())
    for (const json& t : l.recalibration.value("topologies", json::array()))
      if (t.value("topology", "") == topology_name(rec->topology) && t["error_after"].is_number())
        rec_error_after = t["error_after"].get<double>();
  if (code == kTuneOk && l.have_validation) {
    if (rec_v == nullptr || rec_v->measured_goodput <= 0) code = kTuneValidationError;
    else if (std::abs(rec_error_after.value_or(rec_error)) > c.goodput_error_bound) code = kTuneValidationError;
  }

  json report;
  report["schema"] = "pdserve.tune/v1";
  report["tool"] = std::string("pdserve-tune/1 (") + PDSERVE_VERSION + ")";
  report["inputs"] = {{"model", c.cluster.model},
                      {"device", device_flag(c.cluster.device)},
                      {"ranks", c.ranks},
                      {"tp", c.tps},
                      {"workload", workload_text(c.workload)},
                      {"slo", slo_text(c.slo)},
                      {"seed", c.workload.seed},
                      {"budget_s", c.budget_s}};
  if (l.have_profile) report["profile"] = profile_summary(l.profile);
  json cands = json::array();
  for (const json& j : l.candidate_json) {
    json x = j;
    const StatusOr<Topology> t = topology_from_json(j["topology"]);
    const Validation* v = t.ok() ? validation_of(l, *t) : nullptr;
    x["gate"] = v != nullptr && v->gate_run ? (v->gate.pass ? "pass" : "fail") : "not-run";
    x["measured"] = v != nullptr && v->measured_goodput > 0 ? json({{"goodput_rps", v->measured_goodput}}) : json(nullptr);
    cands.push_back(x);
  }
  report["candidates"] = cands;
  report["baselines"] = l.plan.value("baselines", json::array());
  json validations = json::array();
  for (const Validation& v : l.validations) validations.push_back(validation_to_json(v));
  report["validation"] = validations;
  report["excluded_by_gate"] = excluded;
  report["errors"] = {{"per_topology", per},
                      {"kendall_tau", measured_per_rank.size() >= 2 ? json(kendall_tau(predicted_per_rank, measured_per_rank)) : json(nullptr)},
                      {"regret", measured_per_rank.empty() ? json(nullptr) : json(regret(measured_per_rank, rec_index))}};
  std::string verdict = "none";
  if (rec != nullptr) {
    const Validation* v = rec_v;
    json measured = nullptr;
    if (v != nullptr && v->measured_goodput > 0)
      measured = {{"goodput_rps", v->measured_goodput}, {"error", rec_error},
                  {"error_after_recalibration", rec_error_after ? json(*rec_error_after) : json(nullptr)},
                  {"bound", v->measured_is_bound}, {"noise_attainment", v->noise}};
    report["recommendation"] = {
        {"topology", topology_to_json(rec->topology)},
        {"predicted", {{"goodput_rps", rec->goodput_rps}, {"ttft_ms", rec->at_goodput.ttft_pq_s * 1e3},
                       {"tpot_ms", rec->at_goodput.tpot_pq_s * 1e3}}},
        {"measured", measured},
        {"gate", v != nullptr && v->gate_run ? (v->gate.pass ? "pass" : "fail") : "not-run"}};
    // Disaggregate or not: the best aggregated candidate's goodput per rank against the pick's.
    verdict = rec->topology.aggregated ? "do not disaggregate" : "disaggregate";
  } else {
    report["recommendation"] = nullptr;
  }
  report["verdict"] = verdict;
  report["recalibration"] = l.recalibration;
  report["exit_code"] = code;

  // Files.
  std::error_code ec;
  fs::create_directories(fs::path(c.out) / "plots", ec);
  std::vector<std::pair<std::string, std::string>> files = {
      {"report.json", report.dump(2) + "\n"},
      {"candidates.csv", candidates_csv(l)},
      {"validation.csv", validation_csv(l)},
      {"plots/pareto.svg", pareto_svg(l, c.workload)},
      {"plots/ttft_vs_rate.svg", ttft_svg(l, c.slo)},
      {"plots/ratio_heatmap.svg", heatmap_svg(l)},
      {"plots/parity.svg", parity_svg(l)},
      {"plots/ttft_breakdown.svg", breakdown_svg(l)},
  };
  if (l.have_profile) {
    files.push_back({"plots/profile_prefill.svg", profile_prefill_svg(l)});
    files.push_back({"plots/profile_decode.svg", profile_decode_svg(l)});
    if (!l.profile.kv.empty()) files.push_back({"plots/profile_kv.svg", profile_kv_svg(l)});
  }
  std::string deploy_note;
  if (rec != nullptr) {
    DeployPlan dp;
    dp.topology = rec->topology;
    dp.device = c.cluster.device;
    dp.weight_dtype = c.cluster.weight_dtype;
    dp.kv_dtype = c.cluster.kv_dtype;
    dp.gemm_precision = c.cluster.gemm_precision;
    dp.model_name = fs::path(c.cluster.model).filename().string();
    dp.model_path = c.cluster.model;
    for (size_t i = 0; i < l.candidates.size(); ++i)
      if (&l.candidates[i] == rec) {
        dp.max_running = l.candidate_json[i].value("router_max_running", 64);
        dp.max_waiting = l.candidate_json[i].value("router_max_waiting", 256);
      }
    dp.provenance_tool = report["tool"].get<std::string>();
    dp.profile_sha256 = l.have_profile ? l.profile.model_sha256 : "";
    dp.workload_text = workload_text(c.workload);
    dp.slo_text = slo_text(c.slo);
    dp.predicted_goodput_rps = rec->goodput_rps;
    dp.predicted_tok_per_s_per_rank = rec->output_tok_s_per_rank;
    if (rec_v != nullptr && rec_v->measured_goodput > 0)
      dp.measured = MeasuredResult{rec_v->measured_goodput, rec_error * 100, rec_v->gate.pass};
    if (StatusOr<std::string> values = values_yaml(dp); values.ok()) files.push_back({"values.yaml", *values});
    else deploy_note = "values.yaml not written: " + std::string(values.status().message());
    if (StatusOr<std::string> up = up_script(dp, c.cluster.pdserve); up.ok()) files.push_back({"up.sh", *up});
    else deploy_note += (deploy_note.empty() ? "" : "; ") + std::string("up.sh not written: ") + std::string(up.status().message());
  }

  // report.md
  std::ostringstream md;
  md << "# pdserve tune report\n\n";
  md << "- Model: `" << c.cluster.model << "`, device " << device_flag(c.cluster.device) << ", budget " << c.ranks
     << " ranks\n- Workload: " << workload_text(c.workload) << "\n- SLO: " << slo_text(c.slo) << "\n\n";
  md << "## Recommendation\n\n";
  if (rec == nullptr) {
    md << (any_good ? "None: every measured candidate failed the correctness gate.\n\n"
                    : "None: no candidate meets the SLO at any rate.\n\n");
  } else {
    md << "**" << topology_name(rec->topology) << "** (" << rec->topology.ranks() << " ranks) — " << verdict << ".\n\n";
    md << "| | goodput (req/s) | req/s per rank | TTFT p" << fixed(c.slo.percentile, 0) << " (ms) | TPOT p"
       << fixed(c.slo.percentile, 0) << " (ms) | gate |\n|---|---|---|---|---|---|\n";
    md << "| predicted | " << fixed(rec->goodput_rps) << " | " << fixed(rec->goodput_rps / rec->topology.ranks()) << " | "
       << fixed(rec->at_goodput.ttft_pq_s * 1e3) << " | " << fixed(rec->at_goodput.tpot_pq_s * 1e3, 3) << " | "
       << (rec_v && rec_v->gate_run ? (rec_v->gate.pass ? "pass" : "fail") : "not run") << " |\n";
    if (rec_v != nullptr && rec_v->measured_goodput > 0)
      md << "| measured | " << (rec_v->measured_is_bound ? "bound " : "") << fixed(rec_v->measured_goodput) << " | "
         << fixed(rec_v->measured_goodput / rec->topology.ranks()) << " | | | error " << fixed(rec_error * 100, 1)
         << " %, noise (attainment) " << fixed(rec_v->noise, 3) << " |\n";
    md << "\n";
  }
  if (!excluded.empty()) {
    md << "Excluded by the correctness gate:\n\n";
    for (const std::string& e : excluded) md << "- " << e << "\n";
    md << "\n";
  }
  if (!deploy_note.empty()) md << "Note: " << deploy_note << "\n\n";
  md << "## Ranking\n\n| # | topology | ranks | model | goodput | per rank | TTFT p50/pq (ms) | TPOT p50/pq (ms) | ρ prefill | decode B | KV occ. | bottleneck |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n";
  for (size_t i = 0; i < l.candidates.size() && i < 20; ++i) {
    const Candidate& cand = l.candidates[i];
    const Prediction& p = cand.at_goodput;
    md << "| " << i + 1 << " | " << topology_name(cand.topology) << " | " << cand.topology.ranks() << " | "
       << l.candidate_json[i].value("model", "") << " | " << fixed(cand.goodput_rps) << " | "
       << fixed(cand.goodput_rps / cand.topology.ranks()) << " | " << fixed(p.ttft_p50_s * 1e3) << " / "
       << fixed(p.ttft_pq_s * 1e3) << " | " << fixed(p.tpot_p50_s * 1e3, 3) << " / " << fixed(p.tpot_pq_s * 1e3, 3) << " | "
       << fixed(p.prefill_utilization) << " | " << fixed(p.decode_batch, 1) << " | " << fixed(p.kv_occupancy) << " | "
       << bottleneck_name(cand.bottleneck) << (cand.error.empty() ? "" : " (" + cand.error + ")") << " |\n";
  }
  md << "\n## Validation\n\n";
  if (l.validations.empty()) md << "Not run.\n";
  for (const Validation& v : l.validations) {
    md << "### " << topology_name(v.topology) << " (" << v.label << ")\n\nGate: "
       << (v.gate_run ? (v.gate.pass ? "pass" : "FAIL") : "not run") << (v.gate.detail.empty() ? "" : " — " + v.gate.detail)
       << ". Predicted goodput " << fixed(v.predicted_goodput) << " req/s; measured "
       << (v.measured_goodput >= 0 ? (v.measured_is_bound ? "(bound) " : "") + fixed(v.measured_goodput) : "n/a")
       << (v.error.empty() ? "" : ". " + v.error) << ".\n\n";
    if (v.points.empty()) continue;
    md << "| × | rate | requests | attainment meas/pred | TTFT p50 meas/pred | TTFT pq meas/pred | TPOT p50 meas/pred | step slowdown prefill / decode |\n|---|---|---|---|---|---|---|---|\n";
    for (const MeasuredPoint& p : v.points)
      md << "| " << fixed(p.factor) << " | " << fixed(p.rate) << " | " << p.requests << (p.failed ? " (" + std::to_string(p.failed) + " failed)" : "")
         << " | " << fixed(p.attainment, 3) << " / " << fixed(p.predicted.attainment, 3) << " | " << fixed(p.ttft_p50_s * 1e3)
         << " / " << fixed(p.predicted.ttft_p50_s * 1e3) << " | " << fixed(p.ttft_pq_s * 1e3) << " / "
         << fixed(p.predicted.ttft_pq_s * 1e3) << " | " << fixed(p.tpot_p50_s * 1e3, 3) << " / "
         << fixed(p.predicted.tpot_p50_s * 1e3, 3) << " | "
         << (p.slowdown.prefill > 0 ? fixed(p.slowdown.prefill) + "×" : "n/a") << " / "
         << (p.slowdown.decode > 0 ? fixed(p.slowdown.decode) + "×" : "n/a") << " |\n";
    md << "\nStep slowdown: the workers' own steps during the point over the profile's laws for their "
          "shapes (median); above 1 the load (client, router, other workers on shared cores) slowed the "
          "engine beyond what the profile measured.\n\n";
  }
  if (l.recalibration.is_object()) {
    const json& f = l.recalibration["factors"];
    md << "Recalibration (one round, from " << l.recalibration.value("from", "") << "): prefill ×"
       << fixed(f.value("prefill", 1.0)) << ", decode ×" << fixed(f.value("decode", 1.0)) << ", first-token overhead ×"
       << fixed(f.value("overhead", 1.0)) << ".\n\n| topology | measured | predicted before | error before | predicted after | error after |\n|---|---|---|---|---|---|\n";
    for (const json& t : l.recalibration.value("topologies", json::array()))
      md << "| " << t.value("topology", "") << " | " << fixed(t.value("measured_goodput_rps", 0.0)) << " | "
         << fixed(t.value("predicted_before_rps", 0.0)) << " | " << fixed(t.value("error_before", 0.0) * 100, 1) << " % | "
         << (t["predicted_after_rps"].is_number() ? fixed(t["predicted_after_rps"].get<double>()) : "n/a") << " | "
         << (t["error_after"].is_number() ? fixed(t["error_after"].get<double>() * 100, 1) + " %" : "n/a") << " |\n";
    md << "\n";
  }
  if (measured_per_rank.size() >= 2)
    md << "Kendall τ (predicted vs measured goodput per rank): " << fixed(kendall_tau(predicted_per_rank, measured_per_rank))
       << "; regret of the pick: " << fixed(regret(measured_per_rank, rec_index) * 100, 1) << " %.\n\n";
  md << "## Baseline planners (same profile)\n\n| planner | pick | its goodput | ours for it |\n|---|---|---|---|\n";
  for (const json& b : l.plan.value("baselines", json::array()))
    md << "| " << b.value("planner", "") << " | " << (b["pick"].is_null() ? "none" : b["pick"].value("name", "")) << " | "
       << (b.contains("their_goodput_rps") ? fixed(b["their_goodput_rps"].get<double>()) : "n/a") << " | "
       << (b.contains("our_goodput_rps") && b["our_goodput_rps"].is_number() ? fixed(b["our_goodput_rps"].get<double>()) : "n/a")
       << " |\n";
  if (l.have_profile) {
    md << "\n## Profile fits (held-out error)\n\n| TP | prefill a (ms) / b (µs/tok) / c | prefill median / p90 err | decode lo a,b,c | split | decode median / p90 err | KV tokens |\n|---|---|---|---|---|---|---|\n";
    for (const auto& [tp, t] : l.profile.by_tp)
      md << "| " << tp << " | " << fixed(t.prefill.a * 1e3, 3) << " / " << fixed(t.prefill.b * 1e6, 3) << " / "
         << t.prefill.c << " | " << fixed(t.prefill_error.median_abs_rel * 100, 1) << " % / "
         << fixed(t.prefill_error.p90_abs_rel * 100, 1) << " % | " << fixed(t.decode.lo.a * 1e3, 3) << " ms, "
         << fixed(t.decode.lo.b * 1e6, 2) << " µs, " << t.decode.lo.c << " | "
         << (std::isfinite(t.decode.split) ? fixed(t.decode.split, 0) : "none") << " | "
         << fixed(t.decode_error.median_abs_rel * 100, 1) << " % / " << fixed(t.decode_error.p90_abs_rel * 100, 1)
         << " % | " << t.kv_tokens << " |\n";
    for (const KvPairProfile& k : l.profile.kv)
      md << "\nKV TP" << k.tp_p << " → TP" << k.tp_d << " " << (k.mode == KvMode::kPush ? "push" : "pull") << ": "
         << fixed(k.law.alpha * 1e3, 3) << " ms + " << fixed(k.law.per_token * 1e6, 3) << " µs/token (held-out median "
         << fixed(k.error.median_abs_rel * 100, 1) << " %).\n";
  }
  md << "\nPlots: `plots/`. Exit code " << code << ".\n";
  files.push_back({"report.md", md.str()});
  for (const auto& [name, text] : files)
    if (Status s = write_text_file(out_path(c, name), text); !s.ok()) {
      std::cerr << "error: " << s.message() << "\n";
      return kTuneUsage;
    }
  std::cerr << "tune: report in " << out_path(c, "report.md") << " (exit " << code << ")\n";
  return code;
}

}  // namespace pdserve::tune
