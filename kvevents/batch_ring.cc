#include "kvevents/batch_ring.h"

namespace pdserve::kvevents {

void BatchRing::push(uint64_t seq, std::string payload) {
  if (payloads_.empty()) first_seq_ = seq;
  bytes_ += payload.size();
  payloads_.push_back(std::move(payload));
  // Keeps at least the newest batch, whatever its size, so that a replay of it is possible.
  while (payloads_.size() > 1 && (payloads_.size() > max_batches_ || bytes_ > max_bytes_)) {
    bytes_ -= payloads_.front().size();
    payloads_.pop_front();
    ++first_seq_;
  }
}

}  // namespace pdserve::kvevents
