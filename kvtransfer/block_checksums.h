// Debug block checksums of one transfer pair, as pure functions over an arena and the pair's
// TransferPlan: one FNV-1a checksum per sent request block of the bytes the plan moves into that
// consumer block, in op order. Both sides compute them — the producer over the ops' source bytes
// before it notifies, the consumer over the destination bytes once they arrived — and attribute
// bytes to blocks by the consumer's offsets, so equal sums mean the block arrived whole
// (KvEndpointOptions::checksums). Kept apart from the endpoint so that they can be tested alone.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "common/status.h"
#include "engine/kv_cache_layout.h"
#include "kvtransfer/transfer_plan.h"

namespace pdserve::kvtransfer {

// Which end of each CopyOp the bytes are read at.
enum class ChecksumSide : uint8_t {
  kSource,       // Producer: the bytes about to be (or that were) sent.
  kDestination,  // Consumer: the bytes received.
};

// One checksum per entry of `consumer_blocks` (the sent blocks, in request order) over `arena`
// (this side's, laid out as the plan's ops say for `side`). `consumer` is the consumer rank's
// layout: it says which consumer block every destination byte belongs to.
std::vector<uint64_t> block_checksums(const engine::KvCacheLayout& consumer, const uint8_t* arena,
                                      std::span<const int> consumer_blocks, const TransferPlan& plan,
                                      ChecksumSide side);

// OK when `received` equals `expected`; DATA_LOSS naming the first differing block otherwise.
// The block lists are the request's whole lists; checksum s is of request block skip_blocks + s.
Status compare_block_checksums(std::span<const uint64_t> received, std::span<const uint64_t> expected,
                               const std::string& request_id, int producer_rank, int consumer_rank,
                               std::span<const int> producer_blocks, std::span<const int> consumer_blocks,
                               int skip_blocks);

}  // namespace pdserve::kvtransfer
