// The pool of KV cache blocks of one engine (the same block ids on every TP rank). Blocks are
// reference counted: a sequence holds its blocks, and kvtransfer holds them while a transfer
// reads or writes them, so a block returns to the free list exactly once, when its last holder
// lets go. Thread-safe: transfers complete on other threads than the scheduler.
#pragma once

#include <mutex>
#include <vector>

#include "common/status.h"

namespace pdserve::engine {

class BlockAllocator {
 public:
  explicit BlockAllocator(int num_blocks);

  // Takes `count` free blocks (reference count 1 each); ResourceExhausted if too few are free.
  // A fresh pool hands out ascending ids, and a request's blocks released together come back
  // in the same order: long ascending runs let kvtransfer coalesce consecutive blocks.
  StatusOr<std::vector<int>> allocate(int count);
  // Adds one reference to each block (they must be allocated).
  Status retain(const std::vector<int>& blocks);
  // Drops one reference from each block; blocks reaching zero become free. FailedPrecondition
  // (and no change at all) if any block is not allocated: a double free is a bug to surface.
  Status release(const std::vector<int>& blocks);

  int num_blocks() const { return int(refs_.size()); }
  int num_free() const;
  int ref_count(int block) const;

 private:
  Status check_allocated(const std::vector<int>& blocks) const;  // Caller holds mu_.
  mutable std::mutex mu_;
  std::vector<int> refs_;
  std::vector<int> free_;  // A stack: recently freed blocks are reused first (warm in cache).
};

}  // namespace pdserve::engine
