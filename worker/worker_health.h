// WorkerHealth: what a worker's probes answer, kept apart from the request path. Liveness is
// the process itself; start-up is "weights loaded and KV pool allocated"; readiness is
// "started, serving gRPC, registered with a router (when it was given one), RDMA available
// (when required), not draining", with the first unmet condition as the reason. Start-up,
// the registration thread and the signal handler set it; the probe server's threads read it.
// It also renders the worker's /metrics (readiness gauges and engine load), so an operator's
// monitoring sees a worker stuck not-ready, and why, without reading its logs.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>

namespace pdserve::worker {

// A probe's answer: ok, or not with the reason (the probe's response body).
struct ProbeAnswer {
  bool ok = false;
  std::string reason;
};

// The engine's load, as the worker's /metrics reports it.
struct WorkerLoadGauges {
  int num_blocks = 0;
  int free_blocks = 0;
  int running = 0;
  int waiting = 0;
  uint64_t kv_transfer_failures = 0;
  // The engine's steps since it started (engine::EngineStats).
  uint64_t steps = 0;
  uint64_t step_prefill_tokens = 0;
  uint64_t step_decode_sequences = 0;
  double step_seconds = 0;
  uint64_t preemptions = 0;  // Sequences preempted to make room (engine::EngineStats).
};

struct HealthRequirements {
  bool router = false;  // Registered with a router (--router) before ready.
  bool rdma = false;    // An RDMA transport in UCX before ready (--require-rdma).
};

class WorkerHealth {
 public:
  WorkerHealth(std::string role, HealthRequirements requirements);

  // Weights loaded and the KV pool allocated; `load` reads the engine's gauges from then on.
  void set_started(std::function<WorkerLoadGauges()> load);
  // The gRPC server accepts requests.
  void set_serving();
  // What UCX offers: whether any transport is RDMA, and their names (for the reason).
  void set_rdma(bool available, std::string transports);
  // Asked each time readiness is evaluated: whether some router has this worker registered.
  void set_registration(std::function<bool()> registered);
  // SIGTERM: not ready from now on, so no new work is routed here.
  void set_draining();
  // Forgets the load and registration callbacks (waiting for a scrape that runs one), before
  // what they read is destroyed; readiness stays false from then on.
  void detach();
  bool draining() const { return draining_.load(); }

  ProbeAnswer live() const;
  ProbeAnswer startup() const;
  ProbeAnswer ready() const;
  // Prometheus text exposition of the gauges above.
  std::string metrics_text() const;

 private:
  const std::string role_;
  const HealthRequirements requirements_;
  std::atomic<bool> started_{false};
  std::atomic<bool> serving_{false};
  std::atomic<bool> draining_{false};
  mutable std::mutex mu_;  // Guards what follows.
  std::function<WorkerLoadGauges()> load_;
  std::function<bool()> registered_;
  bool rdma_known_ = false;
  bool rdma_available_ = false;
  std::string transports_;
};

}  // namespace pdserve::worker
