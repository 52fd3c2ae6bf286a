// BoundedTaskQueue: cpp-httplib's connection queue with a bound. httplib's own ThreadPool runs
// max(8, cores - 1) threads over an unbounded queue, so HTTP clients were capped far below
// --max-running and the rest queued invisibly, past the router's admission queue and timeouts.
// Here `threads` connections are served at once (the router sizes it from --max-running +
// --max-waiting, so every request admission could take gets a thread), at most `max_queued` more
// wait for one, and a connection beyond that is served by a small overflow pool on which
// in_overflow() is true: the generation handlers answer it at once with 429 "overloaded", the
// same answer as a full admission queue. (httplib 0.11's TaskQueue cannot refuse a connection:
// it must run the task that owns the socket.)
#pragma once

#include <httplib.h>

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace pdserve::router {

class BoundedTaskQueue final : public httplib::TaskQueue {
 public:
  BoundedTaskQueue(size_t threads, size_t max_queued, size_t overflow_threads = 2);
  ~BoundedTaskQueue() override;

  void enqueue(std::function<void()> task) override;
  void shutdown() override;

  // True on an overflow thread: the connection it serves found every thread busy and the
  // queue full.
  static bool in_overflow();

 private:
  struct Pool {
    std::deque<std::function<void()>> tasks;
    std::vector<std::thread> threads;
  };
  void run(Pool& pool, bool overflow);

  const size_t threads_;
  const size_t max_queued_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool shutdown_ = false;
  size_t busy_ = 0;  // Main threads running a task.
  Pool main_;
  Pool overflow_;
};

}  // namespace pdserve::router
