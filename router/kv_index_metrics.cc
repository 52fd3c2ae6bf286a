#include "router/kv_index_metrics.h"

#include "router/metrics.h"

namespace pdserve::router {

void append_kv_index_metrics(std::string& out, const KvIndexStats& s, const std::vector<KvIndexWorkerGauge>& workers) {
  append_header(out, "pdserve:kv_index_state",
                "The router's index of a worker's prefix cache: 1 for its current state (exact: placement uses its "
                "events; recovering, degraded: predicted entries only).",
                "gauge");
  for (const KvIndexWorkerGauge& w : workers) {
    if (!w.state) continue;
    for (WorkerKvState st : {WorkerKvState::kExact, WorkerKvState::kRecovering, WorkerKvState::kDegraded})
      append_sample(out, "pdserve:kv_index_state", {{"worker", w.worker}, {"state", to_string(st)}},
                    *w.state == st ? 1 : 0);
  }
  append_header(out, "pdserve:kv_index_blocks", "Device-tier block keys the router's index holds for the worker.",
                "gauge");
  for (const KvIndexWorkerGauge& w : workers)
    if (w.state) append_sample(out, "pdserve:kv_index_blocks", {{"worker", w.worker}}, double(w.keys));
  const std::pair<const char*, std::pair<const char*, uint64_t>> counters[] = {
      {"pdserve:kv_events_batches_total", {"KV event batches applied to the index.", s.applied_batches}},
      {"pdserve:kv_events_gaps_total", {"Sequence gaps detected in the workers' KV events.", s.gaps}},
      {"pdserve:kv_events_epochs_total", {"New publisher epochs seen (worker restarts).", s.epochs}},
      {"pdserve:kv_events_drifts_total",
       {"Heartbeats whose key counts disagreed with the index at an equal sequence.", s.drifts}},
      {"pdserve:kv_events_snapshots_total", {"Snapshots applied to the index.", s.snapshots}},
      {"pdserve:kv_events_rejected_total",
       {"Batches rejected for another key scheme, block size or compat hash.", s.rejected}},
  };
  for (const auto& [name, help_value] : counters) {
    append_header(out, name, help_value.first, "counter");
    append_sample(out, name, {}, double(help_value.second));
  }
  append_header(out, "pdserve:kv_events_replays_total", "Replays requested from the workers, by result.", "counter");
  append_sample(out, "pdserve:kv_events_replays_total", {{"result", "succeeded"}}, double(s.replays_succeeded));
  append_sample(out, "pdserve:kv_events_replays_total", {{"result", "failed"}}, double(s.replays_failed));
  append_header(out, "pdserve:kv_events_lag_seconds",
                "Apply time less the batch's timestamp, of the last live batch (and the most seen).", "gauge");
  append_sample(out, "pdserve:kv_events_lag_seconds", {{"stat", "last"}}, s.last_lag_seconds);
  append_sample(out, "pdserve:kv_events_lag_seconds", {{"stat", "max"}}, s.max_lag_seconds);
}

}  // namespace pdserve::router
