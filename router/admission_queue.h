// The router's bounded admission queue: at most `max_running` requests are out at the workers,
// at most `max_waiting` more wait (first come, first served) for one of those slots, and the
// rest are refused at once with RESOURCE_EXHAUSTED "overloaded" instead of piling up latency.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>

#include "common/status.h"

namespace pdserve::router {

class AdmissionQueue {
 public:
  AdmissionQueue(int max_running, int max_waiting);

  // Takes a running slot, waiting in arrival order while none is free. ResourceExhausted
  // ("overloaded") when the wait queue is full. `check` is called first (a request stopped
  // before it came takes no slot) and every few milliseconds while waiting: a non-OK status it
  // returns (cancelled, deadline) ends the wait with it.
  Status acquire(const std::function<Status()>& check);
  // Gives back a slot taken by acquire().
  void release();

  int running() const;
  int waiting() const;

 private:
  const int max_running_;
  const int max_waiting_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  int running_ = 0;
  uint64_t next_ticket_ = 0;
  std::deque<uint64_t> queue_;  // Tickets of waiting requests, oldest first.
};

// Releases an acquired slot when it goes out of scope.
class AdmissionSlot {
 public:
  explicit AdmissionSlot(AdmissionQueue* queue) : queue_(queue) {}
  ~AdmissionSlot() {
    if (queue_) queue_->release();
  }
  AdmissionSlot(const AdmissionSlot&) = delete;
  AdmissionSlot& operator=(const AdmissionSlot&) = delete;

 private:
  AdmissionQueue* queue_;
};

}  // namespace pdserve::router
