// The P/D hand-off done by hand in one process: copies the KV of a prefill engine's blocks into
// a decode engine's blocks, layer by layer through each side's layout, as kvtransfer would.
// Shared by the hand-off tests; a layer can be copied from the wrong blocks on purpose.
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "engine/engine.h"

namespace pdserve::testing {

// Copies blocks src_blocks[0, num_blocks) of every cache layer on `src` into dst_blocks on
// `dst` (same TP). Layer `shifted_layer` (none when -1) reads block b + 1 (cyclically) instead
// of b: a wrongly transferred layer.
inline void copy_kv(const engine::Engine& src, const std::vector<int>& src_blocks, const engine::Engine& dst,
                    const std::vector<int>& dst_blocks, int num_blocks, int shifted_layer = -1) {
  ASSERT_EQ(src.tp(), dst.tp());
  for (int r = 0; r < src.tp(); ++r) {
    const engine::KvCacheLayout& ls = src.kv_layout(r);
    const engine::KvCacheLayout& ld = dst.kv_layout(r);
    for (int l = 0; l < ls.num_layers(); ++l) {
      for (engine::KvPart part : {engine::KvPart::kK, engine::KvPart::kV}) {
        if (ls.part_bytes(l, part) == 0) continue;
        for (int b = 0; b < num_blocks; ++b) {
          const int from_block = l == shifted_layer ? src_blocks[(b + 1) % num_blocks] : src_blocks[b];
          // A block's part is one range, or one per head (head-outer order).
          std::vector<engine::ByteRange> from, to;
          ls.ranges(l, from_block, part, 0, ls.num_local_heads(l), &from);
          ld.ranges(l, dst_blocks[b], part, 0, ld.num_local_heads(l), &to);
          ASSERT_EQ(from.size(), to.size());
          for (size_t i = 0; i < from.size(); ++i) {
            ASSERT_EQ(from[i].length, to[i].length);
            std::memcpy(dst.kv_arena(r) + to[i].offset, src.kv_arena(r) + from[i].offset, from[i].length);
          }
        }
      }
    }
  }
}

}  // namespace pdserve::testing
