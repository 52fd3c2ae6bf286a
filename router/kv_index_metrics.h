// The Prometheus exposition of the router's KV index (router/kv_index.h): per worker its state
// (EXACT / RECOVERING / DEGRADED, as an enum gauge) and the device-tier keys the router holds
// for it, and the event stream's health over all workers (batches, gaps, new epochs, drifts,
// replays, snapshots, rejected batches, apply lag). Operators alert on a worker that stays out
// of EXACT (its cache is then placed by prediction only) and on gaps and failed replays. A pure
// formatting function, table-tested like router/metrics.h's.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "router/kv_index.h"

namespace pdserve::router {

// One worker as the index sees it; `state` is nullopt for a worker without KV events.
struct KvIndexWorkerGauge {
  std::string worker;  // Address.
  std::optional<WorkerKvState> state;
  size_t keys = 0;  // Device tier.
};

// Appends the kv_index_* and kv_events_* families to `out`.
void append_kv_index_metrics(std::string& out, const KvIndexStats& stats, const std::vector<KvIndexWorkerGauge>& workers);

}  // namespace pdserve::router
