#include "tune/deploy_values.h"

#include <cstdint>
#include <vector>

#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "tune/profile_io.h"

namespace pdserve::tune {
namespace {

// The chart's accelerator.vendor for a device, and the GPU resource each rank requests.
struct Accelerator {
  absl::string_view vendor, gpu_resource;
};
Accelerator accelerator(Device device) {
  switch (device) {
    case Device::kCuda: return {"nvidia", "nvidia.com/gpu"};
    case Device::kHip: return {"amd", "amd.com/gpu"};
    case Device::kCpu:
    case Device::kEmulated: return {"cpu", ""};
  }
  return {"cpu", ""};
}

// The chart's preset for a device, named in the install line (the cluster's own may differ).
absl::string_view preset_file(Device device) {
  switch (device) {
    case Device::kCuda: return "values-nvidia-h200.yaml";
    case Device::kHip: return "values-amd-mi355x.yaml";
    case Device::kCpu:
    case Device::kEmulated: return "values-cpu.yaml";
  }
  return "values-cpu.yaml";
}

Status check_at_least(const std::optional<int>& v, int min, absl::string_view name) {
  if (v && *v < min) return absl::InvalidArgumentError(absl::StrCat(name, " must be at least ", min, " (got ", *v, ")"));
  return absl::OkStatus();
}

// What every target needs of a plan: a topology that can run and values the programs accept.
Status check_plan(const DeployPlan& plan) {
  const Topology& t = plan.topology;
  if (t.n_d < 1 || t.tp_d < 1 || (!t.aggregated && (t.n_p < 1 || t.tp_p < 1)))
    return absl::InvalidArgumentError(
        t.aggregated ? absl::StrFormat("an aggregated plan needs at least one worker of TP >= 1 (got %d x TP%d)", t.n_d, t.tp_d)
                     : absl::StrFormat("a prefill/decode plan needs at least one worker of TP >= 1 on each side "
                                       "(got %d x TP%d prefill, %d x TP%d decode)",
                                       t.n_p, t.tp_p, t.n_d, t.tp_d));
  for (const auto& [dtype, what] :
       {std::pair{plan.weight_dtype, "weight dtype"}, std::pair{plan.kv_dtype, "KV dtype"}}) {
    if (StatusOr<engine::DType> planned = parse_dtype(engine::dtype_name(dtype)); !planned.ok())
      return absl::InvalidArgumentError(absl::StrCat(what, " ", planned.status().message()));
  }
  PD_RETURN_IF_ERROR(check_dtypes_on(plan.device, plan.weight_dtype, plan.kv_dtype, plan.gemm_precision));
  PD_RETURN_IF_ERROR(check_at_least(plan.max_running, 1, "router max running"));
  PD_RETURN_IF_ERROR(check_at_least(plan.max_waiting, 0, "router max waiting"));
  PD_RETURN_IF_ERROR(check_at_least(plan.prefill_max_batch_tokens, 1, "prefill max batch tokens"));
  PD_RETURN_IF_ERROR(check_at_least(plan.decode_max_batch_tokens, 1, "decode max batch tokens"));
  PD_RETURN_IF_ERROR(check_at_least(plan.decode_max_running, 1, "decode max running"));
  return absl::OkStatus();
}

// A comment line's text: a newline in free text (a workload given as a file's content, say)
// would end the comment and turn the rest into YAML or shell.
std::string one_line(absl::string_view text) { return absl::StrReplaceAll(text, {{"\r", " "}, {"\n", " "}}); }

// The provenance block, each line prefixed "# ".
std::vector<std::string> provenance(const DeployPlan& plan) {
  std::vector<std::string> lines = {
      absl::StrCat("tool: ", one_line(plan.provenance_tool)),
      absl::StrCat("profile sha256: ", one_line(plan.profile_sha256)),
      absl::StrCat("workload: ", one_line(plan.workload_text)),
      absl::StrCat("slo: ", one_line(plan.slo_text)),
      absl::StrFormat("predicted: goodput %.4g req/s, %.4g tok/s per rank", plan.predicted_goodput_rps,
                      plan.predicted_tok_per_s_per_rank)};
  if (plan.measured)
    lines.push_back(absl::StrFormat("measured: goodput %.4g req/s (prediction error %.3g%%), exact-token gate %s",
                                    plan.measured->goodput_rps, plan.measured->error_pct,
                                    plan.measured->gate_passed ? "passed" : "FAILED"));
  return lines;
}

// A YAML double-quoted scalar: names are written as given, whatever characters they hold.
std::string yaml_string(absl::string_view s) {
  return absl::StrCat("\"", absl::StrReplaceAll(s, {{"\\", "\\\\"}, {"\"", "\\\""}}), "\"");
}

// A bash single-quoted word.
std::string shell_word(absl::string_view s) { return absl::StrCat("'", absl::StrReplaceAll(s, {{"'", "'\\''"}}), "'"); }

void append_optional(std::string* out, absl::string_view indent_key, const std::optional<int>& v) {
  if (v) absl::StrAppend(out, indent_key, ": ", *v, "\n");
}

}  // namespace

StatusOr<std::string> values_yaml(const DeployPlan& plan) {
  PD_RETURN_IF_ERROR(check_plan(plan));
  const Topology& t = plan.topology;
  // An aggregated worker batches prefill chunks with decode steps: its one batch budget is
  // decode_max_batch_tokens, and no prefill worker exists to take a prefill budget.
  if (t.aggregated && plan.prefill_max_batch_tokens)
    return absl::FailedPreconditionError(
        "an aggregated plan has no prefill workers to take a prefill max batch tokens: set the aggregated workers' "
        "budget as the decode max batch tokens");
  if (plan.model_name.empty()) return absl::InvalidArgumentError("the chart needs a model name (model.name)");
  const Accelerator acc = accelerator(plan.device);

  std::string out = "# Helm values from `pdserve tune` for the pdserve chart (deploy/helm/pdserve). They set only\n"
                    "# what was planned: layer them over the preset of your cluster (storage, RDMA, tolerations):\n";
  absl::StrAppend(&out, "#   helm install pd deploy/helm/pdserve -f deploy/helm/pdserve/", preset_file(plan.device),
                  " -f values.yaml\n");
  for (const std::string& line : provenance(plan)) absl::StrAppend(&out, "# ", line, "\n");
  if (acc.gpu_resource.empty()) {
    absl::StrAppend(&out, "# The workers request no GPU (device ", device_name(plan.device), ").\n");
  } else if (t.aggregated) {
    absl::StrAppend(&out, "# Each pod requests one ", acc.gpu_resource, " per tensor-parallel rank: ", t.tp_d,
                    " per aggregated pod.\n");
  } else {
    absl::StrAppend(&out, "# Each pod requests one ", acc.gpu_resource, " per tensor-parallel rank: ", t.tp_p,
                    " per prefill pod, ", t.tp_d, " per decode pod.\n");
  }
  if (t.aggregated) absl::StrAppend(&out, "mode: aggregated\n");
  absl::StrAppend(&out, "accelerator:\n  vendor: ", acc.vendor, "\n  device: ", device_name(plan.device), "\n");
  absl::StrAppend(&out, "model:\n  name: ", yaml_string(plan.model_name), "\n");
  absl::StrAppend(&out, "engine:\n  weightDtype: ", engine::dtype_name(plan.weight_dtype), "\n");
  // The chart's default is f32, and an f32 plan's values stay as they were.
  if (plan.kv_dtype != engine::DType::kF32)
    absl::StrAppend(&out, "  kvDtype: ", engine::dtype_name(plan.kv_dtype), "\n");
  // Likewise exact.
  if (plan.gemm_precision != engine::GemmPrecision::kExact)
    absl::StrAppend(&out, "  gemmPrecision: ", engine::gemm_precision_name(plan.gemm_precision), "\n");
  // An empty `router:` would be null, which deletes the block: written only with a key in it.
  if (!t.aggregated || plan.max_running || plan.max_waiting) absl::StrAppend(&out, "router:\n");
  // Mode aggregated runs the router with --kv-mode=aggregated and refuses any other kv mode.
  if (!t.aggregated) absl::StrAppend(&out, "  kvMode: ", kv_mode_name(t.mode), "\n");
  // The P:D sizing assumes every prompt prefills on a prefill worker: no decode-local prefill.
  if (!t.aggregated) absl::StrAppend(&out, "  localPrefillTokens: 0\n");
  append_optional(&out, "  maxRunning", plan.max_running);
  append_optional(&out, "  maxWaiting", plan.max_waiting);
  if (t.aggregated) {
    absl::StrAppend(&out, "aggregated:\n  replicas: ", t.n_d, "\n  tensorParallel: ", t.tp_d, "\n");
    append_optional(&out, "  maxBatchTokens", plan.decode_max_batch_tokens);
    append_optional(&out, "  maxRunning", plan.decode_max_running);
    // The chart refuses in mode aggregated what only prefill/decode act on, and a preset sets it:
    // removed (null deletes a block) or turned off here, so the deployment is still the plan.
    absl::StrAppend(&out,
                    "# Not disaggregated: the preset's prefill and decode blocks, P:D ratio bounds and KV transfer\n"
                    "# (RDMA, UCX) are removed or off, as the chart's mode aggregated requires.\n"
                    "prefill: null\ndecode: null\nratio: null\n"
                    "rdma:\n  enabled: false\n  required: false\n"
                    "ucx:\n  preset: none\n");
    return out;
  }
  absl::StrAppend(&out, "prefill:\n  replicas: ", t.n_p, "\n  tensorParallel: ", t.tp_p, "\n");
  append_optional(&out, "  maxBatchTokens", plan.prefill_max_batch_tokens);
  absl::StrAppend(&out, "decode:\n  replicas: ", t.n_d, "\n  tensorParallel: ", t.tp_d, "\n");
  append_optional(&out, "  maxBatchTokens", plan.decode_max_batch_tokens);
  append_optional(&out, "  maxRunning", plan.decode_max_running);
  // The chart's bounds on prefill per decode replica (a preset's own may exclude the plan), set
  // just around the planned ratio: the render refuses replica counts that drift from it and the
  // PdservePrefillDecodeRatioDrift alert fires when the ready workers stay off it. 10⁻⁴ either
  // side, so that float rounding of n_p/n_d in the chart's check cannot refuse the plan itself.
  const int64_t ten_thousandths = int64_t{t.n_p} * 10000;
  absl::StrAppend(&out, "# Prefill per decode replica: ", t.n_p, "/", t.n_d, ".\nratio:\n");
  absl::StrAppend(&out, "  prefillPerDecodeMin: ", absl::StrFormat("%.4f", double((ten_thousandths - 1) / t.n_d) / 1e4), "\n");
  absl::StrAppend(&out, "  prefillPerDecodeMax: ", absl::StrFormat("%.4f", double(ten_thousandths / t.n_d + 1) / 1e4), "\n");
  return out;
}

StatusOr<std::string> up_script(const DeployPlan& plan, const std::string& pdserve_path) {
  PD_RETURN_IF_ERROR(check_plan(plan));
  if (plan.prefill_max_batch_tokens || plan.decode_max_batch_tokens || plan.decode_max_running)
    return absl::FailedPreconditionError(
        "pdserve up cannot set the workers' --max-batch-tokens or --max-running: deploy this plan with values.yaml, "
        "or leave those knobs at the workers' defaults");
  if (plan.model_path.empty()) return absl::InvalidArgumentError("up.sh needs a model path or name (--model)");
  const Topology& t = plan.topology;

  std::string out = "#!/usr/bin/env bash\n# The topology `pdserve tune` recommends, on this machine (`pdserve up`). Extra arguments\n"
                    "# are passed on to `pdserve up`, e.g. --port 8000.\n";
  for (const std::string& line : provenance(plan)) absl::StrAppend(&out, "# ", line, "\n");
  absl::StrAppend(&out, "set -euo pipefail\n");
  absl::StrAppend(&out, "exec ", shell_word(pdserve_path), " up --model ", shell_word(plan.model_path));
  if (t.aggregated) {
    absl::StrAppend(&out, " --aggregated ", t.n_d, " --tp ", t.tp_d);
  } else {
    absl::StrAppend(&out, " --prefill ", t.n_p, " --prefill-tp ", t.tp_p, " --decode ", t.n_d, " --decode-tp ", t.tp_d,
                    " --kv-mode ", kv_mode_name(t.mode), " --local-prefill-tokens 0");
  }
  absl::StrAppend(&out, " --device ", device_name(plan.device));
  // `pdserve up` passes --weight-dtype to GPU workers only (check_plan refused bf16 on cpu).
  if (plan.device != Device::kCpu) absl::StrAppend(&out, " --weight-dtype ", engine::dtype_name(plan.weight_dtype));
  if (plan.kv_dtype != engine::DType::kF32) absl::StrAppend(&out, " --kv-dtype ", engine::dtype_name(plan.kv_dtype));
  if (plan.gemm_precision != engine::GemmPrecision::kExact)
    absl::StrAppend(&out, " --gemm-precision ", engine::gemm_precision_name(plan.gemm_precision));
  if (plan.max_running) absl::StrAppend(&out, " --max-running ", *plan.max_running);
  if (plan.max_waiting) absl::StrAppend(&out, " --max-waiting ", *plan.max_waiting);
  absl::StrAppend(&out, " \"$@\"\n");
  return out;
}

}  // namespace pdserve::tune
