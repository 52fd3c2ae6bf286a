#include "tune/plan_io.h"

#include <fstream>
#include <sstream>

namespace pdserve::tune {
namespace {

Bottleneck parse_bottleneck(const std::string& s) {
  for (Bottleneck b : {Bottleneck::kPrefill, Bottleneck::kDecode, Bottleneck::kKvCapacity, Bottleneck::kTransfer,
                       Bottleneck::kRouter, Bottleneck::kInfeasible})
    if (s == bottleneck_name(b)) return b;
  return Bottleneck::kInfeasible;
}

}  // namespace

nlohmann::json topology_to_json(const Topology& t) {
  nlohmann::json j = {{"name", topology_name(t)}, {"aggregated", t.aggregated}, {"ranks", t.ranks()}};
  if (t.aggregated) {
    j["workers"] = t.n_d;
    j["tp"] = t.tp_d;
  } else {
    j["prefill"] = t.n_p;
    j["prefill_tp"] = t.tp_p;
    j["decode"] = t.n_d;
    j["decode_tp"] = t.tp_d;
    j["kv_mode"] = t.mode == KvMode::kPush ? "push" : "pull";
  }
  return j;
}

StatusOr<Topology> topology_from_json(const nlohmann::json& j) {
  if (!j.is_object() || !j.contains("aggregated")) return absl::InvalidArgumentError("not a topology: " + j.dump());
  Topology t;
  t.aggregated = j["aggregated"].get<bool>();
  if (t.aggregated) {
    t.n_d = j.value("workers", 1);
    t.tp_d = j.value("tp", 1);
  } else {
    t.n_p = j.value("prefill", 1);
    t.tp_p = j.value("prefill_tp", 1);
    t.n_d = j.value("decode", 1);
    t.tp_d = j.value("decode_tp", 1);
    const std::string mode = j.value("kv_mode", "push");
    if (mode != "push" && mode != "pull") return absl::InvalidArgumentError("kv_mode must be push or pull, not " + mode);
    t.mode = mode == "push" ? KvMode::kPush : KvMode::kPull;
  }
  if (t.n_d < 1 || t.tp_d < 1 || (!t.aggregated && (t.n_p < 1 || t.tp_p < 1)))
    return absl::InvalidArgumentError("a topology needs at least one worker of each role and TP ≥ 1: " + j.dump());
  return t;
}

nlohmann::json prediction_to_json(const Prediction& p) {
  return {{"rate", p.rate},
          {"attainment", p.attainment},
          {"ttft_p50_ms", p.ttft_p50_s * 1e3},
          {"ttft_pq_ms", p.ttft_pq_s * 1e3},
          {"tpot_p50_ms", p.tpot_p50_s * 1e3},
          {"tpot_pq_ms", p.tpot_pq_s * 1e3},
          {"router_wait_ms", p.router_wait_s * 1e3},
          {"prefill_wait_ms", p.prefill_wait_s * 1e3},
          {"prefill_ms", p.prefill_s * 1e3},
          {"overhead_ms", p.overhead_s * 1e3},
          {"kv_transfer_ms", p.kv_transfer_s * 1e3},
          {"handoff_ms", p.handoff_s * 1e3},
          {"prefill_utilization", p.prefill_utilization},
          {"decode_batch", p.decode_batch},
          {"kv_occupancy", p.kv_occupancy},
          {"stable", p.stable}};
}

Prediction prediction_from_json(const nlohmann::json& j) {
  Prediction p;
  p.rate = j.value("rate", 0.0);
  p.attainment = j.value("attainment", 0.0);
  p.ttft_p50_s = j.value("ttft_p50_ms", 0.0) / 1e3;
  p.ttft_pq_s = j.value("ttft_pq_ms", 0.0) / 1e3;
  p.tpot_p50_s = j.value("tpot_p50_ms", 0.0) / 1e3;
  p.tpot_pq_s = j.value("tpot_pq_ms", 0.0) / 1e3;
  p.router_wait_s = j.value("router_wait_ms", 0.0) / 1e3;
  p.prefill_wait_s = j.value("prefill_wait_ms", 0.0) / 1e3;
  p.prefill_s = j.value("prefill_ms", 0.0) / 1e3;
  p.overhead_s = j.value("overhead_ms", 0.0) / 1e3;
  p.kv_transfer_s = j.value("kv_transfer_ms", 0.0) / 1e3;
  p.handoff_s = j.value("handoff_ms", 0.0) / 1e3;
  p.prefill_utilization = j.value("prefill_utilization", 0.0);
  p.decode_batch = j.value("decode_batch", 0.0);
  p.kv_occupancy = j.value("kv_occupancy", 0.0);
  p.stable = j.value("stable", true);
  return p;
}

nlohmann::json candidate_to_json(const Candidate& c) {
  nlohmann::json j = {{"topology", topology_to_json(c.topology)},
                      {"goodput_rps", c.goodput_rps},
                      {"goodput_rps_per_rank", c.goodput_rps / std::max(1, c.topology.ranks())},
                      {"predicted", prediction_to_json(c.at_goodput)},
                      {"bottleneck", bottleneck_name(c.bottleneck)},
                      {"output_tok_s_per_rank", c.output_tok_s_per_rank},
                      {"tok_s_per_user", c.tok_s_per_user},
                      {"pareto", c.on_pareto_front}};
  if (!c.error.empty()) j["error"] = c.error;
  return j;
}

StatusOr<Candidate> candidate_from_json(const nlohmann::json& j) {
  Candidate c;
  PD_ASSIGN_OR_RETURN(c.topology, topology_from_json(j.value("topology", nlohmann::json())));
  c.goodput_rps = j.value("goodput_rps", 0.0);
  c.at_goodput = prediction_from_json(j.value("predicted", nlohmann::json::object()));
  c.bottleneck = parse_bottleneck(j.value("bottleneck", ""));
  c.output_tok_s_per_rank = j.value("output_tok_s_per_rank", 0.0);
  c.tok_s_per_user = j.value("tok_s_per_user", 0.0);
  c.on_pareto_front = j.value("pareto", false);
  c.error = j.value("error", "");
  return c;
}

nlohmann::json validation_to_json(const Validation& v) {
  nlohmann::json points = nlohmann::json::array();
  for (const MeasuredPoint& p : v.points)
    points.push_back({{"factor", p.factor},
                      {"rate", p.rate},
                      {"requests", p.requests},
                      {"failed", p.failed},
                      {"attainment", p.attainment},
                      {"ttft_p50_ms", p.ttft_p50_s * 1e3},
                      {"ttft_pq_ms", p.ttft_pq_s * 1e3},
                      {"tpot_p50_ms", p.tpot_p50_s * 1e3},
                      {"tpot_pq_ms", p.tpot_pq_s * 1e3},
                      {"queued_ms", p.queued_s * 1e3},
                      {"prefill_ms", p.prefill_s * 1e3},
                      {"kv_transfer_ms", p.kv_transfer_s * 1e3},
                      {"overhead_ms", p.overhead_s * 1e3},
                      {"prefill_step_slowdown", p.slowdown.prefill},
                      {"decode_step_slowdown", p.slowdown.decode},
                      {"prefill_steps", p.slowdown.prefill_steps},
                      {"decode_steps", p.slowdown.decode_steps},
                      {"predicted", prediction_to_json(p.predicted)}});
  nlohmann::json j = {{"topology", topology_to_json(v.topology)},
                      {"label", v.label},
                      {"predicted_goodput_rps", v.predicted_goodput},
                      {"gate", v.gate_run ? (v.gate.pass ? "pass" : "fail") : "not-run"},
                      {"gate_detail", v.gate.detail},
                      {"points", points},
                      {"measured_goodput_rps", v.measured_goodput >= 0 ? nlohmann::json(v.measured_goodput) : nlohmann::json(nullptr)},
                      {"measured_is_bound", v.measured_is_bound},
                      {"noise_attainment", v.noise}};
  if (!v.error.empty()) j["error"] = v.error;
  return j;
}

StatusOr<Validation> validation_from_json(const nlohmann::json& j) {
  Validation v;
  PD_ASSIGN_OR_RETURN(v.topology, topology_from_json(j.value("topology", nlohmann::json())));
  v.label = j.value("label", "");
  v.predicted_goodput = j.value("predicted_goodput_rps", 0.0);
  const std::string gate = j.value("gate", "not-run");
  v.gate_run = gate != "not-run";
  v.gate.pass = gate == "pass";
  v.gate.detail = j.value("gate_detail", "");
  for (const auto& p : j.value("points", nlohmann::json::array())) {
    MeasuredPoint m;
    m.factor = p.value("factor", 0.0);
    m.rate = p.value("rate", 0.0);
    m.requests = p.value("requests", 0);
    m.failed = p.value("failed", 0);
    m.attainment = p.value("attainment", 0.0);
    m.ttft_p50_s = p.value("ttft_p50_ms", 0.0) / 1e3;
    m.ttft_pq_s = p.value("ttft_pq_ms", 0.0) / 1e3;
    m.tpot_p50_s = p.value("tpot_p50_ms", 0.0) / 1e3;
    m.tpot_pq_s = p.value("tpot_pq_ms", 0.0) / 1e3;
    m.queued_s = p.value("queued_ms", 0.0) / 1e3;
    m.prefill_s = p.value("prefill_ms", 0.0) / 1e3;
    m.kv_transfer_s = p.value("kv_transfer_ms", 0.0) / 1e3;
    m.overhead_s = p.value("overhead_ms", 0.0) / 1e3;
    m.slowdown.prefill = p.value("prefill_step_slowdown", 0.0);
    m.slowdown.decode = p.value("decode_step_slowdown", 0.0);
    m.slowdown.prefill_steps = p.value("prefill_steps", 0);
    m.slowdown.decode_steps = p.value("decode_steps", 0);
    m.predicted = prediction_from_json(p.value("predicted", nlohmann::json::object()));
    v.points.push_back(m);
  }
  v.measured_goodput = j.contains("measured_goodput_rps") && j["measured_goodput_rps"].is_number()
                           ? j["measured_goodput_rps"].get<double>()
                           : -1;
  v.measured_is_bound = j.value("measured_is_bound", false);
  v.noise = j.value("noise_attainment", 0.0);
  v.error = j.value("error", "");
  return v;
}

StatusOr<nlohmann::json> read_json_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError("cannot read " + path);
  std::stringstream ss;
  ss << in.rdbuf();
  nlohmann::json j = nlohmann::json::parse(ss.str(), nullptr, false);
  if (j.is_discarded()) return absl::InvalidArgumentError(path + " is not JSON");
  return j;
}

Status write_text_file(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  out.close();
  if (!out) return absl::InternalError("cannot write " + path);
  return absl::OkStatus();
}

}  // namespace pdserve::tune
