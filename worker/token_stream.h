// TokenStream: carries one request's engine events from the engine loop thread (which must never
// block on a slow client) to the RPC thread that writes them to the gRPC stream.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <vector>

#include "engine/engine.h"

namespace pdserve::worker {

class TokenStream {
 public:
  // Queues an event (engine loop thread).
  void push(const engine::TokenEvent& event) {
    std::lock_guard lock(mu_);
    events_.push_back(event);
    ready_.notify_one();
  }
  // Everything queued, waiting up to `timeout` for the first event; empty on timeout.
  std::vector<engine::TokenEvent> pop(std::chrono::milliseconds timeout) {
    std::unique_lock lock(mu_);
    ready_.wait_for(lock, timeout, [&] { return !events_.empty(); });
    std::vector<engine::TokenEvent> out;
    out.swap(events_);
    return out;
  }

 private:
  std::mutex mu_;
  std::condition_variable ready_;
  std::vector<engine::TokenEvent> events_;
};

}  // namespace pdserve::worker
