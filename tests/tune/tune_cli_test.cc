// `pdserve tune` as an operator runs it: an offline plan from an imported (synthetic) GPU
// profile, byte-for-byte deterministic, emitting the GPU resource its device names; and the
// whole pipeline on the bundled stories260K model on CPU ranks — profile, plan, gate,
// validate, report — leaving every output it promises.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "tests/command_output.h"

namespace pdserve {
namespace {

namespace fs = std::filesystem;

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

fs::path source_dir() { return fs::path(std::getenv("PDSERVE_SOURCE_DIR") ? std::getenv("PDSERVE_SOURCE_DIR") : "."); }

struct TempDir {
  fs::path path = fs::temp_directory_path() / ("pdserve_tune_" + std::to_string(getpid()) + "_" + std::to_string(rand()));
  TempDir() { fs::create_directories(path); }
  ~TempDir() { fs::remove_all(path); }
};

testing::CommandOutput tune(const std::string& args) {
  return testing::run_command(std::string(PDSERVE_BINARY_DIR) + "/tools/pdserve tune " + args + " 2>&1");
}

std::string offline_args(const std::string& profile, const std::string& device, const fs::path& out) {
  // The fixtures were recorded with bf16 weights and an f32 KV cache.
  return "--import-profile " + (source_dir() / "tests/tune/fixtures" / profile).string() + " --device " + device +
         " --weight-dtype bf16 --model llama-8b --ranks 8 --tp 1,2,4,8 --kv-mode auto --input-len 8192 --output-len "
         "1024 "
         "--slo-ttft-ms 2000 --slo-tpot-ms 40 --simulate-top 4 --out " +
         out.string();
}

TEST(TuneCli, AnOfflinePlanFromAHipProfileEmitsAmdGpusAndIsDeterministic) {
  TempDir a, b;
  for (const TempDir* d : {&a, &b}) {
    testing::CommandOutput plan = tune("plan " + offline_args("profile_hip_mi355x.json", "hip", d->path));
    ASSERT_EQ(plan.exit_code, 0) << plan.out;
    testing::CommandOutput report = tune("report " + offline_args("profile_hip_mi355x.json", "hip", d->path));
    // Not validated: the report's exit code is the plan's.
    ASSERT_EQ(report.exit_code, 0) << report.out;
  }
  const std::string values = read_file(a.path / "values.yaml");
  EXPECT_NE(values.find("amd.com/gpu"), std::string::npos) << values;
  EXPECT_EQ(values.find("nvidia.com/gpu"), std::string::npos) << values;
  EXPECT_NE(values.find("engine:\n  weightDtype: bf16\n"), std::string::npos) << values;
  EXPECT_NE(read_file(a.path / "up.sh").find("--weight-dtype bf16 --max-running"), std::string::npos);
  const nlohmann::json r = nlohmann::json::parse(read_file(a.path / "report.json"));
  EXPECT_EQ(r["schema"], "pdserve.tune/v1");
  EXPECT_GE(r["candidates"].size(), 20u);
  EXPECT_EQ(r["recommendation"]["gate"], "not-run");
  EXPECT_TRUE(r["recommendation"]["measured"].is_null());
  // Same inputs, same bytes.
  for (const char* f : {"report.json", "report.md", "plan.json", "candidates.csv", "values.yaml", "up.sh",
                        "plots/pareto.svg", "plots/ratio_heatmap.svg", "plots/profile_prefill.svg"})
    EXPECT_EQ(read_file(a.path / f), read_file(b.path / f)) << f;
}

TEST(TuneCli, AnOfflinePlanFromACudaProfileEmitsNvidiaGpus) {
  TempDir d;
  ASSERT_EQ(tune("plan " + offline_args("profile_cuda_h200.json", "cuda", d.path)).exit_code, 0);
  ASSERT_EQ(tune("report " + offline_args("profile_cuda_h200.json", "cuda", d.path)).exit_code, 0);
  const std::string values = read_file(d.path / "values.yaml");
  EXPECT_NE(values.find("nvidia.com/gpu"), std::string::npos) << values;
  EXPECT_EQ(values.find("amd.com/gpu"), std::string::npos);
}

TEST(TuneCli, RefusesWhatItCannotHonour) {
  TempDir d;
  // A profile of one device planned for another.
  testing::CommandOutput r = tune("plan " + offline_args("profile_hip_mi355x.json", "cuda", d.path));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.out.find("profile was recorded on hip"), std::string::npos) << r.out;
  // ... or with other dtypes than the plan's.
  for (const std::string& dtypes : {"--weight-dtype f32", "--weight-dtype bf16 --kv-dtype bf16"}) {
    std::string args = offline_args("profile_hip_mi355x.json", "hip", d.path);
    args.replace(args.find("--weight-dtype bf16"), 19, dtypes);
    r = tune("plan " + args);
    EXPECT_EQ(r.exit_code, 1) << dtypes;
    EXPECT_NE(r.out.find("the profile was recorded with bf16 weights and an f32 KV cache"), std::string::npos) << r.out;
  }
  // ... or GEMMs of another precision; and a report, which writes values.yaml and up.sh, refuses
  // flags that are not the profile's even after a plan that was.
  const std::string hip = offline_args("profile_hip_mi355x.json", "hip", d.path);
  r = tune("plan " + hip + " --gemm-precision bf16");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.out.find("(exact GEMMs), not --weight-dtype bf16 --kv-dtype f32 --gemm-precision bf16"),
            std::string::npos)
      << r.out;
  ASSERT_EQ(tune("plan " + hip).exit_code, 0);
  r = tune("report " + hip + " --gemm-precision bf16");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.out.find("error: report: the profile was recorded with"), std::string::npos) << r.out;
  // bf16 on CPU workers, which compute and keep their KV cache in f32.
  r = tune("--ranks 2 --input-len 64 --output-len 8 --slo-ttft-ms 100 --slo-tpot-ms 10 --kv-dtype bf16 --out " +
           d.path.string());
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.out.find("KV dtype bf16 on device cpu needs GPU workers"), std::string::npos) << r.out;
  r = tune("--ranks 2 --input-len 64 --output-len 8 --slo-ttft-ms 100 --slo-tpot-ms 10 --workload trace:x.jsonl --out " +
           d.path.string());
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.out.find("trace"), std::string::npos) << r.out;
  r = tune("--ranks 2 --input-len 64 --output-len 8 --slo-ttft-ms 100 --slo-tpot-ms 10 --rate 5 --out " + d.path.string());
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.out.find("--rate is the target of --objective min-ranks"), std::string::npos) << r.out;
  r = tune("--input-len 64 --output-len 8 --slo-ttft-ms 100 --slo-tpot-ms 10 --out " + d.path.string());
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.out.find("--ranks"), std::string::npos) << r.out;
}

