// The P/D hand-off done by hand in one process, for the hand-off tests: a prefill-only run, the
// copy of its blocks' KV into a decode engine's blocks (layer by layer through each side's
// layout, as kvtransfer would; a layer can be copied from the wrong blocks on purpose), and the
// preloaded decode.
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "engine/engine.h"

namespace pdserve::testing {

// Copies blocks src_blocks[0, num_blocks) of every cache layer of arena `src` (laid out by
// `ls`) into dst_blocks of arena `dst` (laid out by `ld`, same TP rank). Layer `shifted_layer`
// (none when -1) reads block b + 1 (cyclically) instead of b: a wrongly transferred layer.
inline void copy_kv_arena(const engine::KvCacheLayout& ls, const uint8_t* src, const std::vector<int>& src_blocks,
                          const engine::KvCacheLayout& ld, uint8_t* dst, const std::vector<int>& dst_blocks,
                          int num_blocks, int shifted_layer = -1) {
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
          std::memcpy(dst + to[i].offset, src + from[i].offset, from[i].length);
        }
      }
    }
  }
}

// copy_kv_arena between two engines' arenas, every rank (same TP).
inline void copy_kv(const engine::Engine& src, const std::vector<int>& src_blocks, const engine::Engine& dst,
                    const std::vector<int>& dst_blocks, int num_blocks, int shifted_layer = -1) {
  ASSERT_EQ(src.tp(), dst.tp());
  for (int r = 0; r < src.tp(); ++r)
    copy_kv_arena(src.kv_layout(r), src.kv_arena(r), src_blocks, dst.kv_layout(r), dst.kv_arena(r), dst_blocks,
                  num_blocks, shifted_layer);
}

// What a prefill-only request hands over.
struct PrefillHandoff {
  int first_token = -1;
  std::vector<int> blocks;
};

// Runs `prompt` as a prefill-only request "r" on `prefill` to completion (its last `resumed`
// tokens: output of an earlier run).
inline PrefillHandoff run_prefill_only(engine::Engine& prefill, const std::vector<int>& prompt,
                                       const engine::SamplingParams& params, int resumed = 0) {
  engine::GenerationRequest req{"r", prompt, params};
  req.handoff.prefill_only = true;
  req.resumed_tokens = resumed;
  PrefillHandoff out;
  EXPECT_TRUE(prefill.add_request(req, [&](const engine::TokenEvent& ev) {
    if (ev.token >= 0) out.first_token = ev.token;
    if (ev.finished) out.blocks = ev.blocks;
  }).ok());
  EXPECT_TRUE(prefill.run_until_idle().ok());
  return out;
}

// Decodes `prompt` on `decode` from KV already in `blocks`, starting with `first_token`.
inline std::vector<int> decode_preloaded(engine::Engine& decode, const std::vector<int>& prompt,
                                         const engine::SamplingParams& params, const std::vector<int>& blocks,
                                         int first_token, int resumed = 0) {
  engine::GenerationRequest req{"r", prompt, params};
  req.resumed_tokens = resumed;
  req.handoff.preloaded_blocks = blocks;
  req.handoff.first_token = first_token;
  std::vector<int> tokens;
  EXPECT_TRUE(decode.add_request(req, [&](const engine::TokenEvent& ev) {
    if (ev.token >= 0) tokens.push_back(ev.token);
  }).ok());
  EXPECT_TRUE(decode.run_until_idle().ok());
  return tokens;
}

}  // namespace pdserve::testing
