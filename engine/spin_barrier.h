// SpinBarrier: a reusable barrier for the rank threads of one CPU engine, and `spin_then_wait`,
// the wait it is built on. A decode step of a small model meets its peers dozens of times within
// a few milliseconds; a futex sleep and wake per meeting (std::barrier, a condition variable)
// costs tens of microseconds each on a virtual machine, which was most of what TP 2 lost on CPU.
// So a waiter first spins (with a pause) for a bounded number of pauses — from ~15 to ~200 us
// depending on the core's pause — and only then sleeps on the atomic, so that idle ranks between
// requests cost nothing. Spinning only pays while every waiter has a core of its own: with more
// threads than cores a spinner takes the core the thread it waits for needs, so callers then
// ask for no spinning (`spins` 0; spin_budget()).
#pragma once

#include <atomic>
#include <cstdint>
#include <thread>
#include <type_traits>
#include <utility>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace pdserve::engine {

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// Pauses per wait before sleeping for `threads` waiting threads: 4096 while each can have a
// core, none beyond (see above).
inline int spin_budget(int threads) {
  const unsigned cores = std::thread::hardware_concurrency();
  return cores == 0 || unsigned(threads) <= cores ? 1 << 12 : 0;
}

// Returns once `value` no longer holds `old`, after at most `spins` pauses of polling.
// `sleepers` counts the threads asleep on `value`, so that the side that changes it calls
// notify_all (a syscall) only when someone sleeps: whoever changes `value` stores it, then
// calls wake_sleepers (both sequentially consistent).
template <typename T>
void spin_then_wait(const std::atomic<T>& value, T old, std::atomic<int>& sleepers, int spins) {
  for (int i = 0; i < spins; ++i) {
    if (value.load(std::memory_order_acquire) != old) return;
    cpu_relax();
  }
  sleepers.fetch_add(1);
  while (value.load() == old) value.wait(old);
  sleepers.fetch_sub(1);
}

// Called right after a sequentially consistent change of `value`: wakes the threads
// spin_then_wait() put to sleep on it, with a syscall only when there are some.
template <typename T>
void wake_sleepers(std::atomic<T>& value, const std::atomic<int>& sleepers) {
  if (sleepers.load() > 0) value.notify_all();
}

// A barrier for a fixed number of threads, reusable phase after phase. The last thread to
// arrive runs `completion` (before any thread leaves) and releases the others. The completion
// must not throw: the others would wait for a phase that never ends.
template <typename Completion>
class SpinBarrier {
  static_assert(std::is_nothrow_invocable_v<Completion&>, "a throwing completion would strand the waiters");

 public:
  SpinBarrier(int count, Completion completion)
      : count_(count), spins_(spin_budget(count)), completion_(std::move(completion)) {}

  void arrive_and_wait() {
    // The phase cannot move on before this thread arrives, so it is the one being waited out.
    const uint32_t phase = phase_.load(std::memory_order_acquire);
    if (arrived_.fetch_add(1, std::memory_order_acq_rel) + 1 == count_) {
      completion_();
      arrived_.store(0, std::memory_order_relaxed);
      phase_.store(phase + 1);
      wake_sleepers(phase_, sleepers_);
      return;
    }
    spin_then_wait(phase_, phase, sleepers_, spins_);
  }

 private:
  const int count_;
  const int spins_;
  Completion completion_;
  std::atomic<int> arrived_{0};
  std::atomic<uint32_t> phase_{0};
  std::atomic<int> sleepers_{0};
};

}  // namespace pdserve::engine
