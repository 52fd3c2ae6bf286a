#include "tune/gate_checks.h"

#include <algorithm>

namespace pdserve::tune {

std::optional<int> first_mismatch(const std::vector<int>& want, const std::vector<int>& got, GatePolicy policy,
                                  int prefix_tokens) {
  const size_t checked = policy == GatePolicy::kExact ? std::max(want.size(), got.size())
                                                      : std::min(want.size(), size_t(std::max(0, prefix_tokens)));
  for (size_t i = 0; i < checked; ++i) {
    if (i >= want.size() || i >= got.size() || want[i] != got[i]) return int(i);
  }
  return std::nullopt;
}

std::optional<Divergence> first_divergence(const std::vector<GoldenPrompt>& prompts, const Reference& reference,
                                           const std::vector<std::vector<int>>& outputs, GatePolicy policy,
                                           int prefix_tokens) {
  for (size_t i = 0; i < prompts.size(); ++i) {
    const std::vector<int>& want = reference.tokens[i];
    const std::vector<int>& got = outputs[i];
    const std::optional<int> at = first_mismatch(want, got, policy, prefix_tokens);
    if (!at) continue;
    Divergence d;
    d.prompt = int(i);
    d.kind = prompts[i].kind;
    d.prompt_length = int(prompts[i].tokens.size());
    d.position = *at;
    d.expected = size_t(*at) < want.size() ? want[size_t(*at)] : -1;
    d.got = size_t(*at) < got.size() ? got[size_t(*at)] : -1;
    return d;
  }
  return std::nullopt;
}

std::set<WorkerPair> topology_pairs(const std::vector<TopologyWorker>& workers) {
  std::set<WorkerPair> pairs;
  for (const TopologyWorker& w : workers) {
    if (w.role == worker::ROLE_AGGREGATED) pairs.emplace(w.address, w.address);
    if (w.role != worker::ROLE_PREFILL) continue;
    for (const TopologyWorker& d : workers)
      if (d.role == worker::ROLE_DECODE) pairs.emplace(w.address, d.address);
  }
  return pairs;
}

StatusOr<BlockCount> wait_for_free_blocks(const std::function<StatusOr<BlockCount>()>& read, const Clock& clock,
                                          Duration timeout, const std::function<void()>& pause) {
  const TimePoint deadline = clock.now() + timeout;
  while (true) {
    PD_ASSIGN_OR_RETURN(BlockCount count, read());
    if (count.in_use() <= 0 || clock.now() >= deadline) return count;
    pause();
  }
}

}  // namespace pdserve::tune
