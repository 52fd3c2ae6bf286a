#include "kvtransfer/block_checksums.h"

#include <algorithm>
#include <tuple>

#include "absl/strings/str_cat.h"

namespace pdserve::kvtransfer {
namespace {

constexpr uint64_t kFnvSeed = 0xcbf29ce484222325ull;

// FNV-1a, continued over the pieces of one block in op order.
uint64_t fnv1a(uint64_t h, const uint8_t* p, uint64_t n) {
  for (uint64_t i = 0; i < n; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}

}  // namespace

std::vector<uint64_t> block_checksums(const engine::KvCacheLayout& consumer, const uint8_t* arena,
                                      std::span<const int> consumer_blocks, const TransferPlan& plan,
                                      ChecksumSide side) {
  std::vector<uint64_t> sums(consumer_blocks.size(), kFnvSeed);
  std::vector<engine::ByteRange> ranges;
  for (size_t l = 0; l < plan.layers.size(); ++l) {
    const int layer = static_cast<int>(l);
    // (start, end, position) of every consumer block part of the request in this layer.
    std::vector<std::tuple<uint64_t, uint64_t, size_t>> parts;
    const bool has_v = consumer.spec().layers[l].has_v();
    for (size_t i = 0; i < consumer_blocks.size(); ++i) {
      for (engine::KvPart part : {engine::KvPart::kK, engine::KvPart::kV}) {
        if (part == engine::KvPart::kV && !has_v) continue;
        // A block's part is one range, or one per head in head-outer order: the layout says.
        ranges.clear();
        consumer.ranges(layer, consumer_blocks[i], part, 0, consumer.num_local_heads(layer), &ranges);
        for (const engine::ByteRange& r : ranges) parts.emplace_back(r.offset, r.offset + r.length, i);
      }
    }
    std::sort(parts.begin(), parts.end());
    for (const CopyOp& op : plan.layers[l].ops) {
      uint64_t done = 0;
      while (done < op.length) {
        const uint64_t dst = op.dst_offset + done;
        auto it = std::upper_bound(parts.begin(), parts.end(), std::make_tuple(dst, UINT64_MAX, SIZE_MAX));
        if (it == parts.begin() || std::get<1>(*std::prev(it)) <= dst) break;  // Outside.
        const auto& [start, end, pos] = *std::prev(it);
        const uint64_t n = std::min(op.length - done, end - dst);
        const uint64_t at = (side == ChecksumSide::kSource ? op.src_offset : op.dst_offset) + done;
        sums[pos] = fnv1a(sums[pos], arena + at, n);
        done += n;
      }
    }
  }
  return sums;
}

Status compare_block_checksums(std::span<const uint64_t> received, std::span<const uint64_t> expected,
                               const std::string& request_id, int producer_rank, int consumer_rank,
                               std::span<const int> producer_blocks, std::span<const int> consumer_blocks,
                               int skip_blocks) {
  if (expected.size() != received.size()) {
    return absl::DataLossError(absl::StrCat("request ", request_id, ": producer rank ", producer_rank, " sent ",
                                            expected.size(), " block checksums for ", received.size(), " blocks"));
  }
  for (size_t s = 0; s < received.size(); ++s) {
    if (received[s] == expected[s]) continue;
    const size_t i = s + static_cast<size_t>(skip_blocks);  // The request block.
    const std::string producer_block = i < producer_blocks.size() ? absl::StrCat(producer_blocks[i]) : std::string("?");
    return absl::DataLossError(absl::StrCat("request ", request_id, ": checksum mismatch in consumer block ",
                                            consumer_blocks[i], " (producer block ", producer_block, ", request block ",
                                            i, ") between producer rank ", producer_rank, " and consumer rank ",
                                            consumer_rank));
  }
  return absl::OkStatus();
}

}  // namespace pdserve::kvtransfer
