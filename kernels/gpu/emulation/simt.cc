#include "kernels/gpu/emulation/simt.h"

#include <ucontext.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace pdserve::kernels::gpu::simt {
namespace {

constexpr size_t kStackBytes = 128 << 10;
// Dynamic shared memory starts this aligned, as on a GPU (wmma's loads need 32 bytes).
constexpr size_t kSharedAlign = 128;

// The coroutines that play a block's threads on one host thread, kept for the thread's later
// launches (making them costs system calls; switching between them does not). Each starts through
// its ucontext; after that, switches use GCC's __builtin_setjmp/__builtin_longjmp, which save and
// restore only the frame and stack pointers — no signal mask, no unwinding. A coroutine that has
// finished a block waits at the end of its loop to run the next one.
struct Threads {
  enum State { kNew, kRunnable, kAtBlockBarrier, kAtWarpBarrier, kDone };
  struct Jump {
    void* at[5];
  };
  Jump scheduler;
  ucontext_t start_from;
  std::vector<ucontext_t> start;
  std::vector<Jump> resume;
  std::vector<std::unique_ptr<char[]>> stacks;
  std::vector<State> state;
  std::vector<uint64_t> lanes;
  std::vector<unsigned char> shared;
  const std::function<void()>* body = nullptr;
  unsigned count = 0;  // Threads of the running launch's blocks (a prefix of the vectors).
  unsigned current = 0;
};

thread_local Threads* threads_here = nullptr;  // This host thread's coroutines.
thread_local Threads* running = nullptr;       // Set while this host thread runs a launch.
const bool reverse_order = std::getenv("PDSERVE_SIMT_REVERSE") != nullptr;
// allow_dynamic_shared's opt-ins by kernel, per host thread: a GPU's are per device, and a rank
// thread drives its own, so a kernel that opted in once for the whole process fails here.
thread_local std::unordered_map<const void*, size_t> opt_ins;

[[noreturn]] void fail(const char* what) {
  std::fprintf(stderr, "gpu emulation: %s\n", what);
  std::abort();
}

void thread_entry() {
  for (;;) {
    (*running->body)();
    Threads* b = running;
    b->state[b->current] = Threads::kDone;
    if (__builtin_setjmp(b->resume[b->current].at) == 0) __builtin_longjmp(b->scheduler.at, 1);
  }
}

[[gnu::noinline]] void wait(Threads::State why) {
  Threads* b = running;
  if (b == nullptr) fail("a barrier outside a kernel");
  b->state[b->current] = why;
  if (__builtin_setjmp(b->resume[b->current].at) == 0) __builtin_longjmp(b->scheduler.at, 1);
}

void set_thread_index(unsigned t) {
  threadIdx = dim3(t % blockDim.x, (t / blockDim.x) % blockDim.y, t / (blockDim.x * blockDim.y));
}

// Runs thread t until its next barrier or the end of its block. A frame of its own, whose locals
// no jump back can clobber.
[[gnu::noinline]] void run_until_barrier(Threads& b, unsigned t) {
  b.current = t;
  set_thread_index(t);
  if (__builtin_setjmp(b.scheduler.at) != 0) return;
  if (b.state[t] == Threads::kNew) {
    b.state[t] = Threads::kRunnable;
    swapcontext(&b.start_from, &b.start[t]);
  } else {
    __builtin_longjmp(b.resume[t].at, 1);
  }
}

// Makes runnable the threads whose barrier every participant reached; false when the block is
// done. Aborts when threads wait for others that cannot come.
bool release(Threads& b) {
  const unsigned n = b.count;
  bool released = false;
  for (unsigned w = 0; w < n; w += kWarpLanes) {
    const unsigned end = std::min(n, w + kWarpLanes);
    unsigned at_warp = 0;
    for (unsigned t = w; t < end; ++t) at_warp += b.state[t] == Threads::kAtWarpBarrier;
    if (at_warp == 0 || at_warp != end - w) continue;  // Lanes still elsewhere: checked below.
    for (unsigned t = w; t < end; ++t) b.state[t] = Threads::kRunnable;
    released = true;
  }
  if (released) return true;
  unsigned at_block = 0, done = 0;
  for (unsigned t = 0; t < n; ++t) {
    at_block += b.state[t] == Threads::kAtBlockBarrier;
    done += b.state[t] == Threads::kDone;
  }
  if (done == n) return false;
  if (at_block == n) {
    for (unsigned t = 0; t < n; ++t) b.state[t] = Threads::kRunnable;
    return true;
  }
  fail(done > 0 ? "threads wait at a barrier that returned threads never reach"
                : "a warp's lanes wait at different barriers (a shuffle in divergent code)");
}

// Runs the block blockIdx names.
void run_block(Threads& b) {
  for (unsigned t = 0; t < b.count; ++t)
    if (b.state[t] == Threads::kDone) b.state[t] = Threads::kRunnable;  // From the end of the last block.
  do {
    for (unsigned i = 0; i < b.count; ++i) {
      const unsigned t = reverse_order ? b.count - 1 - i : i;
      if (b.state[t] == Threads::kNew || b.state[t] == Threads::kRunnable) run_until_barrier(b, t);
    }
  } while (release(b));
}

// This host thread's coroutines, at least `count` of them.
Threads& threads_for(unsigned count) {
  if (threads_here == nullptr) threads_here = new Threads();  // Kept for the thread's life.
  Threads& b = *threads_here;
  const unsigned had = unsigned(b.state.size());
  if (count > had) {
    // Grown in place: coroutines already made keep their stacks and jump buffers.
    b.start.resize(count);
    b.resume.resize(count);
    b.state.resize(count, Threads::kNew);
    b.lanes.resize(count, 0);
    for (unsigned t = had; t < count; ++t) {
      b.stacks.emplace_back(new char[kStackBytes]);
      getcontext(&b.start[t]);
      b.start[t].uc_stack.ss_sp = b.stacks.back().get();
      b.start[t].uc_stack.ss_size = kStackBytes;
      b.start[t].uc_link = nullptr;  // thread_entry never returns.
      makecontext(&b.start[t], thread_entry, 0);
    }
  }
  return b;
}

}  // namespace

