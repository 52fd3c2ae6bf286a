#include "tune/load_runner.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "common/percentile.h"
#include "tune/child_process.h"

namespace pdserve::tune {

std::vector<std::string> bench_arguments(const LoadSpec& s, const std::string& result_file) {
  std::vector<std::string> a = {"bench",
                                "--router",
                                s.router,
                                "--num-prompts",
                                std::to_string(s.num_prompts),
                                "--random-input-len",
                                std::to_string(s.input_len),
                                "--random-output-len",
                                std::to_string(s.output_len),
                                "--ignore-eos",
                                "--seed",
                                std::to_string(s.seed),
                                "--save-detailed",
                                "--result-file",
                                result_file};
  if (s.range_ratio > 0) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.6g", s.range_ratio);
    a.insert(a.end(), {"--random-range-ratio", buf});
  }
  if (std::isfinite(s.rate)) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.6g", s.rate);
    a.insert(a.end(), {"--request-rate", buf});
    std::snprintf(buf, sizeof buf, "%.6g", s.burstiness);
    a.insert(a.end(), {"--burstiness", buf});
  }
  if (s.max_concurrency > 0) a.insert(a.end(), {"--max-concurrency", std::to_string(s.max_concurrency)});
  if (s.num_warmups > 0) a.insert(a.end(), {"--num-warmups", std::to_string(s.num_warmups)});
  return a;
}

StatusOr<LoadResult> parse_bench_result(const std::string& text) {
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.contains("requests") || !j["requests"].is_array())
    return absl::InvalidArgumentError("bench result has no \"requests\" array (--save-detailed)");
  LoadResult r;
  r.duration_s = j.value("duration", 0.0);
  for (const auto& q : j["requests"]) {
    RequestSample s;
    s.ok = q.value("ok", false);
    s.start_s = q.value("start_s", 0.0);
    s.ttft_s = q.value("ttft_s", 0.0);
    s.e2e_s = q.value("e2e_s", 0.0);
    s.tpot_s = q.contains("tpot_s") && q["tpot_s"].is_number() ? q["tpot_s"].get<double>() : -1;
    s.prompt_tokens = q.value("prompt_tokens", 0);
    s.output_tokens = q.value("output_tokens", 0);
    s.queued_s = q.value("server_queued_s", 0.0);
    s.prefill_s = q.value("server_prefill_s", 0.0);
    s.kv_transfer_s = q.value("server_kv_transfer_s", 0.0);
    if (q.contains("itl_s")) s.itl_s = q["itl_s"].get<std::vector<double>>();
    s.prefill_worker = q.value("prefill_worker", "");
    s.decode_worker = q.value("decode_worker", "");
    r.requests.push_back(std::move(s));
  }
  return r;
}

StatusOr<LoadResult> run_load(const std::string& pdserve, const LoadSpec& spec, const std::string& work_dir,
                              const std::string& tag, double timeout_s) {
  namespace fs = std::filesystem;
  const std::string result = (fs::path(work_dir) / (tag + ".bench.json")).string();
  const std::string log = (fs::path(work_dir) / (tag + ".bench.log")).string();
  fs::remove(result);
  std::vector<std::string> argv = {pdserve};
  for (std::string& a : bench_arguments(spec, result)) argv.push_back(std::move(a));
  PD_ASSIGN_OR_RETURN(ChildProcess bench, ChildProcess::start(argv, log));
  if (!bench.wait(std::chrono::milliseconds(int64_t(timeout_s * 1000))).ok()) {
    bench.stop(std::chrono::seconds(2));
    return absl::DeadlineExceededError(absl::StrCat("pdserve bench (", tag, ") ran past ", timeout_s, " s"));
  }
  // bench exits 1 when a request failed; the result file still says which.
  std::ifstream in(result);
  if (!in) return absl::InternalError("pdserve bench (" + tag + ") wrote no result (exit " +
                                      std::to_string(bench.exit_code()) + "); see " + log);
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_bench_result(ss.str());
}

double attainment(const std::vector<RequestSample>& requests, const Slo& slo) {
  if (requests.empty()) return 0;
  int good = 0;
  for (const RequestSample& r : requests)
    if (r.ok && r.ttft_s <= slo.ttft_s && (r.tpot_s < 0 || r.tpot_s <= slo.tpot_s)) ++good;
  return double(good) / double(requests.size());
}

double sample_percentile(const std::vector<RequestSample>& requests, double RequestSample::*field, double p) {
  std::vector<double> v;
  for (const RequestSample& r : requests)
    if (r.ok && r.*field >= 0) v.push_back(r.*field);
  return percentile(std::move(v), p);
}

Status apply_workload(const Workload& w, LoadSpec* spec) {
  auto centre_ratio = [](const LengthDist& d, int* len, double* ratio) -> Status {
    switch (d.kind) {
      case LengthDist::Kind::kFixed:
        *len = d.lo;
        *ratio = 0;
        return absl::OkStatus();
      case LengthDist::Kind::kUniform:
        *len = (d.lo + d.hi) / 2;
        *ratio = d.hi + d.lo > 0 ? double(d.hi - d.lo) / double(d.hi + d.lo) : 0;
        return absl::OkStatus();
      case LengthDist::Kind::kEmpirical:
        return absl::InvalidArgumentError("pdserve bench cannot replay a trace's lengths yet");
    }
    return absl::InvalidArgumentError("unknown length distribution");
  };
  double ri = 0, ro = 0;
  PD_RETURN_IF_ERROR(centre_ratio(w.input, &spec->input_len, &ri));
  PD_RETURN_IF_ERROR(centre_ratio(w.output, &spec->output_len, &ro));
  if (std::abs(ri - ro) > 1e-9)
    return absl::InvalidArgumentError(
        "pdserve bench samples both lengths with one --random-range-ratio: give both the same relative spread");
  spec->range_ratio = ri;
  switch (w.arrival) {
    case Arrival::kPoisson: spec->burstiness = 1; break;
    case Arrival::kGamma: spec->burstiness = 1.0 / (w.gamma_cv * w.gamma_cv); break;
    case Arrival::kClosed:
      spec->max_concurrency = w.concurrency;
      spec->rate = std::numeric_limits<double>::infinity();
      break;
  }
  spec->seed = w.seed;
  return absl::OkStatus();
}

}  // namespace pdserve::tune
