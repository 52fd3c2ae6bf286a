// values.yaml and up.sh from a recommendation: the exact bytes for a P/D CPU plan and an
// aggregated one (the chart's mode aggregated), the GPU resource each device gets, and the plans
// each target refuses rather than deploying something else. The chart's render of these values:
// deploy/helm/tests/tune.test.mjs.
#include "tune/deploy_values.h"

#include <gtest/gtest.h>

#include <functional>
#include <utility>

namespace pdserve::tune {
namespace {

DeployPlan cpu_pd_plan() {
  DeployPlan plan;
  plan.topology = {.aggregated = false, .n_p = 2, .tp_p = 1, .n_d = 1, .tp_d = 2, .mode = KvMode::kPull};
  plan.device = Device::kCpu;
  plan.model_name = "synthetic-100m";
  plan.model_path = "/work/models/synthetic-100m";
  plan.max_running = 48;
  plan.max_waiting = 6;
  plan.provenance_tool = "pdserve-tune/1 (git 15cb056)";
  plan.profile_sha256 = "ab12";
  plan.workload_text = "fixed:isl=1024,osl=16 poisson";
  plan.slo_text = "ttft=2000ms@p90,tpot=40ms@p90,attainment=0.90";
  plan.predicted_goodput_rps = 3.125;
  plan.predicted_tok_per_s_per_rank = 6210.25;
  plan.measured = MeasuredResult{.goodput_rps = 2.9, .error_pct = 7.76, .gate_passed = true};
  return plan;
}

DeployPlan gpu_plan(Device device) {
  DeployPlan plan = cpu_pd_plan();
  plan.device = device;
  plan.weight_dtype = engine::DType::kBF16;
  plan.topology = {.aggregated = false, .n_p = 2, .tp_p = 4, .n_d = 1, .tp_d = 4, .mode = KvMode::kPush};
  plan.model_name = "llama-3.1-8b-instruct";
  plan.prefill_max_batch_tokens = 8192;
  plan.decode_max_batch_tokens = 512;
  plan.decode_max_running = 256;
  return plan;
}

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

TEST(DeployValues, CpuPrefillDecodePlan) {
  auto values = values_yaml(cpu_pd_plan());
  ASSERT_TRUE(values.ok()) << values.status();
  EXPECT_EQ(*values,
            "# Helm values from `pdserve tune` for the pdserve chart (deploy/helm/pdserve). They set only\n"
            "# what was planned: layer them over the preset of your cluster (storage, RDMA, tolerations):\n"
            "#   helm install pd deploy/helm/pdserve -f deploy/helm/pdserve/values-cpu.yaml -f values.yaml\n"
            "# tool: pdserve-tune/1 (git 15cb056)\n"
            "# profile sha256: ab12\n"
            "# workload: fixed:isl=1024,osl=16 poisson\n"
            "# slo: ttft=2000ms@p90,tpot=40ms@p90,attainment=0.90\n"
            "# predicted: goodput 3.125 req/s, 6210 tok/s per rank\n"
            "# measured: goodput 2.9 req/s (prediction error 7.76%), exact-token gate passed\n"
            "# The workers request no GPU (device cpu).\n"
            "accelerator:\n"
            "  vendor: cpu\n"
            "  device: cpu\n"
            "model:\n"
            "  name: \"synthetic-100m\"\n"
            "engine:\n"
            "  weightDtype: f32\n"
            "router:\n"
            "  kvMode: pull\n"
            "  localPrefillTokens: 0\n"
            "  maxRunning: 48\n"
            "  maxWaiting: 6\n"
            "prefill:\n"
            "  replicas: 2\n"
            "  tensorParallel: 1\n"
            "decode:\n"
            "  replicas: 1\n"
            "  tensorParallel: 2\n"
            "# Prefill per decode replica: 2/1.\n"
            "ratio:\n"
            "  prefillPerDecodeMin: 1.9999\n"
            "  prefillPerDecodeMax: 2.0001\n");
  auto up = up_script(cpu_pd_plan(), "/opt/pdserve/bin/pdserve");
  ASSERT_TRUE(up.ok()) << up.status();
  EXPECT_EQ(*up,
            "#!/usr/bin/env bash\n"
            "# The topology `pdserve tune` recommends, on this machine (`pdserve up`). Extra arguments\n"
            "# are passed on to `pdserve up`, e.g. --port 8000.\n"
            "# tool: pdserve-tune/1 (git 15cb056)\n"
            "# profile sha256: ab12\n"
            "# workload: fixed:isl=1024,osl=16 poisson\n"
            "# slo: ttft=2000ms@p90,tpot=40ms@p90,attainment=0.90\n"
            "# predicted: goodput 3.125 req/s, 6210 tok/s per rank\n"
            "# measured: goodput 2.9 req/s (prediction error 7.76%), exact-token gate passed\n"
            "set -euo pipefail\n"
            "exec '/opt/pdserve/bin/pdserve' up --model '/work/models/synthetic-100m' --prefill 2 --prefill-tp 1 "
            "--decode 1 --decode-tp 2 --kv-mode pull --local-prefill-tokens 0 --device cpu --max-running 48 --max-waiting 6 "
            "\"$@\"\n");
}

DeployPlan cpu_aggregated_plan() {
  DeployPlan plan = cpu_pd_plan();
  plan.topology = {.aggregated = true, .n_p = 0, .tp_p = 0, .n_d = 3, .tp_d = 2};
  plan.measured.reset();
  plan.max_waiting.reset();
  return plan;
}

// "Do not disaggregate": the chart's mode aggregated, with what that mode refuses taken out.
TEST(DeployValues, AggregatedPlan) {
  DeployPlan plan = cpu_aggregated_plan();
  plan.decode_max_batch_tokens = 2048;
  plan.decode_max_running = 96;
  auto values = values_yaml(plan);
  ASSERT_TRUE(values.ok()) << values.status();
  EXPECT_EQ(*values,
            "# Helm values from `pdserve tune` for the pdserve chart (deploy/helm/pdserve). They set only\n"
            "# what was planned: layer them over the preset of your cluster (storage, RDMA, tolerations):\n"
            "#   helm install pd deploy/helm/pdserve -f deploy/helm/pdserve/values-cpu.yaml -f values.yaml\n"
            "# tool: pdserve-tune/1 (git 15cb056)\n"
            "# profile sha256: ab12\n"
            "# workload: fixed:isl=1024,osl=16 poisson\n"
            "# slo: ttft=2000ms@p90,tpot=40ms@p90,attainment=0.90\n"
            "# predicted: goodput 3.125 req/s, 6210 tok/s per rank\n"
            "# The workers request no GPU (device cpu).\n"
            "mode: aggregated\n"
            "accelerator:\n"
            "  vendor: cpu\n"
            "  device: cpu\n"
            "model:\n"
            "  name: \"synthetic-100m\"\n"
            "engine:\n"
            "  weightDtype: f32\n"
            "router:\n"
            "  maxRunning: 48\n"
            "aggregated:\n"
            "  replicas: 3\n"
            "  tensorParallel: 2\n"
            "  maxBatchTokens: 2048\n"
            "  maxRunning: 96\n"
            "# Not disaggregated: the preset's prefill and decode blocks, P:D ratio bounds and KV transfer\n"
            "# (RDMA, UCX) are removed or off, as the chart's mode aggregated requires.\n"
            "prefill: null\n"
            "decode: null\n"
            "ratio: null\n"
            "rdma:\n"
            "  enabled: false\n"
            "  required: false\n"
            "ucx:\n"
            "  preset: none\n");
  // up.sh runs the same plan on one machine (without the worker knobs, which it cannot pass).
  plan.decode_max_batch_tokens.reset();
  plan.decode_max_running.reset();
  auto up = up_script(plan, "pdserve");
  ASSERT_TRUE(up.ok()) << up.status();
  EXPECT_TRUE(has(*up, "# predicted: goodput 3.125 req/s, 6210 tok/s per rank\nset -euo pipefail\n")) << *up;
  EXPECT_TRUE(has(*up, "\nexec 'pdserve' up --model '/work/models/synthetic-100m' --aggregated 3 --tp 2 --device cpu "
                       "--max-running 48 \"$@\"\n"))
      << *up;
  EXPECT_FALSE(has(*up, "--kv-mode")) << *up;
}

// Without admission limits there is no router key to write: an empty `router:` would be YAML null,
// which deletes the chart's whole router block.
TEST(DeployValues, AggregatedPlanWithoutAdmissionLimitsWritesNoRouterBlock) {
  DeployPlan plan = cpu_aggregated_plan();
  plan.max_running.reset();
  auto values = values_yaml(plan);
  ASSERT_TRUE(values.ok()) << values.status();
  EXPECT_FALSE(has(*values, "router:")) << *values;
  EXPECT_TRUE(has(*values, "engine:\n  weightDtype: f32\naggregated:\n  replicas: 3\n  tensorParallel: 2\n# Not")) << *values;
}

TEST(DeployValues, AggregatedPlanRefusesAPrefillKnob) {
  DeployPlan plan = cpu_aggregated_plan();
  plan.prefill_max_batch_tokens = 8192;
  auto values = values_yaml(plan);
  EXPECT_EQ(values.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(has(std::string(values.status().message()), "no prefill workers")) << values.status();
}

TEST(DeployValues, AggregatedGpuPlanRequestsTpGpusPerAggregatedPod) {
  for (const auto& [device, resource] : {std::pair{Device::kHip, "amd.com/gpu"}, std::pair{Device::kCuda, "nvidia.com/gpu"}}) {
    DeployPlan plan = gpu_plan(device);
    plan.topology = {.aggregated = true, .n_d = 2, .tp_d = 8};
    plan.prefill_max_batch_tokens.reset();
    auto values = values_yaml(plan);
    ASSERT_TRUE(values.ok()) << values.status();
    EXPECT_TRUE(has(*values, std::string("# Each pod requests one ") + resource + " per tensor-parallel rank: 8 per aggregated pod.\n"))
        << *values;
    EXPECT_TRUE(has(*values, "aggregated:\n  replicas: 2\n  tensorParallel: 8\n  maxBatchTokens: 512\n  maxRunning: 256\n"))
        << *values;
    EXPECT_FALSE(has(*values, "kvMode")) << *values;
    EXPECT_FALSE(has(*values, "prefill:\n")) << *values;
  }
}

TEST(DeployValues, EachDeviceGetsItsGpuResource) {
  struct Case {
    Device device;
    const char* vendor;
    const char* resource;
    const char* other_resource;
    const char* preset;
  };
  for (const Case& c : {Case{Device::kHip, "amd", "amd.com/gpu", "nvidia", "values-amd-mi355x.yaml"},
                        Case{Device::kCuda, "nvidia", "nvidia.com/gpu", "amd.com", "values-nvidia-h200.yaml"}}) {
    SCOPED_TRACE(c.vendor);
    auto values = values_yaml(gpu_plan(c.device));
    ASSERT_TRUE(values.ok()) << values.status();
    EXPECT_TRUE(has(*values, std::string("accelerator:\n  vendor: ") + c.vendor + "\n  device: " +
                                 std::string(c.device == Device::kHip ? "hip" : "cuda") + "\n"))
        << *values;
    EXPECT_TRUE(has(*values, std::string("# Each pod requests one ") + c.resource +
                                 " per tensor-parallel rank: 4 per prefill pod, 4 per decode pod.\n"))
        << *values;
    EXPECT_FALSE(has(*values, c.other_resource)) << *values;
    EXPECT_TRUE(has(*values, std::string("-f deploy/helm/pdserve/") + c.preset + " -f values.yaml\n")) << *values;
    EXPECT_TRUE(has(*values, "engine:\n  weightDtype: bf16\n")) << *values;
    EXPECT_TRUE(has(*values, "prefill:\n  replicas: 2\n  tensorParallel: 4\n  maxBatchTokens: 8192\n"
                             "decode:\n  replicas: 1\n  tensorParallel: 4\n  maxBatchTokens: 512\n  maxRunning: 256\n"
                             "# Prefill per decode replica: 2/1.\n"))
        << *values;
    EXPECT_TRUE(has(*values, "router:\n  kvMode: push\n  localPrefillTokens: 0\n")) << *values;
  }
  // up.sh cannot set the worker knobs; without them it runs the GPU plan with its dtype.
  DeployPlan hip = gpu_plan(Device::kHip);
  hip.prefill_max_batch_tokens.reset();
  hip.decode_max_batch_tokens.reset();
  hip.decode_max_running.reset();
  auto up = up_script(hip, "pdserve");
  ASSERT_TRUE(up.ok()) << up.status();
  EXPECT_TRUE(has(*up, " --prefill 2 --prefill-tp 4 --decode 1 --decode-tp 4 --kv-mode push --local-prefill-tokens 0 "
                       "--device hip "
                       "--weight-dtype bf16 --max-running 48 --max-waiting 6 \"$@\"\n"))
      << *up;
  EXPECT_FALSE(has(*up, "--kv-dtype")) << *up;
  EXPECT_FALSE(has(*values_yaml(hip), "kvDtype")) << "an f32 KV cache is the chart's default";
  // A bf16 KV cache: the chart's engine.kvDtype, and up's --kv-dtype.
  hip.kv_dtype = engine::DType::kBF16;
  auto values = values_yaml(hip);
  ASSERT_TRUE(values.ok()) << values.status();
  EXPECT_TRUE(has(*values, "engine:\n  weightDtype: bf16\n  kvDtype: bf16\n")) << *values;
  up = up_script(hip, "pdserve");
  ASSERT_TRUE(up.ok()) << up.status();
  EXPECT_TRUE(has(*up, "--weight-dtype bf16 --kv-dtype bf16 --max-running 48")) << *up;
  EXPECT_FALSE(has(*up, "--gemm-precision")) << "exact is the workers' default";
  EXPECT_FALSE(has(*values, "gemmPrecision")) << "exact is the chart's default";
  // bf16 GEMMs: the chart's engine.gemmPrecision, and up's --gemm-precision.
  hip.gemm_precision = engine::GemmPrecision::kBf16;
  values = values_yaml(hip);
  ASSERT_TRUE(values.ok()) << values.status();
  EXPECT_TRUE(has(*values, "engine:\n  weightDtype: bf16\n  kvDtype: bf16\n  gemmPrecision: bf16\n")) << *values;
  up = up_script(hip, "pdserve");
  ASSERT_TRUE(up.ok()) << up.status();
  EXPECT_TRUE(has(*up, "--weight-dtype bf16 --kv-dtype bf16 --gemm-precision bf16 --max-running 48")) << *up;
}

// Just around n_p/n_d, whether the ratio is exact in decimal or not.
TEST(DeployValues, RatioBoundsBracketThePlan) {
  struct Case {
    int n_p, n_d;
    const char* bounds;
  };
  for (const Case& c : {Case{1, 3, "0.3333\n  prefillPerDecodeMax: 0.3334\n"}, Case{1, 2, "0.4999\n  prefillPerDecodeMax: 0.5001\n"},
                        Case{7, 1, "6.9999\n  prefillPerDecodeMax: 7.0001\n"}, Case{5, 3, "1.6666\n  prefillPerDecodeMax: 1.6667\n"}}) {
    DeployPlan plan = cpu_pd_plan();
    plan.topology.n_p = c.n_p;
    plan.topology.n_d = c.n_d;
    auto values = values_yaml(plan);
    ASSERT_TRUE(values.ok()) << values.status();
    EXPECT_TRUE(has(*values, std::string("ratio:\n  prefillPerDecodeMin: ") + c.bounds)) << *values;
  }
}

TEST(DeployValues, EmulatedRunsOnCpuNodes) {
  DeployPlan plan = cpu_pd_plan();
  plan.device = Device::kEmulated;
  auto values = values_yaml(plan);
  ASSERT_TRUE(values.ok()) << values.status();
  EXPECT_TRUE(has(*values, "accelerator:\n  vendor: cpu\n  device: emulated\n")) << *values;
  EXPECT_TRUE(has(*values, "# The workers request no GPU (device emulated).\n")) << *values;
}

TEST(DeployValues, NamesAndFreeTextCannotBreakOutOfTheirPlace) {
  DeployPlan plan = cpu_pd_plan();
  plan.model_name = "my \"model\"\\x";
  plan.model_path = "/models/it's";
  plan.workload_text = "trace:a.jsonl\nrouter: {kvMode: push}";
  auto values = values_yaml(plan);
  ASSERT_TRUE(values.ok()) << values.status();
  EXPECT_TRUE(has(*values, "model:\n  name: \"my \\\"model\\\"\\\\x\"\n")) << *values;
  EXPECT_TRUE(has(*values, "# workload: trace:a.jsonl router: {kvMode: push}\n")) << *values;
  auto up = up_script(plan, "/opt/pd serve/pdserve");
  ASSERT_TRUE(up.ok()) << up.status();
  EXPECT_TRUE(has(*up, "exec '/opt/pd serve/pdserve' up --model '/models/it'\\''s' ")) << *up;
  EXPECT_TRUE(has(*up, "# workload: trace:a.jsonl router: {kvMode: push}\n")) << *up;
}

TEST(DeployValues, RefusesPlansNoTargetCanRun) {
  struct Case {
    const char* what;
    std::function<void(DeployPlan&)> change;
    const char* message;
  };
  const Case cases[] = {
      {"no prefill", [](DeployPlan& p) { p.topology.n_p = 0; }, "at least one worker of TP >= 1 on each side"},
      {"zero decode TP", [](DeployPlan& p) { p.topology.tp_d = 0; }, "at least one worker of TP >= 1 on each side"},
      {"aggregated without workers", [](DeployPlan& p) { p.topology = {.aggregated = true, .n_d = 0}; },
       "an aggregated plan needs at least one worker"},
      {"f16 weights", [](DeployPlan& p) { p.weight_dtype = engine::DType::kF16; },
       "weight dtype must be f32 or bf16, not 'f16'"},
      {"bf16 on cpu", [](DeployPlan& p) { p.weight_dtype = engine::DType::kBF16; },
       "weight dtype bf16 on device cpu needs GPU workers"},
      {"f16 KV", [](DeployPlan& p) { p.kv_dtype = engine::DType::kF16; }, "KV dtype must be f32 or bf16, not 'f16'"},
      {"bf16 KV on cpu", [](DeployPlan& p) { p.kv_dtype = engine::DType::kBF16; },
       "KV dtype bf16 on device cpu needs GPU workers"},
      {"bf16 GEMMs with f32 weights", [](DeployPlan& p) { p.gemm_precision = engine::GemmPrecision::kBf16; },
       "GEMM precision bf16 multiplies bf16 activations by bf16 weights, not f32"},
      {"zero router max running", [](DeployPlan& p) { p.max_running = 0; }, "router max running must be at least 1"},
      {"negative router max waiting", [](DeployPlan& p) { p.max_waiting = -1; },
       "router max waiting must be at least 0"},
      {"zero prefill batch", [](DeployPlan& p) { p.prefill_max_batch_tokens = 0; },
       "prefill max batch tokens must be at least 1"},
      {"zero decode batch", [](DeployPlan& p) { p.decode_max_batch_tokens = 0; },
       "decode max batch tokens must be at least 1"},
      {"zero decode running", [](DeployPlan& p) { p.decode_max_running = 0; }, "decode max running must be at least 1"},
  };
  for (const Case& c : cases) {
    DeployPlan plan = cpu_pd_plan();
    c.change(plan);
    for (const auto& result : {values_yaml(plan), up_script(plan, "pdserve")}) {
      EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument) << c.what;
      EXPECT_TRUE(has(std::string(result.status().message()), c.message)) << c.what << ": " << result.status();
    }
  }
  // A name each target needs.
  DeployPlan unnamed = cpu_pd_plan();
  unnamed.model_name.clear();
  EXPECT_EQ(values_yaml(unnamed).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(up_script(unnamed, "pdserve").ok());
  unnamed = cpu_pd_plan();
  unnamed.model_path.clear();
  EXPECT_EQ(up_script(unnamed, "pdserve").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(values_yaml(unnamed).ok());
}

TEST(DeployValues, UpRefusesWorkerKnobsItCannotPass) {
  for (const auto& set : std::vector<std::function<void(DeployPlan&)>>{
           [](DeployPlan& p) { p.prefill_max_batch_tokens = 8192; },
           [](DeployPlan& p) { p.decode_max_batch_tokens = 512; },
           [](DeployPlan& p) { p.decode_max_running = 64; }}) {
    DeployPlan plan = cpu_pd_plan();
    set(plan);
    EXPECT_EQ(up_script(plan, "pdserve").status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_TRUE(values_yaml(plan).ok());  // The chart passes them to the workers.
  }
}

}  // namespace
}  // namespace pdserve::tune
