#include "engine/decode_graphs.h"

namespace pdserve::engine {

int decode_graph_bucket(int tokens, int max_batch) {
  if (tokens < 1 || tokens > max_batch) return 0;
  int bucket = 1;
  while (bucket < tokens) {
    const int step = bucket < 8 ? bucket : bucket < 64 ? 8 : bucket < 128 ? 16 : 32;
    bucket += step;
  }
  return bucket < max_batch ? bucket : max_batch;
}

StepGraph* DecodeGraphs::find(int bucket) const {
  const auto it = graphs_.find(bucket);
  return it == graphs_.end() ? nullptr : it->second.get();
}

bool DecodeGraphs::refused(int bucket) const { return refused_.count(bucket) > 0; }

void DecodeGraphs::refuse(int bucket) {
  graphs_.erase(bucket);
  refused_.insert(bucket);
}

Status DecodeGraphs::record(Backend& backend, int bucket, const std::function<void()>& body) {
  Status status = backend.begin_capture();
  if (status.ok()) {
    body();
    StatusOr<std::unique_ptr<StepGraph>> graph = backend.end_capture();
    if (graph.ok()) {
      graphs_[bucket] = std::move(*graph);
      return absl::OkStatus();
    }
    status = graph.status();
  }
  refused_.insert(bucket);
  return status;
}

}  // namespace pdserve::engine
