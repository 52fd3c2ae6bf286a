#include "tools/tune_command.h"

#include <filesystem>
#include <iostream>
#include <memory>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "tune/profile_io.h"
#include "tune/tuner.h"

namespace pdserve::tools {
namespace {

namespace fs = std::filesystem;
using tune::Arrival;
using tune::LengthDist;

struct TuneFlags {
  std::string model = "stories260K";
  std::string device = "cpu";
  std::string weight_dtype = "f32", kv_dtype = "f32", gemm_precision = "exact";
  int ranks = 0;
  std::vector<int> tps = {1, 2, 4, 8};
  std::string kv_mode = "push";
  int input_len = 0, output_len = 0;
  std::string workload = "fixed";
  std::string arrival = "poisson";
  double rate = 0;
  int concurrency = 0;
  double slo_ttft_ms = 0, slo_tpot_ms = 0;
  double slo_percentile = 90, attainment = 0.9;
  std::string objective = "goodput-per-rank";
  double budget_s = 1800;
  std::string import_profile;
  std::string out;
  int validate_top = 3;
  int simulate_top = 20;
  double point_duration_s = 20;
  std::string gate = "exact";
  bool no_baselines = false;
  bool aggregated_only = false, disaggregated_only = false;
  uint64_t seed = 0;
};

// "fixed" | "uniform:ratio=R" into the lengths around --input-len/--output-len.
Status parse_workload(const TuneFlags& f, tune::Workload* w) {
  w->input = {LengthDist::Kind::kFixed, f.input_len, f.input_len, {}};
  w->output = {LengthDist::Kind::kFixed, f.output_len, f.output_len, {}};
  if (f.workload == "fixed") return absl::OkStatus();
  if (absl::string_view(f.workload).substr(0, 14) == "uniform:ratio=") {
    double r = 0;
    if (!absl::SimpleAtod(absl::string_view(f.workload).substr(14), &r) || r <= 0 || r >= 1)
      return absl::InvalidArgumentError("--workload uniform:ratio=R needs 0 < R < 1");
    auto spread = [r](int len) {
      return LengthDist{LengthDist::Kind::kUniform, std::max(1, int(std::lround(len * (1 - r)))),
                        int(std::lround(len * (1 + r))), {}};
    };
    w->input = spread(f.input_len);
    w->output = spread(f.output_len);
    return absl::OkStatus();
  }
  if (absl::string_view(f.workload).substr(0, 6) == "trace:")
    return absl::UnimplementedError("--workload trace:FILE is not supported yet: pdserve bench cannot replay a trace's lengths");
  return absl::InvalidArgumentError("--workload must be fixed, uniform:ratio=R or trace:FILE, not " + f.workload);
}

Status parse_arrival(const TuneFlags& f, tune::Workload* w) {
  if (f.arrival == "poisson") {
    w->arrival = Arrival::kPoisson;
  } else if (f.arrival == "closed") {
    w->arrival = Arrival::kClosed;
    if (f.concurrency <= 0) return absl::InvalidArgumentError("--arrival closed needs --concurrency C");
    w->concurrency = f.concurrency;
  } else if (absl::string_view(f.arrival).substr(0, 9) == "gamma:cv=") {
    w->arrival = Arrival::kGamma;
    if (!absl::SimpleAtod(absl::string_view(f.arrival).substr(9), &w->gamma_cv) || w->gamma_cv <= 0)
      return absl::InvalidArgumentError("--arrival gamma:cv=X needs X > 0");
  } else {
    return absl::InvalidArgumentError("--arrival must be poisson, gamma:cv=X or closed, not " + f.arrival);
  }
  if (w->arrival != Arrival::kClosed && f.concurrency > 0)
    return absl::InvalidArgumentError("--concurrency is for --arrival closed (open-loop arrivals are given by rate)");
  return absl::OkStatus();
}

int run(const TuneFlags& f, const std::vector<tune::Stage>& stages) {
  tune::TuneConfig c;
  auto fail = [](const std::string& m) {
    std::cerr << "error: " << m << "\n";
    return tune::kTuneUsage;
  };
  if (f.out.empty()) return fail("--out DIR is required");
  const bool needs_inputs = stages.size() > 1 || stages[0] != tune::Stage::kReport;
  if (needs_inputs && f.ranks <= 0) return fail("--ranks N (the rank budget) is required");
  if (needs_inputs && (f.input_len <= 0 || f.output_len <= 0)) return fail("--input-len and --output-len must be > 0");
  if (needs_inputs && (f.slo_ttft_ms <= 0 || f.slo_tpot_ms <= 0)) return fail("--slo-ttft-ms and --slo-tpot-ms must be > 0");
  if (f.slo_percentile <= 0 || f.slo_percentile >= 100) return fail("--slo-percentile must be in (0, 100)");
  if (f.attainment <= 0 || f.attainment > 1) return fail("--attainment must be in (0, 1]");
  if (f.aggregated_only && f.disaggregated_only) return fail("--aggregated-only and --disaggregated-only exclude each other");
  std::error_code ec;
  c.cluster.pdserve = fs::read_symlink("/proc/self/exe", ec).string();
  c.cluster.model = f.model;
  c.cluster.device = f.device == "cuda" ? tune::Device::kCuda
                     : f.device == "hip" ? tune::Device::kHip
                     : f.device == "emulated" ? tune::Device::kEmulated
                                              : tune::Device::kCpu;
  c.cluster.weight_dtype = *tune::parse_dtype(f.weight_dtype);  // Checked by the flags.
  c.cluster.kv_dtype = *tune::parse_dtype(f.kv_dtype);
  c.cluster.gemm_precision = *tune::parse_gemm_precision(f.gemm_precision);
  if (Status s =
          tune::check_dtypes_on(c.cluster.device, c.cluster.weight_dtype, c.cluster.kv_dtype, c.cluster.gemm_precision);
      !s.ok())
    return fail(std::string(s.message()));
  c.cluster.work_dir = (fs::path(f.out) / "work").string();
  c.ranks = f.ranks;
  c.tps.clear();
  for (int tp : f.tps) {
    if (tp < 1) return fail("--tp sizes must be ≥ 1");
    if (tp <= f.ranks) c.tps.push_back(tp);
  }
  if (needs_inputs && c.tps.empty()) return fail("no --tp size fits in --ranks " + std::to_string(f.ranks));
  if (f.kv_mode == "auto") c.modes = {tune::KvMode::kPush, tune::KvMode::kPull};
  else c.modes = {f.kv_mode == "pull" ? tune::KvMode::kPull : tune::KvMode::kPush};
  c.aggregated = !f.disaggregated_only;
  c.disaggregated = !f.aggregated_only;
  if (Status s = parse_workload(f, &c.workload); !s.ok()) return fail(std::string(s.message()));
  if (Status s = parse_arrival(f, &c.workload); !s.ok()) return fail(std::string(s.message()));
  c.workload.seed = f.seed;
  c.slo = {f.slo_ttft_ms / 1e3, f.slo_tpot_ms / 1e3, f.slo_percentile, f.attainment};
  c.objective = f.objective == "min-ranks" ? tune::Objective::kMinRanks
                : f.objective == "pareto"  ? tune::Objective::kPareto
                                           : tune::Objective::kGoodputPerRank;
  if (c.objective == tune::Objective::kMinRanks && f.rate <= 0) return fail("--objective min-ranks needs --rate R (the rate to serve)");
  if (c.objective != tune::Objective::kMinRanks && f.rate > 0)
    return fail("--rate is the target of --objective min-ranks; the other objectives search the rate");
  c.target_rate = f.rate;
  c.budget_s = f.budget_s;
  c.import_profile = f.import_profile;
  c.out = f.out;
  c.validate_top = f.validate_top;
  if (f.simulate_top < 0) return fail("--simulate-top must be ≥ 0");
  c.sim_rescore_top = f.simulate_top;
  c.point_duration_s = f.point_duration_s;
  if (f.gate == "exact") {
    c.gate_policy = tune::GatePolicy::kExact;
  } else if (absl::string_view(f.gate).substr(0, 7) == "prefix:") {
    c.gate_policy = tune::GatePolicy::kPrefix;
    if (!absl::SimpleAtoi(absl::string_view(f.gate).substr(7), &c.gate_prefix_tokens) || c.gate_prefix_tokens < 1)
      return fail("--gate prefix:N needs N ≥ 1");
  } else {
    return fail("--gate must be exact or prefix:N");
  }
  c.baselines = !f.no_baselines;
  return tune::run_tune(c, stages);
}

void add_flags(CLI::App* cmd, TuneFlags* f) {
  cmd->add_option("--model", f->model, "Model path or name")->capture_default_str();
  cmd->add_option("--device", f->device, "Workers' backend: cpu, cuda, hip or emulated")
      ->check(CLI::IsMember({"cpu", "cuda", "hip", "emulated"}))
      ->capture_default_str();
  cmd->add_option("--weight-dtype", f->weight_dtype,
                  "GPU workers' GEMM weights, as profiled and planned: f32 or bf16 (the profile records it)")
      ->check(CLI::IsMember({"f32", "bf16"}))
      ->capture_default_str();
  cmd->add_option("--kv-dtype", f->kv_dtype,
                  "GPU workers' KV cache elements, as profiled and planned: f32 or bf16 (the profile records it)")
      ->check(CLI::IsMember({"f32", "bf16"}))
      ->capture_default_str();
  cmd->add_option("--gemm-precision", f->gemm_precision,
                  "GPU workers' GEMM activations, as profiled and planned: exact or bf16 (needs --weight-dtype bf16; "
                  "the profile records it)")
      ->check(CLI::IsMember({"exact", "bf16"}))
      ->capture_default_str();
  cmd->add_option("--ranks", f->ranks, "Rank budget N (GPUs, or CPU ranks)");
  cmd->add_option("--tp", f->tps, "TP sizes to consider (comma-separated)")->delimiter(',')->capture_default_str();
  cmd->add_option("--kv-mode", f->kv_mode, "push, pull, or auto (both)")
      ->check(CLI::IsMember({"push", "pull", "auto"}))
      ->capture_default_str();
  cmd->add_option("--input-len", f->input_len, "Prompt tokens (the centre of a uniform workload)");
  cmd->add_option("--output-len", f->output_len, "Generated tokens (max_tokens, ignore_eos)");
  cmd->add_option("--workload", f->workload, "fixed, uniform:ratio=R (lengths in len·(1±R)), trace:FILE")
      ->capture_default_str();
  cmd->add_option("--arrival", f->arrival, "poisson, gamma:cv=X or closed")->capture_default_str();
  cmd->add_option("--rate", f->rate, "min-ranks: the request rate to serve");
  cmd->add_option("--concurrency", f->concurrency, "closed: clients in the loop");
  cmd->add_option("--slo-ttft-ms", f->slo_ttft_ms, "TTFT objective (ms) at --slo-percentile");
  cmd->add_option("--slo-tpot-ms", f->slo_tpot_ms, "TPOT objective (ms) at --slo-percentile");
  cmd->add_option("--slo-percentile", f->slo_percentile, "Percentile the objectives hold at")->capture_default_str();
  cmd->add_option("--attainment", f->attainment, "Fraction of requests meeting both, for goodput")->capture_default_str();
  cmd->add_option("--objective", f->objective, "goodput-per-rank, min-ranks or pareto")
      ->check(CLI::IsMember({"goodput-per-rank", "min-ranks", "pareto"}))
      ->capture_default_str();
  cmd->add_option("--budget-s", f->budget_s, "Wall-clock budget; validation stops measuring past it")->capture_default_str();
  cmd->add_option("--import-profile", f->import_profile, "Plan from this profile.json instead of profiling");
  cmd->add_option("--out", f->out, "Output directory");
  cmd->add_option("--validate-top", f->validate_top, "Top candidates to validate live")->capture_default_str();
  cmd->add_option("--simulate-top", f->simulate_top, "Candidates the simulator re-scores after the analytic model")
      ->capture_default_str();
  cmd->add_option("--point-duration", f->point_duration_s, "Seconds per validation load point")->capture_default_str();
  cmd->add_option("--gate", f->gate, "Correctness gate policy: exact, or prefix:N (bf16 GPUs)")->capture_default_str();
  cmd->add_flag("--no-baselines", f->no_baselines, "Do not compute the baseline planners' picks");
  cmd->add_flag("--aggregated-only", f->aggregated_only, "Only aggregated candidates");
  cmd->add_flag("--disaggregated-only", f->disaggregated_only, "Only P/D candidates");
  cmd->add_option("--seed", f->seed, "Seed of the workload sampler, the simulator and the golden prompts")
      ->capture_default_str();
}

}  // namespace

void add_tune_command(CLI::App& app, int* exit_code) {
  auto f = std::make_shared<TuneFlags>();
  CLI::App* cmd = app.add_subcommand("tune", "Size a deployment: profile, plan, gate, validate, report (docs/tune.md)");
  add_flags(cmd, f.get());
  cmd->require_subcommand(0, 1);
  const std::pair<const char*, tune::Stage> stages[] = {{"profile", tune::Stage::kProfile},
                                                        {"plan", tune::Stage::kPlan},
                                                        {"gate", tune::Stage::kGate},
                                                        {"validate", tune::Stage::kValidate},
                                                        {"report", tune::Stage::kReport}};
  for (const auto& [name, stage] : stages) {
    CLI::App* sub = cmd->add_subcommand(name, std::string("Run only the ") + name + " stage");
    sub->fallthrough();
    const tune::Stage s = stage;
    sub->callback([f, exit_code, s] { *exit_code = run(*f, {s}); });
  }
  cmd->callback([f, exit_code, cmd] {
    if (!cmd->get_subcommands().empty()) return;
    *exit_code = run(*f,
                     {tune::Stage::kProfile, tune::Stage::kPlan, tune::Stage::kGate, tune::Stage::kValidate,
                      tune::Stage::kReport});
  });
}

}  // namespace pdserve::tools
