// Runs a CUDA/HIP kernel on the CPU, for kernels whose device code is in a header free of vendor
// includes (kernels/gpu/sampling_kernel.h): the block's threads are coroutines that one host
// thread runs in turn, each until its next __syncthreads, blocks one after another.
// __shared__ variables become function statics (one block runs at a time). Include this before
// the kernel's header.
//
// Beyond the results, it checks what a GPU would leave undefined: a __syncthreads that some of
// the block's threads never reach (they returned) aborts the run, and each block runs twice —
// threads first to last, then last to first within every phase between barriers — and the
// caller compares the two runs' results: a kernel whose threads read, within one phase, what
// another thread writes in it gives different results in the two orders.
#pragma once

// Fortify's checked longjmp refuses jumps to another stack, which is what switching coroutines is.
#undef _FORTIFY_SOURCE

#include <setjmp.h>
#include <ucontext.h>

#include <atomic>
#include <bit>
#include <csetjmp>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <vector>

#include <math.h>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __shared__ static

struct SimtDim {
  unsigned x = 0, y = 0, z = 0;
};
inline SimtDim threadIdx, blockIdx, blockDim, gridDim;

namespace pdserve::testing::simt {

struct Block {
  // Each thread starts through its ucontext; after that, switches use _setjmp/_longjmp, which
  // unlike swapcontext make no system call.
  struct Jump {
    std::jmp_buf at;
  };
  std::jmp_buf scheduler;
  std::vector<Jump> resume;
  ucontext_t start_from;
  std::vector<ucontext_t> start;
  std::vector<std::unique_ptr<char[]>> stacks;
  enum State { kNew, kRunnable, kAtBarrier, kDone };
  std::vector<State> state;
  std::function<void()> body;
  unsigned current = 0;
};
inline Block* running = nullptr;

inline void thread_entry() {
  running->body();
  running->state[running->current] = Block::kDone;
  _longjmp(running->scheduler, 1);
}

inline void barrier() {
  Block* b = running;
  b->state[b->current] = Block::kAtBarrier;
  if (_setjmp(b->resume[b->current].at) == 0) _longjmp(b->scheduler, 1);
}

// Runs thread t until its next __syncthreads or its end. A frame of its own, whose locals no
// thread's _longjmp back can clobber.
[[gnu::noinline]] inline void run_until_barrier(Block& b, unsigned t) {
  b.current = t;
  threadIdx = {t, 0, 0};
  if (_setjmp(b.scheduler) != 0) return;
  if (b.state[t] == Block::kNew) {
    b.state[t] = Block::kRunnable;
    swapcontext(&b.start_from, &b.start[t]);
  } else {
    _longjmp(b.resume[t].at, 1);
  }
}

// Runs `body` as one block of `threads` threads, in `reverse` order or not within each phase.
inline void run_block(unsigned threads, bool reverse, const std::function<void()>& body) {
  constexpr size_t kStack = 256 << 10;
  Block b;
  b.body = body;
  b.resume.resize(threads);
  b.start.resize(threads);
  b.state.assign(threads, Block::kNew);
  for (unsigned t = 0; t < threads; ++t) {
    b.stacks.emplace_back(new char[kStack]);
    getcontext(&b.start[t]);
    b.start[t].uc_stack.ss_sp = b.stacks.back().get();
    b.start[t].uc_stack.ss_size = kStack;
    b.start[t].uc_link = nullptr;  // thread_entry never returns.
    makecontext(&b.start[t], thread_entry, 0);
  }
  running = &b;
  for (;;) {
    for (unsigned i = 0; i < threads; ++i) {
      const unsigned t = reverse ? threads - 1 - i : i;
      if (b.state[t] != Block::kNew && b.state[t] != Block::kRunnable) continue;
      run_until_barrier(b, t);
    }
    unsigned waiting = 0, done = 0;
    for (Block::State s : b.state) (s == Block::kAtBarrier ? waiting : done) += 1;
    if (waiting == 0) break;
    if (done > 0) {
      std::fprintf(stderr, "simt emulator: %u threads wait at __syncthreads that %u returned threads never reach\n",
                   waiting, done);
      std::abort();
    }
    for (Block::State& s : b.state) s = Block::kRunnable;
  }
  running = nullptr;
}

// kernel<<<grid, block>>>(args...), each block run in `reverse` thread order or not.
template <typename... Params, typename... Args>
void launch(void (*kernel)(Params...), unsigned grid, unsigned block, bool reverse, Args... args) {
  gridDim = {grid, 1, 1};
  blockDim = {block, 1, 1};
  for (unsigned g = 0; g < grid; ++g) {
    blockIdx = {g, 0, 0};
    run_block(block, reverse, [&] { kernel(args...); });
  }
}

}  // namespace pdserve::testing::simt

inline void __syncthreads() { pdserve::testing::simt::barrier(); }
inline int atomicMax(int* address, int value) {
  std::atomic_ref<int> a(*address);
  int old = a.load();
  while (old < value && !a.compare_exchange_weak(old, value)) {
  }
  return old;
}
inline float __uint_as_float(unsigned bits) { return std::bit_cast<float>(bits); }
inline int min(int a, int b) { return a < b ? a : b; }