TEST(TuneCli, TheWholePipelineOnStories260KOnTwoCpuRanks) {
  TempDir d;
  testing::CommandOutput r = tune(
      "--model stories260K --device cpu --ranks 2 --tp 1,2 --input-len 64 --output-len 16 --slo-ttft-ms 1000 "
      "--slo-tpot-ms 50 --validate-top 2 --point-duration 2 --budget-s 400 --out " + d.path.string());
  // 0, or 4 when this shared machine's noise put the measured goodput outside the bound; the
  // gate and every output are checked either way.
  ASSERT_TRUE(r.exit_code == 0 || r.exit_code == 4) << r.exit_code << "\n" << r.out;
  const nlohmann::json report = nlohmann::json::parse(read_file(d.path / "report.json"));
  EXPECT_EQ(report["recommendation"]["gate"], "pass") << report.dump(2);
  EXPECT_FALSE(report["recommendation"]["measured"].is_null());
  EXPECT_GE(report["candidates"].size(), 3u);
  int measured = 0;
  for (const auto& v : report["validation"])
    if (v["measured_goodput_rps"].is_number()) ++measured;
  EXPECT_GE(measured, 2);
  for (const char* f : {"profile.json", "plan.json", "validation.json", "report.md", "candidates.csv", "validation.csv",
                        "up.sh", "plots/pareto.svg", "plots/ttft_vs_rate.svg", "plots/ratio_heatmap.svg",
                        "plots/parity.svg", "plots/ttft_breakdown.svg", "plots/profile_prefill.svg",
                        "plots/profile_decode.svg", "plots/profile_kv.svg"})
    EXPECT_TRUE(fs::exists(d.path / f)) << f;
  // Each SVG is one well-formed document (the writer's own tests check the structure).
  for (const char* f : {"plots/pareto.svg", "plots/parity.svg"}) {
    const std::string svg = read_file(d.path / f);
    ASSERT_EQ(svg.rfind("<?xml", 0), 0u) << f;
    EXPECT_EQ(svg.compare(svg.find('<', svg.find("?>")), 4, "<svg"), 0) << f;  // The root element.
    EXPECT_EQ(svg.substr(svg.size() - 7), "</svg>\n") << f;
    EXPECT_EQ(svg.find("nan"), std::string::npos) << f;
  }
}

}  // namespace
}  // namespace pdserve
