#include "tune/local_cluster.h"

#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

namespace pdserve::tune {

const char* device_flag(Device device) {
  switch (device) {
    case Device::kCpu: return "cpu";
    case Device::kCuda: return "cuda";
    case Device::kHip: return "hip";
    case Device::kEmulated: return "emulated";
  }
  return "cpu";
}

std::vector<std::string> up_arguments(const Topology& t, const ClusterOptions& o) {
  // No prefix cache: profiles and gates measure computed prefill, and their seeded prompts
  // recur from one load point to the next. P/D prompts prefill on the prefill workers (no
  // decode-local prefill), as the P:D sizing assumes.
  std::vector<std::string> a = {o.pdserve, "up", "--model",   o.model, "--device",         device_flag(o.device),
                                "--port",  "0",  "--restart", "never", "--prefix-caching", "off"};
  if (t.aggregated) {
    a.insert(a.end(), {"--aggregated", std::to_string(t.n_d), "--tp", std::to_string(t.tp_d)});
  } else {
    a.insert(a.end(), {"--prefill", std::to_string(t.n_p), "--prefill-tp", std::to_string(t.tp_p), "--decode",
                       std::to_string(t.n_d), "--decode-tp", std::to_string(t.tp_d), "--kv-mode",
                       t.mode == KvMode::kPush ? "push" : "pull", "--local-prefill-tokens", "0"});
  }
  // up passes --weight-dtype to GPU workers only, and refuses a bf16 KV cache with CPU workers.
  if (o.device != Device::kCpu) a.insert(a.end(), {"--weight-dtype", engine::dtype_name(o.weight_dtype)});
  if (o.kv_dtype != engine::DType::kF32) a.insert(a.end(), {"--kv-dtype", engine::dtype_name(o.kv_dtype)});
  if (o.gemm_precision != engine::GemmPrecision::kExact)
    a.insert(a.end(), {"--gemm-precision", engine::gemm_precision_name(o.gemm_precision)});
  if (o.max_running > 0) a.insert(a.end(), {"--max-running", std::to_string(o.max_running)});
  if (o.max_waiting >= 0) a.insert(a.end(), {"--max-waiting", std::to_string(o.max_waiting)});
  return a;
}

StatusOr<ClusterEndpoints> parse_ready_file(const std::string& text) {
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return absl::InvalidArgumentError("ready file is not a JSON object");
  ClusterEndpoints e;
  if (!j.contains("router") || !j["router"].contains("grpc"))
    return absl::InvalidArgumentError("ready file names no router");
  e.router = j["router"]["grpc"].get<std::string>();
  for (const auto& w : j.value("workers", nlohmann::json::array())) {
    WorkerEndpoint we;
    we.name = w.value("name", "");
    we.role = w.value("role", "");
    we.grpc = w.value("grpc", "");
    we.tp = std::stoi(w.value("tp", "1"));
    if (we.grpc.empty() || we.role.empty())
      return absl::InvalidArgumentError("ready file has a worker without grpc/role");
    e.workers.push_back(we);
  }
  return e;
}

std::string log_tail(const std::string& path, size_t max_bytes) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string s = ss.str();
  return s.size() > max_bytes ? s.substr(s.size() - max_bytes) : s;
}

StatusOr<LocalCluster> LocalCluster::start(const Topology& topology, const ClusterOptions& options,
                                           const std::string& tag) {
  namespace fs = std::filesystem;
  const std::string ready = (fs::path(options.work_dir) / (tag + ".ready.json")).string();
  const std::string log = (fs::path(options.work_dir) / (tag + ".log")).string();
  fs::remove(ready);
  std::vector<std::string> argv = up_arguments(topology, options);
  argv.insert(argv.end(), {"--ready-file", ready, "--startup-timeout", std::to_string(options.startup_timeout_s)});
  PD_ASSIGN_OR_RETURN(ChildProcess up, ChildProcess::start(argv, log));
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(int64_t(options.startup_timeout_s * 1000) + 5000);
  // up writes the file (renamed into place) once every process is ready, or exits.
  while (!fs::exists(ready)) {
    if (up.exited())
      return absl::UnavailableError("pdserve up (" + tag + ") exited with " + std::to_string(up.exit_code()) +
                                    " before it was ready: " + log_tail(log));
    if (std::chrono::steady_clock::now() >= deadline)
      return absl::DeadlineExceededError("pdserve up (" + tag + ") not ready in time");
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  std::ifstream in(ready);
  std::stringstream ss;
  ss << in.rdbuf();
  PD_ASSIGN_OR_RETURN(ClusterEndpoints endpoints, parse_ready_file(ss.str()));
  return LocalCluster(std::move(up), std::move(endpoints), log);
}

void LocalCluster::stop() {
  if (up_) up_->stop(std::chrono::seconds(20));
  up_.reset();
}

}  // namespace pdserve::tune
