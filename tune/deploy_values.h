// The tuner's deployable outputs (docs/tune.md, "Outputs"): the recommended deployment as Helm
// values for this repository's chart (deploy/helm/pdserve) and as an `up.sh` that starts the same
// topology on one machine with `pdserve up`. Both are pure functions of a DeployPlan and write the
// same bytes for the same plan. Every key and flag they emit is one the chart or `pdserve up`
// acts on: what a target cannot express is refused (FailedPrecondition), never dropped, so the
// deployment is always the one that was planned.
#pragma once

#include <optional>
#include <string>

#include "common/status.h"
#include "tune/types.h"

namespace pdserve::tune {

// What the tuner measured for the plan on the live cluster (validation and the exact-token gate).
struct MeasuredResult {
  double goodput_rps = 0;
  double error_pct = 0;  // (predicted − measured) / measured goodput, in percent.
  bool gate_passed = false;
};

// The recommendation, in deployment terms. Unset optionals leave the program's own default
// (which is what the profile measured).
struct DeployPlan {
  Topology topology;
  Device device = Device::kCpu;
  std::string model_name;  // The chart's model.name: a directory inside the model volume.
  std::string model_path;  // `pdserve up --model`: a path or a registered name on this machine.
  engine::DType weight_dtype = engine::DType::kF32;  // GPU GEMM weights (f32 | bf16); CPU computes in f32.
  engine::DType kv_dtype = engine::DType::kF32;      // The KV cache's elements (f32 | bf16 on GPU workers).
  engine::GemmPrecision gemm_precision = engine::GemmPrecision::kExact;  // GPU GEMM activations (exact | bf16).
  // Router admission: requests out at the workers at once, and queued before refusing.
  std::optional<int> max_running, max_waiting;
  // Worker engine knobs.
  std::optional<int> prefill_max_batch_tokens, decode_max_batch_tokens, decode_max_running;
  // Provenance, written as comments (the chart's schema refuses unknown keys).
  std::string provenance_tool;  // E.g. "pdserve-tune/1 (git 15cb056)".
  std::string profile_sha256;
  std::string workload_text;  // The --workload/--arrival as given.
  std::string slo_text;
  double predicted_goodput_rps = 0, predicted_tok_per_s_per_rank = 0;
  std::optional<MeasuredResult> measured;
};

// Values to layer over the chart preset of the target cluster (storage, RDMA, tolerations):
// `helm install pd deploy/helm/pdserve -f <preset> -f values.yaml`. Sets the accelerator (and so
// the GPU resource: nvidia.com/gpu for cuda, amd.com/gpu for hip, none for cpu/emulated), model
// name and weight dtype, the router's admission limits, and each role's replicas, tensor
// parallelism and engine knobs. A prefill/decode plan sets the router's kv mode, the prefill and
// decode blocks and ratio bounds around its P:D ratio. An aggregated plan ("do not disaggregate")
// sets the chart's mode aggregated and its aggregated block (n_d x TP tp_d; decode_max_batch_tokens
// and decode_max_running are the aggregated workers' knobs), and removes or turns off what that mode
// refuses: the preset's prefill/decode blocks, ratio bounds, RDMA and UCX. FailedPrecondition for
// an aggregated plan with a prefill knob (it has no prefill worker); InvalidArgument for a plan no
// deployment can run.
StatusOr<std::string> values_yaml(const DeployPlan& plan);

// A bash script running `pdserve up` (at `pdserve_path`) with the plan's topology, device, dtype
// and router admission limits; extra arguments are passed on (e.g. --port). FailedPrecondition
// when the plan sets a worker engine knob, which `pdserve up` cannot pass to its workers.
StatusOr<std::string> up_script(const DeployPlan& plan, const std::string& pdserve_path);

}  // namespace pdserve::tune
