// The pdserve binary as a user runs it: the published output through --json, and every kind of
// bad input ends with a clear message and a non-zero exit, never a crash.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "tests/command_output.h"
#include "tests/engine/test_model.h"

namespace pdserve {
namespace {

namespace fs = std::filesystem;
using testing::CommandOutput;
using testing::run_command;
using testing::stories_dir;

struct CliRun {
  int exit_code = -1;
  std::string out, err;
};

std::string quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

// Runs pdserve with `args` (and `env` assignments), capturing stdout and stderr.
CliRun pdserve(const std::vector<std::string>& args, const std::string& env = "") {
  static int counter = 0;
  const fs::path err = fs::temp_directory_path() / ("pdserve_cli_err_" + std::to_string(getpid()) + "_" + std::to_string(counter++));
  std::string cmd = env + " " + std::string(PDSERVE_BINARY_DIR) + "/tools/pdserve";
  for (const std::string& a : args) cmd += " " + quote(a);
  cmd += " 2>" + err.string();
  const CommandOutput output = run_command(cmd);
  CliRun run;
  run.exit_code = output.exit_code;
  run.out = output.out;
  std::ifstream e(err);
  std::stringstream ss;
  ss << e.rdbuf();
  run.err = ss.str();
  fs::remove(err);
  return run;
}

class TempDir {
 public:
  TempDir() : path_(fs::temp_directory_path() / ("pdserve_cli_" + std::to_string(getpid()) + "_" + std::to_string(rand()))) {
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

const std::string kModel = stories_dir() + "/stories260K.bin";

// A failed run: non-zero exit, no crash (signals show as 128+), message mentions `what`.
void expect_clean_failure(const CliRun& r, const std::string& what) {
  EXPECT_NE(r.exit_code, 0);
  EXPECT_LT(r.exit_code, 128) << "crashed: " << r.err;
  EXPECT_NE(r.err.find(what), std::string::npos) << "stderr: " << r.err;
}

TEST(Cli, JsonGreedyFromBosIsThePublishedText) {
  CliRun r = pdserve({"generate", "--model", kModel, "--prompt", "", "--max-tokens", "256", "--json", "--tp", "2"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  std::ifstream in(stories_dir() + "/greedy_from_bos.txt");
  std::stringstream ss;
  ss << in.rdbuf();
  std::string expected = ss.str();
  while (!expected.empty() && expected.back() == '\n') expected.pop_back();
  std::string text = j["text"];
  while (!text.empty() && text.back() == '\n') text.pop_back();
  EXPECT_EQ(text, expected);
  EXPECT_EQ(j["prompt_token_ids"], nlohmann::json::array({1}));
  EXPECT_EQ(j["finish_reason"], "length");
  EXPECT_EQ(j["token_ids"].size(), 256u);
}

// --cpu-threads: the published text on two threads a rank; refused where no rank computes on
// the CPU (in process and by `up`), out of range, and through a router.
TEST(Cli, CpuThreadsChangeNoTokenAndAreTheCpuBackendsAlone) {
  CliRun r =
      pdserve({"generate", "--model", kModel, "--prompt", "", "--max-tokens", "256", "--json", "--cpu-threads", "2"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::ifstream in(stories_dir() + "/greedy_from_bos.txt");
  std::stringstream ss;
  ss << in.rdbuf();
  std::string expected = ss.str(), text = nlohmann::json::parse(r.out)["text"];
  while (!expected.empty() && expected.back() == '\n') expected.pop_back();
  while (!text.empty() && text.back() == '\n') text.pop_back();
  EXPECT_EQ(text, expected);
  expect_clean_failure(
      pdserve({"generate", "--model", kModel, "--device", "emulated", "--cpu-threads", "2", "--max-tokens", "3"}),
      "--cpu-threads 2 is for the cpu backend");
  expect_clean_failure(pdserve({"generate", "--model", kModel, "--cpu-threads", "0"}), "--cpu-threads");
  expect_clean_failure(pdserve({"up", "--model", kModel, "--prefill", "1", "--decode", "1", "--device", "emulated",
                                "--cpu-threads", "2"}),
                       "--cpu-threads is for CPU workers");
  expect_clean_failure(pdserve({"generate", "--router", "127.0.0.1:1", "--cpu-threads", "2", "--prompt", "x"}),
                       "--cpu-threads sets up the in-process engine");
  // More threads than any host's cores: `up` says so before it starts anything (here a missing
  // certificate then stops it).
  const CliRun crowded = pdserve({"up", "--model", kModel, "--aggregated", "64", "--tp", "8", "--cpu-threads", "1024",
                                  "--tls-cert", "/nonexistent", "--tls-key", "/nonexistent"});
  expect_clean_failure(crowded, "--tls-cert: cannot read /nonexistent");
  EXPECT_NE(crowded.err.find("warning: the CPU workers compute with 524288 threads"), std::string::npos) << crowded.err;
}

TEST(Cli, ModelByNameThroughSearchPath) {
  CliRun r = pdserve({"generate", "--model", "stories260K", "--prompt", "Lily", "--max-tokens", "5", "--json"},
                  "PDSERVE_MODEL_PATH=" + quote(stories_dir() + "/.."));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out)["token_ids"].size(), 5u);
}

TEST(Cli, MissingModelFile) {
  expect_clean_failure(pdserve({"generate", "--model", "/nonexistent/model.bin"}), "/nonexistent/model.bin");
}

TEST(Cli, TruncatedAndCorruptModelFiles) {
  TempDir dir;
  fs::copy(stories_dir() + "/tok512.bin", dir.path() / "tok512.bin");
  {
    std::ifstream in(kModel, std::ios::binary);
    std::vector<char> bytes((std::istreambuf_iterator<char>(in)), {});
    std::ofstream(dir.path() / "truncated.bin", std::ios::binary).write(bytes.data(), bytes.size() / 2);
    bytes[8] = 0x7f;  // hidden_dim becomes huge.
    bytes[11] = 0x7f;
    std::ofstream(dir.path() / "corrupt.bin", std::ios::binary).write(bytes.data(), bytes.size());
    std::ofstream(dir.path() / "tiny.bin", std::ios::binary).write(bytes.data(), 10);
  }
  for (const char* f : {"truncated.bin", "corrupt.bin", "tiny.bin"})
    expect_clean_failure(pdserve({"generate", "--model", (dir.path() / f).string()}), f);
}

// A GPU backend asked for where this build has none, or this machine has no device, is refused
// with the reason (never a crash); an unknown one is a flag error.
TEST(Cli, DeviceThatIsNotThereIsAClearError) {
  if (fs::exists("/dev/nvidia0") || fs::exists("/dev/kfd")) GTEST_SKIP() << "this machine has a GPU";
  for (const char* device : {"cuda", "hip"}) {
    const auto r = pdserve({"generate", "--model", kModel, "--device", device, "--max-tokens", "3"});
    expect_clean_failure(r, device);
  }
  const auto r = pdserve({"generate", "--model", kModel, "--device", "tpu"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("--device"), std::string::npos) << r.err;
}

// A bf16 KV cache needs a GPU backend: refused in process on the CPU, by `up` before any worker
// starts when one would run on the CPU; and an engine option is refused with --router, whose
// workers decide it.
TEST(Cli, Bf16KvOnTheCpuAndEngineOptionsThroughARouterAreRefused) {
  expect_clean_failure(pdserve({"generate", "--model", kModel, "--kv-dtype", "bf16", "--max-tokens", "3"}),
                       "cannot keep its KV cache in bf16");
  expect_clean_failure(pdserve({"up", "--model", kModel, "--prefill", "1", "--decode", "1", "--kv-dtype", "bf16"}),
                       "--kv-dtype bf16 needs GPU workers");
  expect_clean_failure(pdserve({"up", "--model", kModel, "--prefill", "1", "--decode", "1", "--prefill-device",
                                "emulated", "--kv-dtype", "bf16"}),
                       "--kv-dtype bf16 needs GPU workers");
  expect_clean_failure(pdserve({"generate", "--router", "127.0.0.1:1", "--kv-dtype", "bf16", "--prompt", "x"}),
                       "--kv-dtype sets up the in-process engine");
  expect_clean_failure(pdserve({"generate", "--router", "127.0.0.1:1", "--device", "emulated", "--prompt", "x"}),
                       "--device sets up the in-process engine");
}

// bf16 GEMM precision multiplies bf16 by bf16: without --weight-dtype bf16 refused in process and
// by `up` before any worker starts; with it, on the CPU, refused as bf16 weights are, and by `up`
// when a worker would run on the CPU; through a router refused as every engine option is.
TEST(Cli, Bf16GemmPrecisionWithoutBf16WeightsOrOnTheCpuIsRefused) {
  expect_clean_failure(pdserve({"generate", "--model", kModel, "--gemm-precision", "bf16", "--max-tokens", "3"}),
                       "it takes --weight-dtype bf16, not f32");
  expect_clean_failure(pdserve({"generate", "--model", kModel, "--weight-dtype", "bf16", "--gemm-precision", "bf16",
                                "--max-tokens", "3"}),
                       "computes with f32 weights, not bf16");
  expect_clean_failure(pdserve({"up", "--model", kModel, "--prefill", "1", "--decode", "1", "--device", "emulated",
                                "--gemm-precision", "bf16"}),
                       "--gemm-precision bf16 multiplies bf16 activations by bf16 weights");
  expect_clean_failure(pdserve({"up", "--model", kModel, "--prefill", "1", "--decode", "1", "--prefill-device",
                                "emulated", "--weight-dtype", "bf16", "--gemm-precision", "bf16"}),
                       "--gemm-precision bf16 needs GPU workers: CPU workers multiply f32 activations");
  expect_clean_failure(pdserve({"generate", "--router", "127.0.0.1:1", "--gemm-precision", "bf16", "--prompt", "x"}),
                       "--gemm-precision sets up the in-process engine");
  const auto r = pdserve({"generate", "--model", kModel, "--gemm-precision", "fp8"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("--gemm-precision"), std::string::npos) << r.err;
}

// --decode-graphs records GPU steps at TP 1: refused in process on the CPU, by `up` with decode
// workers on the CPU or at TP 2 before any worker starts, and through a router as every engine
// option is.
TEST(Cli, DecodeGraphsOnTheCpuOrAtTp2AreRefused) {
  expect_clean_failure(pdserve({"generate", "--model", kModel, "--decode-graphs", "--max-tokens", "3"}),
                       "--decode-graphs records GPU steps; the cpu");
  for (const std::vector<std::string>& workers :
       {std::vector<std::string>{"--prefill-device", "emulated"}, {"--device", "emulated", "--decode-tp", "2"}}) {
    std::vector<std::string> args = {"up", "--model", kModel, "--prefill", "1", "--decode", "1", "--decode-graphs"};
    args.insert(args.end(), workers.begin(), workers.end());
    expect_clean_failure(pdserve(args), "--decode-graphs records GPU steps at TP 1");
  }
  expect_clean_failure(pdserve({"generate", "--router", "127.0.0.1:1", "--decode-graphs", "--prompt", "x"}),
                       "--decode-graphs sets up the in-process engine");
}

// --async-scheduling reads the sampled tokens where the backend left them: refused in process on
// the CPU (which samples on the host), by `up` with decode workers on the CPU, and through a
// router.
TEST(Cli, AsyncSchedulingOnTheCpuIsRefused) {
  expect_clean_failure(pdserve({"generate", "--model", kModel, "--async-scheduling", "--max-tokens", "3"}),
                       "--async-scheduling samples on the backend");
  expect_clean_failure(pdserve({"up", "--model", kModel, "--prefill", "1", "--decode", "1", "--async-scheduling",
                                "--prefill-device", "emulated"}),
                       "--async-scheduling reads sampled tokens on a GPU: it needs decode workers on a GPU");
  expect_clean_failure(pdserve({"generate", "--router", "127.0.0.1:1", "--async-scheduling", "--prompt", "x"}),
                       "--async-scheduling sets up the in-process engine");
}

TEST(Cli, CorruptTokenizer) {
  TempDir dir;
  fs::copy(kModel, dir.path() / "stories260K.bin");
  std::ofstream(dir.path() / "tok512.bin", std::ios::binary) << "garbage";
  expect_clean_failure(pdserve({"generate", "--model", (dir.path() / "stories260K.bin").string()}), "tok512.bin");
}

TEST(Cli, TpThatDoesNotDivide) {
  expect_clean_failure(pdserve({"generate", "--model", kModel, "--tp", "3"}), "TP 3");
}

TEST(Cli, PromptLongerThanContext) {
  std::string prompt;
  for (int i = 0; i < 300; ++i) prompt += "Once upon a time ";
  expect_clean_failure(pdserve({"generate", "--model", kModel, "--prompt", prompt}), "context");
}

TEST(Cli, NonPositiveMaxTokens) {
  expect_clean_failure(pdserve({"generate", "--model", kModel, "--max-tokens", "0"}), "max_tokens");
  expect_clean_failure(pdserve({"generate", "--model", kModel, "--max-tokens", "-3"}), "max_tokens");
}

TEST(Cli, BadSamplingValues) {
  expect_clean_failure(pdserve({"generate", "--model", kModel, "--temperature", "-1"}), "temperature");
  expect_clean_failure(pdserve({"generate", "--model", kModel, "--top-p", "1.5"}), "top_p");
}

TEST(Cli, InvalidUtf8Prompt) {
  expect_clean_failure(pdserve({"generate", "--model", kModel, "--prompt", "bad \xff\xfe bytes"}), "UTF-8");
}

TEST(Cli, UnknownModelNameWithoutNetwork) {
  TempDir cache;
  CliRun r = pdserve({"generate", "--model", "no-such-model"},
                  "PDSERVE_MODEL_PATH= XDG_CACHE_HOME=" + cache.path().string());
  expect_clean_failure(r, "no-such-model");
}

TEST(Cli, KnownModelNameNotCachedAndNoNetwork) {
  TempDir cache;
  CliRun r = pdserve({"generate", "--model", "stories260K"},
                  "PDSERVE_MODEL_PATH= XDG_CACHE_HOME=" + cache.path().string() +
                      " PDSERVE_MODEL_BASE_URL=http://127.0.0.1:9");
  expect_clean_failure(r, "stories260K");
}

TEST(Cli, BadFlag) {
  CliRun r = pdserve({"generate", "--no-such-flag"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_LT(r.exit_code, 128);
}

// `pdserve up --kv-mode pull-host` reads prompts from the prefill workers' host tier: without
// --host-kv-bytes it is refused before any process starts.
TEST(Cli, UpPullHostNeedsAHostTier) {
  CliRun r = pdserve({"up", "--model", kModel, "--prefill", "1", "--decode", "1", "--kv-mode", "pull-host"});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("--kv-mode pull-host reads prompts from the prefill workers' host KV tier: give "
                       "--host-kv-bytes"),
            std::string::npos)
      << r.err;
  // An aggregated cluster moves no KV: a --kv-mode other than the default is refused, not ignored.
  for (const char* mode : {"pull", "pull-host"}) {
    CliRun agg = pdserve({"up", "--model", kModel, "--aggregated", "1", "--kv-mode", mode, "--host-kv-bytes", "67108864"});
    EXPECT_EQ(agg.exit_code, 2) << agg.err;
    EXPECT_NE(agg.err.find(std::string("--kv-mode ") + mode + " applies to P/D clusters"), std::string::npos) << agg.err;
  }
}

// `pdserve up --kv-peer-tier` serves and reads host tiers between P/D workers, named by their
// KV events: without a host tier, on an aggregated cluster or with KV events off it is refused
// before any process starts.
TEST(Cli, UpPeerTierNeedsAPdClusterWithHostTiersAndKvEvents) {
  const std::vector<std::vector<std::string>> refused = {
      {"--prefill", "1", "--decode", "1"},
      {"--aggregated", "1", "--host-kv-bytes", "67108864"},
      {"--prefill", "1", "--decode", "1", "--host-kv-bytes", "67108864", "--kv-events", "off"},
  };
  for (const auto& extra : refused) {
    std::vector<std::string> args = {"up", "--model", kModel, "--kv-peer-tier"};
    args.insert(args.end(), extra.begin(), extra.end());
    CliRun r = pdserve(args);
    EXPECT_EQ(r.exit_code, 2) << r.err;
    EXPECT_NE(r.err.find("--kv-peer-tier needs a P/D cluster (--prefill/--decode) with --host-kv-bytes and KV events"),
              std::string::npos)
        << r.err;
  }
}

// `pdserve bench` refuses a flag its --workload would silently not read (exit 2, naming it),
// before connecting: nothing listens on the router address given.
TEST(Cli, BenchRefusesFlagsItsWorkloadDoesNotRead) {
  const std::vector<std::string> base = {"bench", "--router", "127.0.0.1:1"};
  const std::pair<std::vector<std::string>, std::string> refused[] = {
      {{"--workload", "multiturn", "--num-prompts", "8"}, "--num-prompts is not read by --workload multiturn"},
      {{"--workload", "agentic", "--random-input-len", "64"},
       "--random-input-len is not read by --workload agentic"},
      {{"--workload", "trace", "--trace", "t.jsonl", "--num-prompts", "3"},
       "--num-prompts is not read by --workload trace"},
      {{"--sessions", "2", "--fanout", "3"}, "--sessions, --fanout are not read by --workload random"},
      {{"--workload", "trace", "--trace", "t.jsonl", "--think-time", "1"},
       "--think-time is not read by --workload trace"},
      {{"--trace-speed", "2"}, "--trace-speed is not read by --workload random"},
      {{"--max-inflight", "2"}, "--max-inflight is not read by --workload random"},
      {{"--workload", "multiturn", "--abort-fraction", "0.1", "--abort-within-ms", "50"},
       "--abort-fraction, --abort-within-ms are not read by --workload multiturn"},
      {{"--abort-within-ms", "50"}, "--abort-within-ms times the aborts of --abort-fraction"},
      {{"--workload", "multiturn", "--trace-block-tokens", "16"},
       "--trace-block-tokens is not read by --workload multiturn"},
  };
  for (const auto& [flags, message] : refused) {
    std::vector<std::string> args = base;
    args.insert(args.end(), flags.begin(), flags.end());
    CliRun r = pdserve(args);
    EXPECT_EQ(r.exit_code, 2) << message << "\n" << r.err;
    EXPECT_NE(r.err.find("error: " + message), std::string::npos) << r.err;
  }
  // Read: the random lengths shape any workload's warm-ups; so the run gets as far as connecting.
  CliRun warm = pdserve({"bench", "--router", "127.0.0.1:1", "--workload", "multiturn", "--num-warmups", "1",
                         "--random-input-len", "16", "--sessions", "2"});
  EXPECT_EQ(warm.exit_code, 1) << warm.err;
  EXPECT_EQ(warm.err.find("not read by"), std::string::npos) << warm.err;
}

}  // namespace
}  // namespace pdserve
