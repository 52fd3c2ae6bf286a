// A topology brought up on this machine for the tuner to measure: `pdserve up` as a child
// process (so profiling, gating and validation run the very cluster an operator would), its
// endpoints read from up's --ready-file, and everything stopped when the LocalCluster goes.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "tune/child_process.h"
#include "tune/types.h"

namespace pdserve::tune {

// How every cluster of one tuning run is started.
struct ClusterOptions {
  std::string pdserve;  // The pdserve binary (it finds the workers and router beside itself).
  std::string model;
  Device device = Device::kCpu;
  // The workers' GEMM weights (f32 | bf16; GPU workers only) and KV cache elements (f32 | bf16;
  // GPU workers only), as `pdserve up --weight-dtype/--kv-dtype` take them.
  engine::DType weight_dtype = engine::DType::kF32;
  engine::DType kv_dtype = engine::DType::kF32;
  // The GPU workers' GEMM precision (`up --gemm-precision`; bf16 with bf16 weights only).
  engine::GemmPrecision gemm_precision = engine::GemmPrecision::kExact;
  std::string work_dir;  // Logs and ready files go here.
  int max_running = 0;   // Router admission (0: up's default).
  int max_waiting = -1;  // (-1: up's default).
  double startup_timeout_s = 180;
};

struct WorkerEndpoint {
  std::string name;  // up's child name: prefill0, decode1, aggregated0, ...
  std::string role;  // prefill, decode, aggregated.
  std::string grpc;  // HOST:PORT; also the worker's name in GenerateResponse.prefill_worker.
  int tp = 1;
};

struct ClusterEndpoints {
  std::string router;  // gRPC HOST:PORT.
  std::vector<WorkerEndpoint> workers;
};

// up's command line for `topology` (without --ready-file); pure, so up.sh and the tuner agree.
std::vector<std::string> up_arguments(const Topology& topology, const ClusterOptions& options);

// The endpoints in an up --ready-file's JSON text.
StatusOr<ClusterEndpoints> parse_ready_file(const std::string& text);

const char* device_flag(Device device);

class LocalCluster {
 public:
  // Starts the topology and waits until it serves (or fails, with up's log tail in the error).
  static StatusOr<LocalCluster> start(const Topology& topology, const ClusterOptions& options, const std::string& tag);
  LocalCluster(LocalCluster&&) = default;
  LocalCluster& operator=(LocalCluster&&) = default;
  ~LocalCluster() = default;  // ChildProcess stops up, which stops its children.

  const ClusterEndpoints& endpoints() const { return endpoints_; }
  const std::string& log_path() const { return log_path_; }
  // Stops the cluster now.
  void stop();

 private:
  LocalCluster(ChildProcess up, ClusterEndpoints endpoints, std::string log_path)
      : up_(std::move(up)), endpoints_(std::move(endpoints)), log_path_(std::move(log_path)) {}
  std::optional<ChildProcess> up_;
  ClusterEndpoints endpoints_;
  std::string log_path_;
};

// The last `max_bytes` of a log file (for error messages).
std::string log_tail(const std::string& path, size_t max_bytes = 2000);

}  // namespace pdserve::tune
