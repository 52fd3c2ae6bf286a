#include "engine/kv_cache_layout.h"

namespace pdserve::engine {
namespace {

Status validate(const KvCacheSpec& spec, int tp) {
  if (spec.block_size <= 0) return absl::InvalidArgumentError("KV block size must be positive");
  if (spec.layers.empty()) return absl::InvalidArgumentError("KV cache spec has no layers");
  for (size_t l = 0; l < spec.layers.size(); ++l) {
    const LayerKvSpec& s = spec.layers[l];
    if (s.num_kv_heads <= 0 || s.head_dim <= 0 || (s.has_v() && s.v_head_dim <= 0))
      return absl::InvalidArgumentError(absl::StrCat("layer ", l, ": bad KV head count or dims"));
    if (s.order == KvOrder::kHeadOuter && s.layout != KvLayout::kSeparate)
      return absl::InvalidArgumentError(
          absl::StrCat("layer ", l, ": head-outer order needs the separate K/V layout"));
    if (s.sharding == KvSharding::kByHead && !kv_heads_divide(s.num_kv_heads, tp))
      return absl::InvalidArgumentError(absl::StrCat("layer ", l, ": ", s.num_kv_heads,
                                                     " KV heads cannot be spread over TP ", tp));
  }
  return absl::OkStatus();
}

Range held_heads(const LayerKvSpec& s, int tp, int rank) {
  if (s.sharding == KvSharding::kReplicated) return {0, s.num_kv_heads};
  return kv_heads_of_rank(s.num_kv_heads, tp, rank);
}

}  // namespace

StatusOr<uint64_t> KvCacheLayout::bytes_per_block(const KvCacheSpec& spec, int tp) {
  PD_ASSIGN_OR_RETURN(KvCacheLayout one, create(spec, 0, tp, 1));
  return one.total_bytes();
}

StatusOr<KvCacheLayout> KvCacheLayout::create(const KvCacheSpec& spec, int rank, int tp,
                                              int num_blocks) {
  if (tp <= 0 || rank < 0 || rank >= tp)
    return absl::InvalidArgumentError(absl::StrCat("bad rank ", rank, " of TP ", tp));
  if (num_blocks < 0) return absl::InvalidArgumentError("negative block count");
  PD_RETURN_IF_ERROR(validate(spec, tp));
  KvCacheLayout layout;
  layout.spec_ = spec;
  layout.spec_fingerprint_ = spec.fingerprint();
  layout.rank_ = rank;
  layout.tp_ = tp;
  layout.num_blocks_ = num_blocks;
  uint64_t base = 0;
  for (const LayerKvSpec& s : spec.layers) {
    LayerPlacement p;
    p.heads = held_heads(s, tp, rank);
    const uint64_t per_head_token = dtype_size(s.dtype);
    p.k_bytes = uint64_t(spec.block_size) * p.heads.size() * s.head_dim * per_head_token;
    p.v_bytes = s.has_v() ? uint64_t(spec.block_size) * p.heads.size() * s.v_head_dim * per_head_token : 0;
    p.base = base;
    base += (p.k_bytes + p.v_bytes) * uint64_t(num_blocks);
    layout.layers_.push_back(p);
  }
  layout.total_bytes_ = base;
  return layout;
}

int KvCacheLayout::part_head_dim(int layer, KvPart part) const {
  const LayerKvSpec& s = spec_.layers[layer];
  return part == KvPart::kK ? s.head_dim : s.v_head_dim;
}

uint64_t KvCacheLayout::part_bytes(int layer, KvPart part) const {
  return part == KvPart::kK ? layers_[layer].k_bytes : layers_[layer].v_bytes;
}

uint64_t KvCacheLayout::block_stride(int layer, KvPart part) const {
  const LayerKvSpec& s = spec_.layers[layer];
  const LayerPlacement& p = layers_[layer];
  if (s.order == KvOrder::kHeadOuter) {
    return uint64_t(spec_.block_size) * part_head_dim(layer, part) * dtype_size(s.dtype);
  }
  return s.layout == KvLayout::kSeparate ? part_bytes(layer, part) : p.k_bytes + p.v_bytes;
}

int64_t KvCacheLayout::token_stride(int layer, KvPart part) const {
  const int hd = part_head_dim(layer, part);
  return spec_.layers[layer].order == KvOrder::kTokenMajor ? int64_t(num_local_heads(layer)) * hd : hd;
}

int64_t KvCacheLayout::head_stride(int layer, KvPart part) const {
  const int hd = part_head_dim(layer, part);
  switch (spec_.layers[layer].order) {
    case KvOrder::kTokenMajor: return hd;
    case KvOrder::kHeadMajor: return int64_t(spec_.block_size) * hd;
    case KvOrder::kHeadOuter: return int64_t(num_blocks_) * spec_.block_size * hd;
  }
  return 0;
}

uint64_t KvCacheLayout::offset(int layer, KvPart part, int block, int slot, int local_head) const {
  const LayerKvSpec& s = spec_.layers[layer];
  const LayerPlacement& p = layers_[layer];
  uint64_t part_start;
  if (s.layout == KvLayout::kSeparate) {
    part_start = p.base + (part == KvPart::kK ? 0 : p.k_bytes * uint64_t(num_blocks_)) +
                 uint64_t(block) * block_stride(layer, part);
  } else {
    part_start = p.base + uint64_t(block) * (p.k_bytes + p.v_bytes) + (part == KvPart::kK ? 0 : p.k_bytes);
  }
  const int64_t elem = slot * token_stride(layer, part) + local_head * head_stride(layer, part);
  return part_start + uint64_t(elem) * dtype_size(s.dtype);
}

kernels::PagedLayerView KvCacheLayout::view(int layer, void* arena) const {
  const LayerKvSpec& s = spec_.layers[layer];
  const uint64_t elem = dtype_size(s.dtype);
  uint8_t* base = static_cast<uint8_t*>(arena);
  kernels::PagedLayerView v;
  switch (s.dtype) {
    case DType::kF32: v.storage = kernels::Storage::kF32; break;
    case DType::kF16: v.storage = kernels::Storage::kF16; break;
    case DType::kBF16: v.storage = kernels::Storage::kBF16; break;
  }
  v.block_size = spec_.block_size;
  v.head_dim = part_head_dim(layer, KvPart::kK);
  v.k = base + offset(layer, KvPart::kK, 0, 0, 0);
  v.k_block_stride = int64_t(block_stride(layer, KvPart::kK) / elem);
  v.k_token_stride = token_stride(layer, KvPart::kK);
  v.k_head_stride = head_stride(layer, KvPart::kK);
  if (s.has_v()) {
    v.v_head_dim = part_head_dim(layer, KvPart::kV);
    v.v = base + offset(layer, KvPart::kV, 0, 0, 0);
    v.v_block_stride = int64_t(block_stride(layer, KvPart::kV) / elem);
    v.v_token_stride = token_stride(layer, KvPart::kV);
    v.v_head_stride = head_stride(layer, KvPart::kV);
  }
  return v;
}

void KvCacheLayout::ranges(int layer, int block, KvPart part, int head_begin, int head_end,
                           std::vector<ByteRange>* out) const {
  if (head_end <= head_begin) return;
  const LayerKvSpec& s = spec_.layers[layer];
  const uint64_t head_bytes = uint64_t(part_head_dim(layer, part)) * dtype_size(s.dtype);
  auto append = [out](uint64_t offset, uint64_t length) {
    if (!out->empty() && out->back().offset + out->back().length == offset) {
      out->back().length += length;
    } else {
      out->push_back({offset, length});
    }
  };
  if (s.order == KvOrder::kHeadMajor) {
    append(offset(layer, part, block, 0, head_begin),
           head_bytes * uint64_t(head_end - head_begin) * uint64_t(spec_.block_size));
    return;
  }
  if (s.order == KvOrder::kHeadOuter) {
    for (int h = head_begin; h < head_end; ++h) {
      append(offset(layer, part, block, 0, h), head_bytes * uint64_t(spec_.block_size));
    }
    return;
  }
  for (int slot = 0; slot < spec_.block_size; ++slot) {
    append(offset(layer, part, block, slot, head_begin), head_bytes * uint64_t(head_end - head_begin));
  }
}

}  // namespace pdserve::engine
