#include "router/admission_queue.h"

#include <algorithm>
#include <chrono>

#include "router/policy.h"

namespace pdserve::router {

AdmissionQueue::AdmissionQueue(int max_running, int max_waiting)
    : max_running_(std::max(1, max_running)), max_waiting_(std::max(0, max_waiting)) {}

Status AdmissionQueue::acquire(const std::function<Status()>& check) {
  if (Status s = check ? check() : absl::OkStatus(); !s.ok()) return s;
  std::unique_lock lock(mu_);
  switch (admit(running_, int(queue_.size()), max_running_, max_waiting_)) {
    case Admission::kRun:
      ++running_;
      return absl::OkStatus();
    case Admission::kReject:
      return absl::ResourceExhaustedError(absl::StrCat("overloaded: ", running_, " requests running and ",
                                                       queue_.size(), " waiting (the most allowed)"));
    case Admission::kWait:
      break;
  }
  const uint64_t ticket = next_ticket_++;
  queue_.push_back(ticket);
  while (true) {
    if (queue_.front() == ticket && running_ < max_running_) {
      queue_.pop_front();
      ++running_;
      cv_.notify_all();  // The next in line may fit too.
      return absl::OkStatus();
    }
    cv_.wait_for(lock, std::chrono::milliseconds(10));
    lock.unlock();
    Status s = check ? check() : absl::OkStatus();
    lock.lock();
    if (!s.ok()) {
      queue_.erase(std::find(queue_.begin(), queue_.end(), ticket));
      cv_.notify_all();
      return s;
    }
  }
}

void AdmissionQueue::release() {
  std::lock_guard lock(mu_);
  --running_;
  cv_.notify_all();
}

int AdmissionQueue::running() const {
  std::lock_guard lock(mu_);
  return running_;
}

int AdmissionQueue::waiting() const {
  std::lock_guard lock(mu_);
  return int(queue_.size());
}

}  // namespace pdserve::router
