// The workers a router drives, from static address lists: one gRPC channel each, polled with
// Worker.Info for health and load. A worker that fails a poll or an RPC is marked down and
// probed again after a back-off; placement sees a snapshot of the last poll plus what this
// router sent each worker since, so back-to-back requests do not all land on one worker.
#pragma once

#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/clock.h"
#include "common/status.h"
#include "proto/worker.grpc.pb.h"
#include "router/metrics.h"
#include "router/policy.h"

namespace pdserve::router {

struct RegistryOptions {
  Duration poll_interval = std::chrono::milliseconds(200);
  Duration retry_interval = std::chrono::seconds(1);  // Back-off before probing a down worker.
  Duration rpc_timeout = std::chrono::seconds(2);     // For each Info call.
  int max_message_bytes = 64 << 20;
};

// "prefill", "decode", "aggregated" or "unspecified".
std::string role_name(worker::Role role);

class WorkerRegistry {
 public:
  struct Endpoint {
    std::string address;  // host:port
    worker::Role role = worker::ROLE_UNSPECIFIED;
  };

  WorkerRegistry(std::vector<Endpoint> endpoints, const RegistryOptions& options, const Clock& clock);
  ~WorkerRegistry();

  // Polls every worker that is due (all of them the first time) and waits for the answers.
  void poll_once();
  // Starts polling in the background every poll_interval.
  void start();
  // Stops the background polling (also done by the destructor).
  void stop();

  // Placement view of the workers of `role`; WorkerLoad::index is the registry index.
  std::vector<WorkerLoad> loads(worker::Role role) const;
  // Whether any worker of `role` is configured.
  bool has_role(worker::Role role) const;
  // The RPC stub of worker `index`.
  worker::Worker::Stub* stub(int index) const;
  const std::string& address(int index) const;
  // The last Info of some up worker of `role` (for model limits and block size).
  std::optional<worker::WorkerInfo> info(int index) const;
  // Records that a request was sent to `index` (counted in its load until the next poll).
  void note_assigned(int index, int blocks, int64_t prefill_tokens);
  // Marks `index` down after a failed RPC; it is probed again after retry_interval.
  void mark_down(int index, const Status& why);
  // Per-worker gauges for /metrics.
  std::vector<WorkerGauges> gauges() const;

 private:
  struct Worker {
    Endpoint endpoint;
    std::unique_ptr<worker::Worker::Stub> stub;
    bool up = false;
    bool ever_polled = false;
    TimePoint next_poll{};
    worker::WorkerInfo info;
    // Sent by this router since the last poll.
    int assigned_requests = 0;
    int assigned_blocks = 0;
    int64_t assigned_prefill_tokens = 0;
  };
  void apply_poll(int index, const Status& status, const worker::WorkerInfo& info);
  void poll_loop();

  const RegistryOptions options_;
  const Clock& clock_;
  mutable std::mutex mu_;
  std::vector<Worker> workers_;
  std::condition_variable cv_;
  bool stopping_ = false;
  std::thread poller_;
};

}  // namespace pdserve::router
