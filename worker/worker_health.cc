#include "worker/worker_health.h"

#include "absl/strings/str_cat.h"

namespace pdserve::worker {

WorkerHealth::WorkerHealth(std::string role, HealthRequirements requirements)
    : role_(std::move(role)), requirements_(requirements) {}

void WorkerHealth::set_started(std::function<WorkerLoadGauges()> load) {
  {
    std::lock_guard lock(mu_);
    load_ = std::move(load);
  }
  started_ = true;
}

void WorkerHealth::set_serving() { serving_ = true; }

void WorkerHealth::set_rdma(bool available, std::string transports) {
  std::lock_guard lock(mu_);
  rdma_known_ = true;
  rdma_available_ = available;
  transports_ = std::move(transports);
}

void WorkerHealth::set_registration(std::function<bool()> registered) {
  std::lock_guard lock(mu_);
  registered_ = std::move(registered);
}

void WorkerHealth::set_draining() { draining_ = true; }

void WorkerHealth::detach() {
  std::lock_guard lock(mu_);
  draining_ = true;
  load_ = nullptr;
  registered_ = nullptr;
}

ProbeAnswer WorkerHealth::live() const { return {true, "alive"}; }

ProbeAnswer WorkerHealth::startup() const {
  if (!started_) return {false, "loading the model and allocating the KV cache"};
  return {true, "started"};
}

ProbeAnswer WorkerHealth::ready() const {
  if (draining_) return {false, "draining: shutting down"};
  if (ProbeAnswer s = startup(); !s.ok) return s;
  if (!serving_) return {false, "starting the gRPC server"};
  // Under the lock throughout: detach() waits for a probe that is asking the registration.
  std::lock_guard lock(mu_);
  if (requirements_.rdma) {
    if (!rdma_known_) return {false, "RDMA required: UCX transports not yet queried"};
    if (!rdma_available_)
      return {false, absl::StrCat("RDMA required (--require-rdma), but UCX offers no RDMA transport, only: ",
                                  transports_, " (check the RDMA device resource, IPC_LOCK, UCX_TLS and that UCX "
                                  "was built with verbs)")};
  }
  if (requirements_.router && (!registered_ || !registered_()))
    return {false, "not registered with the router yet"};
  return {true, "ready"};
}

std::string WorkerHealth::metrics_text() const {
  WorkerLoadGauges load;
  bool rdma_available;
  const bool ready_now = ready().ok;  // Takes the lock itself.
  {
    std::lock_guard lock(mu_);
    if (load_) load = load_();
    rdma_available = rdma_available_;
  }
  const std::string labels = absl::StrCat("{role=\"", role_, "\"}");
  std::string out;
  auto gauge = [&](const char* name, const char* help, const char* type, auto value) {
    absl::StrAppend(&out, "# HELP pdserve:", name, " ", help, "\n# TYPE pdserve:", name, " ", type, "\npdserve:", name,
                    labels, " ", value, "\n");
  };
  gauge("worker_ready", "1 when the readiness probe passes.", "gauge", ready_now ? 1 : 0);
  gauge("worker_started", "1 once the weights are loaded and the KV pool allocated.", "gauge", started_ ? 1 : 0);
  gauge("worker_draining", "1 while shutting down.", "gauge", draining_ ? 1 : 0);
  gauge("worker_rdma_required", "1 when started with --require-rdma.", "gauge", requirements_.rdma ? 1 : 0);
  gauge("worker_rdma_available", "1 when UCX offers an RDMA transport.", "gauge", rdma_available ? 1 : 0);
  gauge("worker_kv_transfer_failures_total", "KV transfers that failed on some rank.", "counter",
        load.kv_transfer_failures);
  const double usage = load.num_blocks > 0 ? 1.0 - double(load.free_blocks) / load.num_blocks : 0.0;
  gauge("worker_kv_cache_usage_perc", "KV cache in use, 0 to 1.", "gauge", usage);
  gauge("worker_num_requests_running", "Sequences in the engine's running batch.", "gauge", load.running);
  gauge("worker_num_requests_waiting", "Sequences waiting in the engine.", "gauge", load.waiting);
  gauge("worker_steps_total", "Engine steps (forward passes) run.", "counter", load.steps);
  gauge("worker_preemptions_total", "Sequences preempted to make room in the KV cache (recomputed later).",
        "counter", load.preemptions);
  gauge("worker_step_prefill_tokens_total", "Prompt tokens the engine's steps computed.", "counter",
        load.step_prefill_tokens);
  gauge("worker_step_decode_sequences_total", "Sequences the engine's steps decoded (a token each).", "counter",
        load.step_decode_sequences);
  // A summary without quantiles: the rate of _sum over the rate of _count is the mean step
  // time; the step-by-step distribution is in WorkerInfo.steps.
  absl::StrAppend(&out, "# HELP pdserve:worker_step_seconds Engine steps' forward pass and sampling time.\n",
                  "# TYPE pdserve:worker_step_seconds summary\n", "pdserve:worker_step_seconds_sum", labels, " ",
                  load.step_seconds, "\npdserve:worker_step_seconds_count", labels, " ", load.steps, "\n");
  return out;
}

}  // namespace pdserve::worker
