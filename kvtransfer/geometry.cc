#include "kvtransfer/geometry.h"

namespace pdserve::kvtransfer {
namespace {

using engine::KvCacheLayout;
using engine::KvLayout;
using engine::KvOrder;
using engine::KvPart;

Status check_blocks(const char* side, const KvCacheLayout& layout, std::span<const int> blocks) {
  for (int b : blocks) {
    if (b < 0 || b >= layout.num_blocks()) {
      return absl::InvalidArgumentError(absl::StrCat("geometry: ", side, " block ", b, " outside its ",
                                                     layout.num_blocks(), "-block arena"));
    }
  }
  return absl::OkStatus();
}

Status check_heads(const char* side, const KvCacheLayout& layout, const RankMapEntry& e) {
  const engine::Range held = layout.heads(e.layer);
  if (e.head_begin < held.begin || e.head_end > held.end) {
    return absl::InvalidArgumentError(absl::StrCat(
        "geometry: layer ", e.layer, " heads [", e.head_begin, ", ", e.head_end, ") not held by ", side,
        " rank ", layout.rank(), " of TP ", layout.tp(), ", which holds [", held.begin, ", ", held.end, ")"));
  }
  return absl::OkStatus();
}

void append_merged(std::vector<CopyOp>* out, uint64_t src, uint64_t dst, uint64_t length) {
  if (!out->empty()) {
    CopyOp& last = out->back();
    if (last.src_offset + last.length == src && last.dst_offset + last.length == dst) {
      last.length += length;
      return;
    }
  }
  out->push_back({src, dst, length});
}

}  // namespace

Status append_copy_ops(const KvCacheLayout& producer, const KvCacheLayout& consumer, const RankMapEntry& entry,
                       std::span<const int> producer_blocks, std::span<const int> consumer_blocks,
                       std::vector<CopyOp>* out) {
  // The fingerprint covers every field of the geometry (and is what the handshake's compat hash
  // trusts); comparing it, cached, keeps this check off a small transfer's planning time.
  if (producer.spec_fingerprint() != consumer.spec_fingerprint()) {
    return absl::FailedPreconditionError(
        absl::StrCat("geometry: producer and consumer KV specs differ (fingerprints ",
                     producer.spec_fingerprint(), " vs ", consumer.spec_fingerprint(), ")"));
  }
  if (entry.layer < 0 || entry.layer >= producer.num_layers()) {
    return absl::InvalidArgumentError(
        absl::StrCat("geometry: layer ", entry.layer, " outside the spec's ", producer.num_layers(), " layers"));
  }
  if (entry.head_begin >= entry.head_end) {
    return absl::InvalidArgumentError(absl::StrCat("geometry: layer ", entry.layer, " empty head range [",
                                                   entry.head_begin, ", ", entry.head_end, ")"));
  }
  if (producer_blocks.size() != consumer_blocks.size()) {
    return absl::InvalidArgumentError(absl::StrCat("geometry: ", producer_blocks.size(), " producer blocks but ",
                                                   consumer_blocks.size(), " consumer blocks"));
  }
  PD_RETURN_IF_ERROR(check_blocks("producer", producer, producer_blocks));
  PD_RETURN_IF_ERROR(check_blocks("consumer", consumer, consumer_blocks));
  PD_RETURN_IF_ERROR(check_heads("producer", producer, entry));
  PD_RETURN_IF_ERROR(check_heads("consumer", consumer, entry));

  const int layer = entry.layer;
  const engine::LayerKvSpec& s = producer.spec().layers[layer];
  const int heads = entry.head_end - entry.head_begin;
  const int src_head = entry.head_begin - producer.heads(layer).begin;
  const int dst_head = entry.head_begin - consumer.heads(layer).begin;
  const int block_size = producer.block_size();

  // The pieces of one block's part, in address order on both sides. Head-major keeps a head
  // range of a block contiguous; token-major spreads it over one run per token, which merges
  // back into one only when the range is every local head on both sides.
  auto append_part = [&](size_t i, KvPart part) {
    const int pb = producer_blocks[i], cb = consumer_blocks[i];
    const uint64_t run = uint64_t(heads) * producer.part_head_dim(layer, part) * engine::dtype_size(s.dtype);
    if (s.order == KvOrder::kHeadMajor) {
      append_merged(out, producer.offset(layer, part, pb, 0, src_head), consumer.offset(layer, part, cb, 0, dst_head),
                    run * uint64_t(block_size));
      return;
    }
    for (int slot = 0; slot < block_size; ++slot) {
      append_merged(out, producer.offset(layer, part, pb, slot, src_head),
                    consumer.offset(layer, part, cb, slot, dst_head), run);
    }
  };
  // Visit blocks and parts in arena order so that consecutive blocks can merge: a separate
  // layout stores all blocks' K and then all blocks' V; an interleaved one stores K then V of
  // each block; head-outer stores each head's blocks together, so its runs go head by head.
  const bool has_v = s.has_v();
  if (s.order == KvOrder::kHeadOuter) {
    for (KvPart part : {KvPart::kK, KvPart::kV}) {
      if (part == KvPart::kV && !has_v) break;
      const uint64_t run = producer.block_stride(layer, part);  // One head of one block.
      for (int h = 0; h < heads; ++h) {
        for (size_t i = 0; i < producer_blocks.size(); ++i) {
          append_merged(out, producer.offset(layer, part, producer_blocks[i], 0, src_head + h),
                        consumer.offset(layer, part, consumer_blocks[i], 0, dst_head + h), run);
        }
      }
    }
  } else if (s.layout == KvLayout::kSeparate) {
    for (KvPart part : {KvPart::kK, KvPart::kV}) {
      if (part == KvPart::kV && !has_v) break;
      for (size_t i = 0; i < producer_blocks.size(); ++i) append_part(i, part);
    }
  } else {
    for (size_t i = 0; i < producer_blocks.size(); ++i) {
      append_part(i, KvPart::kK);
      if (has_v) append_part(i, KvPart::kV);
    }
  }
  return absl::OkStatus();
}

}  // namespace pdserve::kvtransfer
