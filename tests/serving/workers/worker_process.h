// A worker process for the worker-level serving tests: pdserve-prefill or pdserve-decode, a
// Process (tests/serving/cluster_process.h) whose stderr log is kept for the failure messages.
#pragma once

#include <chrono>
#include <filesystem>
#include <string>
#include <vector>

#include "tests/serving/cluster_process.h"

namespace pdserve::testing {

class WorkerProcess : public Process {
 public:
  // Starts `binary` with `args`; stderr goes to `log`.
  WorkerProcess(const std::string& binary, std::vector<std::string> args, const std::filesystem::path& log)
      : Process(with_binary(binary, std::move(args)), log) {}

  // The gRPC address from its READY line.
  const std::string& address() const { return grpc(); }
  // SIGTERM, then the exit status within `timeout` (-1 if it had to be killed).
  int terminate(std::chrono::milliseconds timeout) { return stop(timeout); }

 private:
  static std::vector<std::string> with_binary(const std::string& binary, std::vector<std::string> args) {
    args.insert(args.begin(), binary);
    return args;
  }
};

}  // namespace pdserve::testing
