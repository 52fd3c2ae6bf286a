// Fill and verify helpers for real KV arenas in multi-process kvtransfer tests and the
// benchmark: every element of a request's blocks holds a value derived from (salt, layer,
// global head, token position, part, element), written and read through each side's own
// KvCacheLayout. A consumer block i must hold exactly what producer block i held, so any wrong
// offset, head, layer geometry or block shows up as wrong elements.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "engine/kv_cache_layout.h"

namespace pdserve::kvtransfer::testing {

// A salt per request id, so that data left over from an earlier request never verifies.
uint64_t request_salt(std::string_view request_id);

// Writes the request's values into `blocks` (block i holds positions [i*bs, (i+1)*bs)); with
// `stride` > 1 only those of every stride-th token position (what count_wrong() then checks).
void fill_request(const engine::KvCacheLayout& layout, void* arena, const std::vector<int>& blocks,
                  uint64_t salt, int stride = 1);

// Counts the elements of `blocks` that differ from the request's values. `stride` > 1 checks
// only every stride-th token position (for large arenas). `first_block` > 0 checks only request
// blocks [first_block, n) (a transfer with skip_blocks), still at their request positions.
int64_t count_wrong(const engine::KvCacheLayout& layout, const void* arena,
                    const std::vector<int>& blocks, uint64_t salt, int stride = 1,
                    int first_block = 0);

// Counts the bytes of `blocks` (every layer and part this rank holds) that are not `sentinel`:
// blocks a transfer must not have touched.
int64_t count_not_sentinel(const engine::KvCacheLayout& layout, const void* arena,
                           const std::vector<int>& blocks, uint8_t sentinel);

}  // namespace pdserve::kvtransfer::testing