void launch(dim3 grid, dim3 block, size_t shared_bytes, const std::function<void()>& body) {
  if (running != nullptr) fail("a launch from inside a kernel");
  static std::mutex one_at_a_time;
  std::lock_guard lock(one_at_a_time);
  gridDim = grid;
  blockDim = block;
  Threads& b = threads_for(block.x * block.y * block.z);
  b.count = block.x * block.y * block.z;
  b.body = &body;
  b.shared.assign(shared_bytes + kSharedAlign, 0);
  running = &b;
  for (unsigned z = 0; z < grid.z; ++z)
    for (unsigned y = 0; y < grid.y; ++y)
      for (unsigned x = 0; x < grid.x; ++x) {
        blockIdx = dim3(x, y, z);
        run_block(b);
      }
  running = nullptr;
}

void allow_shared(const void* kernel, size_t bytes) { opt_ins[kernel] = bytes; }

void check_shared(const void* kernel, size_t bytes) {
  if (bytes <= kDefaultDynamicShared) return;
  const auto it = opt_ins.find(kernel);
  if (it == opt_ins.end() || it->second < bytes)
    fail("a launch takes more dynamic shared memory than 48 KB and its kernel's allow_dynamic_shared");
}

void* dynamic_shared() {
  const auto base = reinterpret_cast<uintptr_t>(running->shared.data());
  return reinterpret_cast<void*>((base + kSharedAlign - 1) / kSharedAlign * kSharedAlign);
}
void warp_barrier() { wait(Threads::kAtWarpBarrier); }
void block_barrier() { wait(Threads::kAtBlockBarrier); }
unsigned linear_thread() { return running->current; }
uint64_t* lane_slots() { return running->lanes.data(); }

}  // namespace pdserve::kernels::gpu::simt
