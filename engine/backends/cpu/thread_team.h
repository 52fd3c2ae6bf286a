// ThreadTeam, and part_range to cut work for it: the threads one CPU rank computes its kernels with — the rank's own
// thread and `size() - 1` helpers that the team keeps for its lifetime. A decode step of an 85M-parameter f32 model
// streams ~340 MB of weights through its GEMVs; one core reads ~18 GB/s of that on the 2-core dev machine, two ~30
// GB/s, so one rank needs more than its own thread to keep up with a multi-threaded peer (llama2.c's run.c with OpenMP)
// at TP 1.
//
// Why not OpenMP: a step of a small model hands work to the helpers ~100 times in a few
// milliseconds, so the hand-off has to spin first and sleep only when idle, with the same
// spin policy as the rank pool's barriers (spin_barrier.h: no spinning once the process has more
// compute threads than cores); and ThreadSanitizer, which CI runs over the engine, sees this
// team's synchronisation but not libgomp's.
#pragma once

#include <atomic>
#include <cstdint>
#include <thread>
#include <vector>

#include "absl/functional/function_ref.h"

namespace pdserve::engine {

class ThreadTeam {
 public:
  // A team of `size` ≥ 1 threads, the caller's included; waits spin for `spins` pauses
  // (spin_budget() of the process's compute threads) before sleeping.
  ThreadTeam(int size, int spins);
  ~ThreadTeam();
  ThreadTeam(const ThreadTeam&) = delete;
  ThreadTeam& operator=(const ThreadTeam&) = delete;

  int size() const { return int(helpers_.size()) + 1; }
  // Runs part(i) once for every i in [0, parts) (parts ≤ kMaxParts) and returns once all have
  // returned. The parts go to whichever threads claim them first, the caller's included, so a
  // helper that is slow to wake (asleep after an idle spell) costs the caller nothing: it does
  // what no helper took. One caller at a time; part must not throw.
  void run(int parts, absl::FunctionRef<void(int)> part);
  static constexpr int kMaxParts = 0xffff;

 private:
  void helper();
  // Claims and runs parts of the run `seen` belongs to, until none is left; `seen` follows work_.
  // noexcept: a part that threw would leave the helpers calling a dead part_; this terminates.
  void claim_parts(uint64_t& seen) noexcept;

  const int spins_;
  std::vector<std::thread> helpers_;
  // The current run: its number (high 32 bits), its part count (next 16) and the next part to
  // claim (low 16), in one word so that a claim (a compare-exchange) is of that run's parts.
  std::atomic<uint64_t> work_{0};
  // The number of the run work_ holds, stored after it: what idle helpers wait on, a 32-bit
  // futex word (waiting on work_ itself, through libstdc++ 12's proxy for 64-bit atomics, hung
  // this team's tests now and then).
  std::atomic<uint32_t> published_{0};
  std::atomic<int> published_sleepers_{0};
  // The current run's work, written before work_ publishes the run; a claimed part's run cannot
  // end (and the next one rewrite this) before the part has finished.
  const absl::FunctionRef<void(int)>* part_ = nullptr;
  uint32_t run_number_ = 0;  // The last run's; the caller's thread alone touches it.
  std::atomic<bool> stop_{false};
  // Parts of the current run that have finished; the caller waits for all.
  std::atomic<int> done_{0};
  std::atomic<int> done_sleepers_{0};
};

// [begin, end) of `count` items for part `part` of `parts`: whole grains (but for the last,
// partial one), as evenly as they divide — contiguous, in order, covering every item once; a
// part may be empty where there are fewer grains than parts.
struct PartRange {
  int begin, end;
};
PartRange part_range(int count, int parts, int part, int grain);

}  // namespace pdserve::engine
