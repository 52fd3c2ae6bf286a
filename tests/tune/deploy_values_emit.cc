// Writes the values.yaml deploy_values emits for a few prefill/decode plans and aggregated ones
// ("do not disaggregate"), each with the plan beside it, for the chart's render test
// (deploy/helm/tests/tune.test.mjs):
//   tune_deploy_values_emit DIR  ->  DIR/<case>.values.yaml, DIR/<case>.plan.json
// The test renders each over its chart preset and checks the objects against the plan.
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"
#include "tune/deploy_values.h"
#include "tune/profile_io.h"

namespace {

using pdserve::tune::DeployPlan;
using pdserve::tune::Device;
using pdserve::tune::KvMode;

struct Case {
  std::string name, preset;  // The chart preset (values-<preset>.yaml) the values are layered on.
  DeployPlan plan;
};

std::vector<Case> cases() {
  DeployPlan hip;
  hip.topology = {.aggregated = false, .n_p = 3, .tp_p = 2, .n_d = 1, .tp_d = 4, .mode = KvMode::kPull};
  hip.device = Device::kHip;
  hip.weight_dtype = pdserve::engine::DType::kBF16;
  hip.model_name = "llama-3.1-8b-instruct";
  hip.max_running = 192;
  hip.max_waiting = 12;
  hip.prefill_max_batch_tokens = 8192;
  hip.decode_max_batch_tokens = 512;
  hip.decode_max_running = 192;
  hip.provenance_tool = "tune_deploy_values_emit";
  DeployPlan cuda = hip;
  cuda.device = Device::kCuda;
  cuda.kv_dtype = pdserve::engine::DType::kBF16;                // The other plans keep the chart's default, f32,
  cuda.gemm_precision = pdserve::engine::GemmPrecision::kBf16;  // and exact.
  cuda.topology = {.aggregated = false, .n_p = 1, .tp_p = 1, .n_d = 2, .tp_d = 2, .mode = KvMode::kPush};
  DeployPlan cpu;
  cpu.topology = {.aggregated = false, .n_p = 1, .tp_p = 1, .n_d = 2, .tp_d = 1, .mode = KvMode::kPush};
  cpu.device = Device::kCpu;
  cpu.model_name = "stories260K";
  cpu.max_running = 8;
  cpu.max_waiting = 4;
  cpu.provenance_tool = "tune_deploy_values_emit";
  // Aggregated: the decode knobs are the aggregated workers' (no prefill knob: refused).
  DeployPlan hip_aggregated = hip;
  hip_aggregated.topology = {.aggregated = true, .n_d = 3, .tp_d = 2};
  hip_aggregated.prefill_max_batch_tokens.reset();
  DeployPlan cuda_aggregated = hip_aggregated;
  cuda_aggregated.device = Device::kCuda;
  cuda_aggregated.topology = {.aggregated = true, .n_d = 1, .tp_d = 8};
  DeployPlan cpu_aggregated = cpu;
  cpu_aggregated.topology = {.aggregated = true, .n_d = 2, .tp_d = 1};
  cpu_aggregated.max_waiting.reset();
  return {{"hip-pd", "amd-mi355x", hip},
          {"cuda-pd", "nvidia-h200", cuda},
          {"cpu-pd", "cpu", cpu},
          {"hip-aggregated", "amd-mi355x", hip_aggregated},
          {"cuda-aggregated", "nvidia-h200", cuda_aggregated},
          {"cpu-aggregated", "cpu", cpu_aggregated}};
}

nlohmann::json optional_json(const std::optional<int>& v) { return v ? nlohmann::json(*v) : nlohmann::json(nullptr); }

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: tune_deploy_values_emit DIR\n";
    return 2;
  }
  const std::string dir = argv[1];
  for (const Case& c : cases()) {
    auto values = pdserve::tune::values_yaml(c.plan);
    if (!values.ok()) {
      std::cerr << c.name << ": " << values.status() << "\n";
      return 1;
    }
    const auto& t = c.plan.topology;
    // The workers the plan runs, by the chart's role name; the router's kv mode follows.
    const nlohmann::json decode_side = {{"replicas", t.n_d},
                                        {"tp", t.tp_d},
                                        {"maxBatchTokens", optional_json(c.plan.decode_max_batch_tokens)},
                                        {"maxRunning", optional_json(c.plan.decode_max_running)}};
    nlohmann::json workers;
    if (t.aggregated) {
      workers["aggregated"] = decode_side;
    } else {
      workers["prefill"] = {{"replicas", t.n_p}, {"tp", t.tp_p}, {"maxBatchTokens", optional_json(c.plan.prefill_max_batch_tokens)},
                            {"maxRunning", nullptr}};
      workers["decode"] = decode_side;
    }
    const nlohmann::json plan = {
        {"preset", c.preset},
        {"device", std::string(pdserve::tune::device_name(c.plan.device))},
        {"weightDtype", pdserve::engine::dtype_name(c.plan.weight_dtype)},
        {"kvDtype", pdserve::engine::dtype_name(c.plan.kv_dtype)},
        {"gemmPrecision", pdserve::engine::gemm_precision_name(c.plan.gemm_precision)},
        {"model", c.plan.model_name},
        {"kvMode", t.aggregated ? std::string("aggregated") : std::string(pdserve::tune::kv_mode_name(t.mode))},
        {"workers", workers},
        {"router",
         {{"maxRunning", optional_json(c.plan.max_running)}, {"maxWaiting", optional_json(c.plan.max_waiting)}}}};
    std::ofstream(dir + "/" + c.name + ".values.yaml") << *values;
    std::ofstream(dir + "/" + c.name + ".plan.json") << plan.dump(2) << "\n";
  }
  return 0;
}
