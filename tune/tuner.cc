#include "tune/tuner.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <iostream>
#include <set>

#include "engine/model/model_resolver.h"
#include "engine/model_loader.h"
#include "tune/analytic.h"
#include "tune/baselines.h"
#include "tune/gate.h"
#include "tune/plan_io.h"
#include "tune/profile_io.h"
#include "tune/profiler.h"
#include "tune/queue_model.h"
#include "tune/report.h"
#include "tune/sim.h"
#include "tune/validate.h"
#include "proto/worker.grpc.pb.h"

namespace pdserve::tune {
namespace {

namespace fs = std::filesystem;
using Steady = std::chrono::steady_clock;

std::string out_path(const TuneConfig& c, const std::string& name) { return (fs::path(c.out) / name).string(); }

// Router admission for a topology: every decode slot its KV can hold at the workload's
// reservation (prompt + max_tokens), so the router never sends more than the decode side can
// run, and the router's default queue behind it.
std::pair<int, int> admission_limits(const Profile& profile, const Topology& t, const Workload& w) {
  const auto it = profile.by_tp.find(t.tp_d);
  if (it == profile.by_tp.end()) return {64, 256};
  const double reserve = std::max(1.0, expected_length(w.input) + expected_length(w.output));
  const int slots = std::max(1, int(std::min<double>(it->second.max_running, double(it->second.kv_tokens) / reserve)));
  return {t.n_d * slots, 256};
}

SimOptions sim_options(const TuneConfig& c, const Profile& profile, const Topology& t) {
  SimOptions o;
  o.requests = 20000;
  o.warmup = 1000;
  o.seed = c.workload.seed + 1;
  const auto [running, waiting] = admission_limits(profile, t, c.workload);
  o.max_running = running;
  o.max_waiting = waiting;
  return o;
}

StatusOr<std::pair<double, Prediction>> analytic_score(const TuneConfig& c, const Profile& profile, const Topology& t) {
  Predictor predictor = [&](double rate) { return predict_analytic(profile, t, c.workload, c.slo, rate); };
  StatusOr<double> g = goodput(predictor, c.slo);
  if (!g.ok()) return g.status();
  PD_ASSIGN_OR_RETURN(Prediction p, predict_analytic(profile, t, c.workload, c.slo, std::max(*g, 1e-6)));
  return std::make_pair(*g, p);
}

// The simulator's goodput, its bracket started at the analytic model's (`hint`, when it has
// one) and bisected to 1 %: the simulator is re-scoring, so it starts where the closed forms
// ended and needs few runs.
StatusOr<std::pair<double, Prediction>> simulated_score(const TuneConfig& c, const Profile& profile, const Topology& t,
                                                        double hint = 0) {
  const SimOptions o = sim_options(c, profile, t);
  GoodputSearch search;
  if (hint > 0) search.initial_rate = hint;
  search.rel_tol = 0.01;
  PD_ASSIGN_OR_RETURN(double g, simulated_goodput(profile, t, c.workload, c.slo, o, search));
  PD_ASSIGN_OR_RETURN(SimResult r, simulate(profile, t, c.workload, c.slo, std::max(g, 1e-6), o));
  return std::make_pair(g, r.prediction);
}

StatusOr<Profile> load_stage_profile(const TuneConfig& c) {
  return load_profile(c.import_profile.empty() ? out_path(c, "profile.json") : c.import_profile);
}

}  // namespace

Status profile_fits(const Profile& profile, const TuneConfig& c) {
  return check_profile_fits(profile, c.cluster.device, c.cluster.weight_dtype, c.cluster.kv_dtype,
                            c.cluster.gemm_precision);
}

namespace {

// --- profile ---------------------------------------------------------------------------

int stage_profile(const TuneConfig& c) {
  if (!c.import_profile.empty()) {
    std::cerr << "tune: --import-profile given: not profiling\n";
    return kTuneOk;
  }
  ProfileOptions o;
  o.cluster = c.cluster;
  o.ranks = c.ranks;
  o.tps = c.tps;
  o.modes = c.modes;
  o.disaggregated = c.disaggregated && c.ranks >= 2;
  o.max_input_len = std::max(64, 2 * c.workload.input.hi);
  o.typical_input_len = std::max(16, int(expected_length(c.workload.input)));
  o.seed = c.workload.seed;
  ProfileData data;
  StatusOr<Profile> p = run_profile(o, &data);
  if (!p.ok()) {
    std::cerr << "error: profile: " << p.status().message() << "\n";
    return kTuneUsage;
  }
  p->pdserve_version = PDSERVE_VERSION;
  if (Status s = save_profile(out_path(c, "profile.json"), *p); !s.ok()) {
    std::cerr << "error: " << s.message() << "\n";
    return kTuneUsage;
  }
  if (Status s = write_profile_points(out_path(c, "profile_points.json"), data); !s.ok()) {
    std::cerr << "error: " << s.message() << "\n";
    return kTuneUsage;
  }
  std::cerr << "tune: profile written to " << out_path(c, "profile.json") << "\n";
  return kTuneOk;
}

// --- plan ------------------------------------------------------------------------------

nlohmann::json baseline_pick(BaselinePlanner planner, const TuneConfig& c, const Profile& profile,
                             const std::vector<Topology>& topologies) {
  const Topology* best = nullptr;
  double best_per_rank = 0, best_goodput = 0;
  for (const Topology& t : topologies) {
    StatusOr<double> g = baseline_goodput(planner, profile, t, c.workload, c.slo);
    if (!g.ok() || *g <= 0) continue;
    const double per_rank = *g / t.ranks();
    if (per_rank > best_per_rank) {
      best_per_rank = per_rank;
      best_goodput = *g;
      best = &t;
    }
  }
  nlohmann::json j = {{"planner", baseline_name(planner)}};
  if (best == nullptr) {
    j["pick"] = nullptr;
    return j;
  }
  j["pick"] = topology_to_json(*best);
  j["their_goodput_rps"] = best_goodput;
  StatusOr<std::pair<double, Prediction>> ours = analytic_score(c, profile, *best);
  j["our_goodput_rps"] = ours.ok() ? nlohmann::json(ours->first) : nlohmann::json(nullptr);
  return j;
}

int stage_plan(const TuneConfig& c) {
  StatusOr<Profile> profile = load_stage_profile(c);
  if (!profile.ok()) {
    std::cerr << "error: plan: " << profile.status().message() << "\n";
    return kTuneUsage;
  }
  if (Status s = profile_fits(*profile, c); !s.ok()) {
    std::cerr << "error: plan: " << s.message() << "\n";
    return kTuneUsage;
  }
  SearchSpace space;
  space.ranks = c.ranks;
  for (int tp : c.tps)
    if (profile->by_tp.count(tp)) space.tps.push_back(tp);
  space.aggregated = c.aggregated;
  space.disaggregated = c.disaggregated;
  space.modes = c.modes;
  if (space.tps.empty()) {
    std::cerr << "error: plan: the profile has none of the TP sizes asked for\n";
    return kTuneUsage;
  }
  const std::vector<Topology> topologies = enumerate_topologies(space);
  const auto t0 = Steady::now();
  std::vector<Candidate> analytic = rank_candidates(
      topologies, [&](const Topology& t) { return analytic_score(c, *profile, t); }, c.workload, c.slo, c.objective,
      c.target_rate);
  const double analytic_s = std::chrono::duration<double>(Steady::now() - t0).count();
  // Re-score the analytic model's best in the simulator, which runs the router's own placement
  // and admission; its numbers are the ones ranked and reported for those.
  std::vector<Topology> rescored;
  for (size_t i = 0; i < analytic.size() && int(i) < c.sim_rescore_top; ++i)
    if (analytic[i].error.empty()) rescored.push_back(analytic[i].topology);
  auto is_rescored = [&](const Topology& t) { return std::find(rescored.begin(), rescored.end(), t) != rescored.end(); };
  const auto t1 = Steady::now();
  std::vector<Candidate> ranked = rank_candidates(
      topologies,
      [&](const Topology& t) {
        if (!is_rescored(t)) return analytic_score(c, *profile, t);
        double hint = 0;
        for (const Candidate& a : analytic)
          if (a.topology == t) hint = a.goodput_rps;
        return simulated_score(c, *profile, t, hint);
      },
      c.workload, c.slo, c.objective, c.target_rate);
  const double sim_s = std::chrono::duration<double>(Steady::now() - t1).count();
  nlohmann::json plan;
  plan["schema"] = "pdserve.tune.plan/v1";
  plan["profile_key"] = profile_key(*profile);
  nlohmann::json cands = nlohmann::json::array();
  for (const Candidate& cand : ranked) {
    nlohmann::json j = candidate_to_json(cand);
    j["model"] = is_rescored(cand.topology) ? "simulator" : "analytic";
    for (const Candidate& a : analytic)
      if (a.topology == cand.topology) j["analytic_goodput_rps"] = a.goodput_rps;
    const auto [running, waiting] = admission_limits(*profile, cand.topology, c.workload);
    j["router_max_running"] = running;
    j["router_max_waiting"] = waiting;
    cands.push_back(j);
  }
  plan["candidates"] = cands;
  plan["baselines"] = nlohmann::json::array();
  if (c.baselines)
    for (BaselinePlanner b : {BaselinePlanner::kDynamo, BaselinePlanner::kAic})
      plan["baselines"].push_back(baseline_pick(b, c, *profile, topologies));
  if (Status s = write_text_file(out_path(c, "plan.json"), plan.dump(2) + "\n"); !s.ok()) {
    std::cerr << "error: " << s.message() << "\n";
    return kTuneUsage;
  }
  // How long planning took is a measurement: kept out of plan.json, whose bytes depend on the
  // inputs alone.
  (void)write_text_file(out_path(c, "plan_timing.json"),
                        nlohmann::json({{"candidates", topologies.size()}, {"analytic_s", analytic_s},
                                        {"simulator_s", sim_s}, {"simulated", rescored.size()}})
                                .dump(2) +
                            "\n");
  std::cerr << "tune: " << topologies.size() << " candidates ranked (analytic " << analytic_s << " s, simulator "
            << sim_s << " s for " << rescored.size() << "); best: " << (ranked.empty() ? "none" : topology_name(ranked.front().topology)) << "\n";
  return ranked.empty() || ranked.front().goodput_rps <= 0 ? kTuneNoCandidate : kTuneOk;
}

// --- gate and validate -----------------------------------------------------------------

struct PlanView {
  std::vector<Candidate> candidates;
  std::vector<nlohmann::json> raw;
  std::vector<std::pair<std::string, Topology>> baseline_picks;
};

StatusOr<PlanView> load_plan(const TuneConfig& c) {
  PD_ASSIGN_OR_RETURN(nlohmann::json plan, read_json_file(out_path(c, "plan.json")));
  PlanView v;
  for (const auto& j : plan.value("candidates", nlohmann::json::array())) {
    PD_ASSIGN_OR_RETURN(Candidate cand, candidate_from_json(j));
    v.candidates.push_back(cand);
    v.raw.push_back(j);
  }
  for (const auto& b : plan.value("baselines", nlohmann::json::array()))
    if (b.contains("pick") && !b["pick"].is_null()) {
      PD_ASSIGN_OR_RETURN(Topology t, topology_from_json(b["pick"]));
      v.baseline_picks.emplace_back(b.value("planner", "?"), t);
    }
  return v;
}

// What gets measured live: the top K, the best aggregated and each baseline's pick.
std::vector<std::pair<std::string, Candidate>> validation_set(const TuneConfig& c, const PlanView& plan) {
  std::vector<std::pair<std::string, Candidate>> out;
  auto add = [&](const std::string& label, const Candidate& cand) {
    for (auto& [l, existing] : out)
      if (existing.topology == cand.topology) {
        l += ", " + label;
        return;
      }
    out.emplace_back(label, cand);
  };
  int rank = 0;
  for (const Candidate& cand : plan.candidates) {
    if (cand.goodput_rps <= 0 || rank >= c.validate_top) break;
    add("rank " + std::to_string(++rank), cand);
  }
  for (const Candidate& cand : plan.candidates)
    if (cand.topology.aggregated && cand.goodput_rps > 0) {
      add("best aggregated", cand);
      break;
    }
  for (const auto& [planner, t] : plan.baseline_picks)
    for (const Candidate& cand : plan.candidates)
      if (cand.topology == t) add(planner + " pick", cand);
  return out;
}

// One line for the report: the pairs covered, or why it failed.
std::string describe_gate(const GateResult& r) {
  if (!r.pass) return r.reason;
  return std::to_string(r.prompts) + " requests in " + std::to_string(r.rounds) + " round(s), " +
         std::to_string(r.pairs_seen.size()) + " (prefill, decode) pair(s) covered, outputs exact, every block free";
}

GateFn make_gate(const TuneConfig& c, const Reference* reference, const std::vector<GoldenPrompt>* prompts) {
  return [&c, reference, prompts](const ClusterEndpoints& e, const Topology& t) -> StatusOr<GateVerdict> {
    GateOptions o;
    o.router = e.router;
    for (const WorkerEndpoint& w : e.workers) o.workers.push_back(w.grpc);
    o.policy = c.gate_policy;
    o.prefix_tokens = c.gate_prefix_tokens;
    o.expected_pairs = t.aggregated ? t.n_d : t.n_p * t.n_d;
    PD_ASSIGN_OR_RETURN(GateResult r, run_gate(o, *prompts, *reference));
    return GateVerdict{r.pass, describe_gate(r)};
  };
}

// The golden set for the model (its vocabulary, special tokens and context, from the model
// files, which are memory-mapped) and the engine the profile measured (block size, step budget).
StatusOr<std::vector<GoldenPrompt>> golden_set(const TuneConfig& c, const Profile& profile) {
  engine::ModelLoadOptions lo;
  lo.model = c.cluster.model;
  PD_ASSIGN_OR_RETURN(engine::LoadedModel model, engine::load_model(lo));
  GoldenShape shape;
  shape.vocab_size = model.config.vocab_size;
  shape.bos_id = model.config.bos_id;
  shape.eos_ids = model.config.eos_ids;
  shape.max_context = model.config.max_seq_len;
  if (!profile.by_tp.empty()) {
    shape.block_size = profile.by_tp.begin()->second.block_size;
    shape.max_batch_tokens = profile.by_tp.begin()->second.max_batch_tokens;
  }
  return golden_prompts(shape, c.workload.seed);
}


// The profile with every step law, transfer and overhead scaled by the measured-to-predicted
// ratios (prefill time, TPOT, the rest of the first token).
Profile scaled_profile(Profile p, double prefill, double decode, double overhead) {
  for (auto& [tp, t] : p.by_tp) {
    t.prefill.a *= prefill;
    t.prefill.b *= prefill;
    t.prefill.c *= prefill;
    for (DecodeLaw::Regime* r : {&t.decode.lo, &t.decode.hi}) {
      r->a *= decode;
      r->b *= decode;
      r->c *= decode;
    }
  }
  for (KvPairProfile& k : p.kv) {
    k.law.alpha *= decode;
    k.law.per_token *= decode;
  }
  p.handoff_s *= decode;
  p.router_overhead_s *= overhead;
  p.pd_overhead_s *= overhead;
  return p;
}

// One recalibration round (tune.md §6.6): when the first measured topology's goodput is off by
// more than the bound, the per-term ratios at its lightest load point scale the profile, and
// every measured topology is predicted again. The factors and the errors before and after are
// reported, never hidden; the ranking itself is not redone.
nlohmann::json recalibrate(const TuneConfig& c, const Profile& profile, const nlohmann::json& validations) {
  std::vector<Validation> vs;
  for (const auto& j : validations)
    if (StatusOr<Validation> v = validation_from_json(j); v.ok()) vs.push_back(*v);
  const Validation* first = nullptr;
  for (const Validation& v : vs)
    if (v.measured_goodput > 0 && !v.points.empty()) {
      first = &v;
      break;
    }
  if (first == nullptr) return nullptr;
  const double before = (first->predicted_goodput - first->measured_goodput) / first->measured_goodput;
  if (std::abs(before) <= c.goodput_error_bound) return nullptr;
  const MeasuredPoint* light = &first->points.front();
  for (const MeasuredPoint& p : first->points)
    if (p.factor < light->factor) light = &p;
  const Prediction& q = light->predicted;
  auto ratio = [](double measured, double predicted) { return predicted > 0 && measured > 0 ? measured / predicted : 1.0; };
  // The steps' own slowdown under the load where the workers measured it; else the ratio of
  // the request-level terms (which also carry queueing the model may have got wrong).
  const double f_prefill =
      light->slowdown.prefill > 0 ? light->slowdown.prefill : ratio(light->prefill_s, q.prefill_wait_s + q.prefill_s);
  const double f_decode = light->slowdown.decode > 0 ? light->slowdown.decode : ratio(light->tpot_p50_s, q.tpot_p50_s);
  const double f_overhead = ratio(light->overhead_s, q.overhead_s);
  const Profile calibrated = scaled_profile(profile, f_prefill, f_decode, f_overhead);
  nlohmann::json per = nlohmann::json::array();
  for (const Validation& v : vs) {
    if (v.measured_goodput <= 0) continue;
    StatusOr<std::pair<double, Prediction>> after = simulated_score(c, calibrated, v.topology);
    per.push_back({{"topology", topology_name(v.topology)},
                   {"measured_goodput_rps", v.measured_goodput},
                   {"predicted_before_rps", v.predicted_goodput},
                   {"predicted_after_rps", after.ok() ? nlohmann::json(after->first) : nlohmann::json(nullptr)},
                   {"error_before", (v.predicted_goodput - v.measured_goodput) / v.measured_goodput},
                   {"error_after", after.ok() ? nlohmann::json((after->first - v.measured_goodput) / v.measured_goodput)
                                              : nlohmann::json(nullptr)}});
  }
  std::cerr << "tune: recalibrated (prefill x" << f_prefill << ", decode x" << f_decode << ", overhead x" << f_overhead
            << ")\n";
  return {{"from", topology_name(first->topology)},
          {"factors", {{"prefill", f_prefill}, {"decode", f_decode}, {"overhead", f_overhead}}},
          {"topologies", per}};
}

int stage_validate(const TuneConfig& c, bool time_it, const Steady::time_point started) {
  StatusOr<Profile> profile = load_stage_profile(c);
  StatusOr<PlanView> plan = load_plan(c);
  if (!profile.ok() || !plan.ok()) {
    std::cerr << "error: " << (profile.ok() ? plan.status() : profile.status()).message() << "\n";
    return kTuneUsage;
  }
  if (Status s = profile_fits(*profile, c); !s.ok()) {
    std::cerr << "error: validate: " << s.message() << "\n";
    return kTuneUsage;
  }
  StatusOr<std::vector<GoldenPrompt>> prompts = golden_set(c, *profile);
  if (!prompts.ok()) {
    std::cerr << "error: golden prompts: " << prompts.status().message() << "\n";
    return kTuneUsage;
  }
  StatusOr<std::string> model_path = engine::resolve_model(c.cluster.model);
  StatusOr<Reference> reference =
      model_path.ok() ? compute_reference(*model_path, *prompts) : StatusOr<Reference>(model_path.status());
  if (!reference.ok()) {
    std::cerr << "error: gate reference: " << reference.status().message() << "\n";
    return kTuneUsage;
  }
  const GateFn gate = make_gate(c, &*reference, &*prompts);
  ValidateOptions vo;
  vo.cluster = c.cluster;
  vo.workload = c.workload;
  vo.slo = c.slo;
  vo.point_duration_s = c.point_duration_s;
  vo.profile = &*profile;
  if (!time_it) vo.loads.clear();
  nlohmann::json out = nlohmann::json::array();
  const double per_topology_s = 20 + (time_it ? (vo.loads.size() + 1) * (c.point_duration_s + 3) : 0);
  for (const auto& [label, cand] : validation_set(c, *plan)) {
    const double elapsed = std::chrono::duration<double>(Steady::now() - started).count();
    if (elapsed + per_topology_s > c.budget_s) {
      std::cerr << "tune: budget: not measuring " << topology_name(cand.topology) << " (" << label << ")\n";
      Validation v;
      v.topology = cand.topology;
      v.label = label;
      v.predicted_goodput = cand.goodput_rps;
      v.error = "skipped: the budget (--budget-s) would be exceeded";
      out.push_back(validation_to_json(v));
      continue;
    }
    ClusterOptions co = c.cluster;
    const auto [running, waiting] = admission_limits(*profile, cand.topology, c.workload);
    co.max_running = running;
    co.max_waiting = waiting;
    vo.cluster = co;
    const Profile& prof = *profile;
    PredictAtFn predict = [&](const Topology& t, double rate) -> StatusOr<Prediction> {
      PD_ASSIGN_OR_RETURN(SimResult r, simulate(prof, t, c.workload, c.slo, rate, sim_options(c, prof, t)));
      return r.prediction;
    };
    std::cerr << "tune: " << (time_it ? "validating " : "gating ") << topology_name(cand.topology) << " (" << label
              << ")\n";
    Validation v = validate_topology(vo, cand.topology, label, cand.goodput_rps, predict, gate);
    std::cerr << "tune:   gate " << (v.gate_run ? (v.gate.pass ? "pass" : "FAIL") : "not run") << (v.gate.detail.empty() ? "" : ": " + v.gate.detail)
              << (v.measured_goodput >= 0 ? "; measured goodput " + std::to_string(v.measured_goodput) + "/s" : "")
              << (v.error.empty() ? "" : "; " + v.error) << "\n";
    out.push_back(validation_to_json(v));
  }
  nlohmann::json doc = {{"validations", out}};
  if (time_it) doc["recalibration"] = recalibrate(c, *profile, out);
  const std::string file = out_path(c, time_it ? "validation.json" : "gate.json");
  if (Status s = write_text_file(file, doc.dump(2) + "\n"); !s.ok()) {
    std::cerr << "error: " << s.message() << "\n";
    return kTuneUsage;
  }
  return kTuneOk;
}

}  // namespace

int run_tune(const TuneConfig& c, const std::vector<Stage>& stages) {
  const Steady::time_point started = Steady::now();
  std::error_code ec;
  fs::create_directories(c.cluster.work_dir, ec);
  fs::create_directories(c.out, ec);
  int code = kTuneOk;
  const bool validating = std::find(stages.begin(), stages.end(), Stage::kValidate) != stages.end();
  for (Stage s : stages) {
    switch (s) {
      case Stage::kProfile: code = stage_profile(c); break;
      case Stage::kPlan: code = stage_plan(c); break;
      // The validate stage gates every topology before timing it; a separate gate stage is
      // for running the gate alone.
      case Stage::kGate: code = validating ? kTuneOk : stage_validate(c, false, started); break;
      case Stage::kValidate: code = stage_validate(c, true, started); break;
      case Stage::kReport: code = write_report(c); break;
    }
    if (code == kTuneUsage) return code;
    if (code == kTuneNoCandidate && s == Stage::kPlan) {
      (void)write_report(c);
      return code;
    }
  }
  return code;
}

}  // namespace pdserve::tune
