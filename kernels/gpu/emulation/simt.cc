#include "kernels/gpu/emulation/simt.h"

#include <cstdio>
#include <memory>
#include <vector>

namespace pdserve::kernels::gpu::simt {
namespace {

constexpr size_t kStackBytes = 128 << 10;

// The threads of a launch's blocks: one coroutine per thread of a block, made once per launch and
// reused by every block (a thread that finishes a block waits to run the next). Each starts
// through its ucontext; after that, switches use _setjmp/_longjmp, which unlike swapcontext make
// no system call.
struct Block {
  enum State { kNew, kRunnable, kAtBlockBarrier, kAtWarpBarrier, kDone };
  struct Jump {
    jmp_buf at;
  };
  jmp_buf scheduler;
  ucontext_t start_from;
  std::vector<ucontext_t> start;
  std::vector<Jump> resume;
  std::vector<std::unique_ptr<char[]>> stacks;
  std::vector<State> state;
  std::vector<uint64_t> lanes;
  std::vector<unsigned char> shared;
  const std::function<void()>* body = nullptr;
  unsigned current = 0;
};

Block* running = nullptr;
const bool reverse_order = std::getenv("PDSERVE_SIMT_REVERSE") != nullptr;

[[noreturn]] void fail(const char* what) {
  std::fprintf(stderr, "gpu emulation: %s\n", what);
  std::abort();
}

void thread_entry() {
  for (;;) {
    (*running->body)();
    Block* b = running;
    b->state[b->current] = Block::kDone;
    if (_setjmp(b->resume[b->current].at) == 0) _longjmp(b->scheduler, 1);
  }
}

void wait(Block::State why) {
  Block* b = running;
  if (b == nullptr) fail("a barrier outside a kernel");
  b->state[b->current] = why;
  if (_setjmp(b->resume[b->current].at) == 0) _longjmp(b->scheduler, 1);
}

void set_thread_index(unsigned t) {
  threadIdx = dim3(t % blockDim.x, (t / blockDim.x) % blockDim.y, t / (blockDim.x * blockDim.y));
}

// Runs thread t until its next barrier or its end. A frame of its own, whose locals no thread's
// _longjmp back can clobber.
[[gnu::noinline]] void run_until_barrier(Block& b, unsigned t) {
  b.current = t;
  set_thread_index(t);
  if (_setjmp(b.scheduler) != 0) return;
  if (b.state[t] == Block::kNew) {
    b.state[t] = Block::kRunnable;
    swapcontext(&b.start_from, &b.start[t]);
  } else {
    _longjmp(b.resume[t].at, 1);
  }
}

// Makes runnable the threads whose barrier every participant reached; false if none could go on.
bool release(Block& b) {
  const unsigned n = unsigned(b.state.size());
  bool released = false;
  for (unsigned w = 0; w < n; w += kWarpLanes) {
    const unsigned end = std::min(n, w + kWarpLanes);
    unsigned at_warp = 0;
    for (unsigned t = w; t < end; ++t) at_warp += b.state[t] == Block::kAtWarpBarrier;
    if (at_warp == 0) continue;
    if (at_warp != end - w) continue;  // Some lanes are still elsewhere (checked below).
    for (unsigned t = w; t < end; ++t) b.state[t] = Block::kRunnable;
    released = true;
  }
  if (released) return true;
  unsigned at_block = 0, done = 0;
  for (Block::State s : b.state) {
    at_block += s == Block::kAtBlockBarrier;
    done += s == Block::kDone;
  }
  if (done == n) return false;
  if (at_block == n) {
    for (Block::State& s : b.state) s = Block::kRunnable;
    return true;
  }
  fail(done > 0 ? "threads wait at a barrier that returned threads never reach"
                : "a warp's lanes wait at different barriers (a shuffle in divergent code)");
}

// Runs the block blockIdx names on `b`'s threads.
void run_block(Block& b) {
  const unsigned threads = unsigned(b.state.size());
  for (Block::State& s : b.state)
    if (s == Block::kDone) s = Block::kRunnable;  // On to this block from the end of the last.
  do {
    for (unsigned i = 0; i < threads; ++i) {
      const unsigned t = reverse_order ? threads - 1 - i : i;
      if (b.state[t] == Block::kNew || b.state[t] == Block::kRunnable) run_until_barrier(b, t);
    }
  } while (release(b));
}

}  // namespace

void launch(dim3 grid, dim3 block, size_t shared_bytes, const std::function<void()>& body) {
  if (running != nullptr) fail("a launch from inside a kernel");
  gridDim = grid;
  blockDim = block;
  const unsigned threads = block.x * block.y * block.z;
  Block b;
  b.body = &body;
  b.start.resize(threads);
  b.resume.resize(threads);
  b.state.assign(threads, Block::kNew);
  b.lanes.assign(threads, 0);
  b.shared.assign(shared_bytes, 0);
  for (unsigned t = 0; t < threads; ++t) {
    b.stacks.emplace_back(new char[kStackBytes]);
    getcontext(&b.start[t]);
    b.start[t].uc_stack.ss_sp = b.stacks.back().get();
    b.start[t].uc_stack.ss_size = kStackBytes;
    b.start[t].uc_link = nullptr;  // thread_entry never returns.
    makecontext(&b.start[t], thread_entry, 0);
  }
  running = &b;
  for (unsigned z = 0; z < grid.z; ++z)
    for (unsigned y = 0; y < grid.y; ++y)
      for (unsigned x = 0; x < grid.x; ++x) {
        blockIdx = dim3(x, y, z);
        run_block(b);
      }
  running = nullptr;
}

void* dynamic_shared() { return running->shared.data(); }
void warp_barrier() { wait(Block::kAtWarpBarrier); }
void block_barrier() { wait(Block::kAtBlockBarrier); }
unsigned linear_thread() { return running->current; }
uint64_t* lane_slots() { return running->lanes.data(); }

}  // namespace pdserve::kernels::gpu::simt
