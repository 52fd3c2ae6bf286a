#include "engine/backends/cpu/thread_team.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "engine/spin_barrier.h"

namespace pdserve::engine {

ThreadTeam::ThreadTeam(int size, int spins) : spins_(spins) {
  for (int i = 1; i < size; ++i) helpers_.emplace_back(&ThreadTeam::helper, this);
}

ThreadTeam::~ThreadTeam() {
  stop_ = true;
  published_.store(++run_number_);  // A run of no parts: the helpers wake to see stop_.
  wake_sleepers(published_, published_sleepers_);
  for (std::thread& t : helpers_) t.join();
}

void ThreadTeam::run(int parts, absl::FunctionRef<void(int)> part) {
  if (parts > kMaxParts) {
    std::fprintf(stderr, "pdserve: ThreadTeam::run of %d parts; at most %d fit its claim word\n", parts, kMaxParts);
    std::abort();
  }
  if (helpers_.empty() || parts <= 1) {
    for (int i = 0; i < parts; ++i) part(i);
    return;
  }
  part_ = &part;
  done_.store(0, std::memory_order_relaxed);
  uint64_t seen = uint64_t(++run_number_) << 32 | uint64_t(parts) << 16;
  work_.store(seen);              // Publishes part_ and done_ to claims,
  published_.store(run_number_);  // and the run to idle helpers.
  wake_sleepers(published_, published_sleepers_);
  claim_parts(seen);
  for (int finished = done_.load(std::memory_order_acquire); finished != parts;
       finished = done_.load(std::memory_order_acquire))
    spin_then_wait(done_, finished, done_sleepers_, spins_);
  part_ = nullptr;
}

void ThreadTeam::claim_parts(uint64_t& seen) noexcept {
  for (;;) {
    const int parts = int(seen >> 16 & 0xffff), next = int(seen & 0xffff);
    if (next >= parts) return;
    if (!work_.compare_exchange_weak(seen, seen + 1)) continue;  // `seen` is the word now.
    ++seen;
    (*part_)(next);
    done_.fetch_add(1);
    wake_sleepers(done_, done_sleepers_);
  }
}

void ThreadTeam::helper() {
  // The run number as the constructor left it, not as it is now: a helper that starts late must
  // still see the runs (and the stop) published before it.
  uint32_t seen_run = 0;
  for (;;) {
    spin_then_wait(published_, seen_run, published_sleepers_, spins_);
    seen_run = published_.load(std::memory_order_acquire);
    if (stop_) return;
    uint64_t seen = work_.load(std::memory_order_acquire);
    claim_parts(seen);
  }
}

PartRange part_range(int count, int parts, int part, int grain) {
  const int64_t grains = (int64_t(count) + grain - 1) / grain;
  const auto edge = [&](int p) { return int(std::min<int64_t>(count, grains * p / parts * grain)); };
  return {edge(part), edge(part + 1)};
}

}  // namespace pdserve::engine
