// BatchRing: the publisher's replay buffer, the last published batches (their encoded
// payloads, by seq), bounded both by count and by bytes so that a burst of large batches
// cannot grow it without limit. Seqs are contiguous: the ring covers [first_seq, last_seq].
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <string>

namespace pdserve::kvevents {

class BatchRing {
 public:
  BatchRing(size_t max_batches, size_t max_bytes) : max_batches_(max_batches), max_bytes_(max_bytes) {}

  // Appends the payload of batch `seq`, which must be last_seq() + 1 (or the first one).
  void push(uint64_t seq, std::string payload);
  bool empty() const { return payloads_.empty(); }
  uint64_t first_seq() const { return first_seq_; }
  uint64_t last_seq() const { return first_seq_ + payloads_.size() - 1; }
  // Whether batches [from_seq, last_seq()] are all held.
  bool covers(uint64_t from_seq) const { return !empty() && from_seq >= first_seq_; }
  const std::string& at(uint64_t seq) const { return payloads_[size_t(seq - first_seq_)]; }

 private:
  size_t max_batches_;
  size_t max_bytes_;
  size_t bytes_ = 0;
  uint64_t first_seq_ = 1;
  std::deque<std::string> payloads_;
};

}  // namespace pdserve::kvevents
