#include "engine/step_window.h"

#include <algorithm>

namespace pdserve::engine {

StepWindow::StepWindow(size_t capacity) : ring_(std::max<size_t>(capacity, 1)) {}

void StepWindow::record(StepSample sample) {
  sample.seq = ++total_;
  ring_[(sample.seq - 1) % ring_.size()] = sample;
}

std::vector<StepSample> StepWindow::after(uint64_t seq) const {
  if (seq >= total_) return {};
  const uint64_t oldest_kept = total_ > ring_.size() ? total_ - ring_.size() + 1 : 1;
  std::vector<StepSample> out;
  for (uint64_t s = std::max(seq + 1, oldest_kept); s <= total_; ++s) out.push_back(ring_[(s - 1) % ring_.size()]);
  return out;
}

}  // namespace pdserve::engine
