#include "router/bounded_task_queue.h"

#include <algorithm>

namespace pdserve::router {
namespace {
thread_local bool overflow_thread = false;
}  // namespace

BoundedTaskQueue::BoundedTaskQueue(size_t threads, size_t max_queued, size_t overflow_threads)
    : threads_(std::max<size_t>(threads, 1)), max_queued_(max_queued) {
  for (size_t i = 0; i < threads_; ++i) main_.threads.emplace_back([this] { run(main_, false); });
  for (size_t i = 0; i < std::max<size_t>(overflow_threads, 1); ++i)
    overflow_.threads.emplace_back([this] { run(overflow_, true); });
}

BoundedTaskQueue::~BoundedTaskQueue() { shutdown(); }

bool BoundedTaskQueue::in_overflow() { return overflow_thread; }

void BoundedTaskQueue::enqueue(std::function<void()> task) {
  {
    std::lock_guard lock(mu_);
    // Counted by what is taken, not by threads seen waiting: a thread not yet scheduled (a
    // loaded machine, a server just started) is still one that will serve the task.
    if (busy_ + main_.tasks.size() < threads_ + max_queued_)
      main_.tasks.push_back(std::move(task));
    else
      overflow_.tasks.push_back(std::move(task));
  }
  cv_.notify_all();
}

void BoundedTaskQueue::shutdown() {
  {
    std::lock_guard lock(mu_);
    if (shutdown_ && main_.threads.empty()) return;
    shutdown_ = true;
  }
  cv_.notify_all();
  for (Pool* pool : {&main_, &overflow_}) {
    for (std::thread& t : pool->threads)
      if (t.joinable()) t.join();
    pool->threads.clear();
  }
}

void BoundedTaskQueue::run(Pool& pool, bool overflow) {
  overflow_thread = overflow;
  while (true) {
    std::function<void()> task;
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] { return shutdown_ || !pool.tasks.empty(); });
      // Like httplib's pool: finish what was accepted, then stop.
      if (pool.tasks.empty()) return;
      task = std::move(pool.tasks.front());
      pool.tasks.pop_front();
      if (!overflow) ++busy_;
    }
    task();
    if (!overflow) {
      std::lock_guard lock(mu_);
      --busy_;
    }
  }
}

}  // namespace pdserve::router
