#include "tests/kvtransfer/kv_sim.h"

#include <cstring>

#include "common/splitmix64.h"
#include "engine/kv_cache_layout.h"

namespace pdserve::kvtransfer::testing {
namespace {

using engine::DType;
using engine::KvCacheLayout;
using engine::KvCacheSpec;
using engine::KvKind;
using engine::KvLayout;
using engine::KvOrder;
using engine::KvPart;
using engine::KvSharding;
using engine::LayerKvSpec;


// The value element `elem` of global head `head` at token position `pos` holds. Positions of
// blocks outside the request are made distinct from every request position, so copying the
// wrong block is caught too.
uint64_t element_value(int layer, int head, int64_t pos, KvPart part, int elem) {
  uint64_t x = splitmix64(uint64_t(layer) + 1);
  x = splitmix64(x ^ uint64_t(head));
  x = splitmix64(x ^ uint64_t(pos));
  x = splitmix64(x ^ uint64_t(part));
  return splitmix64(x ^ uint64_t(elem));
}

// Calls fn(slot, local_head, elem, byte offset) for every element of `part` of `block`.
template <typename Fn>
void for_each_element(const KvCacheLayout& layout, int layer, KvPart part, int block, Fn fn) {
  const int dim = layout.part_head_dim(layer, part);
  const size_t esize = engine::dtype_size(layout.spec().layers[layer].dtype);
  for (int slot = 0; slot < layout.block_size(); ++slot) {
    for (int h = 0; h < layout.num_local_heads(layer); ++h) {
      const uint64_t base = layout.offset(layer, part, block, slot, h);
      for (int e = 0; e < dim; ++e) fn(slot, h, e, base + e * esize);
    }
  }
}

std::vector<KvPart> parts_of(const LayerKvSpec& s) {
  if (s.has_v()) return {KvPart::kK, KvPart::kV};
  return {KvPart::kK};
}

std::vector<KvCacheLayout> make_layouts(const KvCacheSpec& spec, int tp, int num_blocks) {
  std::vector<KvCacheLayout> out;
  for (int r = 0; r < tp; ++r) out.push_back(KvCacheLayout::create(spec, r, tp, num_blocks).value());
  return out;
}

}  // namespace

std::string SimReport::describe() const {
  return absl::StrCat("plan_status=", plan_status.ToString(), " out_of_bounds_ops=", out_of_bounds_ops,
                      " wrong_elements=", wrong_elements, " unwritten_bytes=", unwritten_bytes,
                      " rewritten_bytes=", rewritten_bytes, " stray_bytes=", stray_bytes, " ops=", ops,
                      " bytes=", bytes);
}

SimReport simulate(const KvCacheSpec& spec, const SimRequest& req, const SimFaults& faults) {
  SimReport report;
  const int bs = spec.block_size;
  const std::vector<KvCacheLayout> producers = make_layouts(spec, req.producer_tp, req.producer_num_blocks);
  const std::vector<KvCacheLayout> consumers = make_layouts(spec, req.consumer_tp, req.consumer_num_blocks);

  // Request position of each producer block's first token; blocks outside the request get
  // positions beyond any request position.
  std::vector<int64_t> producer_pos(req.producer_num_blocks);
  for (int b = 0; b < req.producer_num_blocks; ++b) producer_pos[b] = int64_t(1 << 20) + int64_t(b) * bs;
  for (size_t i = 0; i < req.producer_blocks.size(); ++i) producer_pos[req.producer_blocks[i]] = int64_t(i) * bs;

  std::vector<std::vector<uint8_t>> src(req.producer_tp);
  for (int p = 0; p < req.producer_tp; ++p) {
    const KvCacheLayout& L = producers[p];
    src[p].assign(L.total_bytes(), 0);
    for (int l = 0; l < L.num_layers(); ++l) {
      const size_t esize = engine::dtype_size(spec.layers[l].dtype);
      for (KvPart part : parts_of(spec.layers[l])) {
        for (int b = 0; b < L.num_blocks(); ++b) {
          for_each_element(L, l, part, b, [&](int slot, int h, int e, uint64_t off) {
            const uint64_t v = element_value(l, L.heads(l).begin + h, producer_pos[b] + slot, part, e);
            std::memcpy(&src[p][off], &v, esize);
          });
        }
      }
    }
  }

  std::vector<std::vector<uint8_t>> dst(req.consumer_tp), writes(req.consumer_tp);
  for (int c = 0; c < req.consumer_tp; ++c) {
    dst[c].assign(consumers[c].total_bytes(), 0xEE);
    writes[c].assign(consumers[c].total_bytes(), 0);
  }

  const KvCacheSpec& planning_spec = faults.planning_spec ? *faults.planning_spec : spec;
  const std::vector<KvCacheLayout> plan_producers =
      make_layouts(planning_spec, req.producer_tp, req.producer_num_blocks);
  const std::vector<KvCacheLayout> plan_consumers =
      make_layouts(planning_spec, req.consumer_tp, req.consumer_num_blocks);
  RankMap map = build_rank_map(req.producer_tp, req.consumer_tp, planning_spec).value();
  if (faults.mutate_map) faults.mutate_map(map);

  for (int p = 0; p < req.producer_tp; ++p) {
    const std::vector<uint8_t>& from = src[faults.producer_arena_of.empty() ? p : faults.producer_arena_of[p]];
    for (int c = 0; c < req.consumer_tp; ++c) {
      StatusOr<TransferPlan> plan = plan_for_pair(p, c, map, plan_producers[p], plan_consumers[c],
                                                  req.producer_blocks, req.consumer_blocks);
      if (!plan.ok()) {
        if (report.plan_status.ok()) report.plan_status = plan.status();
        continue;
      }
      if (faults.mutate_plan) faults.mutate_plan(*plan);
      for (const LayerCopies& layer : plan->layers) {
        for (const CopyOp& op : layer.ops) {
          ++report.ops;
          report.bytes += op.length;
          if (op.src_offset + op.length > from.size() || op.dst_offset + op.length > dst[c].size()) {
            ++report.out_of_bounds_ops;
            continue;
          }
          std::memcpy(&dst[c][op.dst_offset], &from[op.src_offset], op.length);
          for (uint64_t i = 0; i < op.length; ++i) {
            if (writes[c][op.dst_offset + i] < 255) ++writes[c][op.dst_offset + i];
          }
        }
      }
    }
  }

  for (int c = 0; c < req.consumer_tp; ++c) {
    const KvCacheLayout& L = consumers[c];
    std::vector<bool> in_request(L.total_bytes(), false);
    for (int l = 0; l < L.num_layers(); ++l) {
      const size_t esize = engine::dtype_size(spec.layers[l].dtype);
      for (KvPart part : parts_of(spec.layers[l])) {
        for (size_t i = 0; i < req.consumer_blocks.size(); ++i) {
          for_each_element(L, l, part, req.consumer_blocks[i], [&](int slot, int h, int e, uint64_t off) {
            const uint64_t v = element_value(l, L.heads(l).begin + h, int64_t(i) * bs + slot, part, e);
            if (std::memcmp(&dst[c][off], &v, esize) != 0) ++report.wrong_elements;
            for (size_t k = 0; k < esize; ++k) in_request[off + k] = true;
          });
        }
      }
    }
    for (size_t i = 0; i < in_request.size(); ++i) {
      const int n = writes[c][i];
      if (!in_request[i]) {
        report.stray_bytes += n > 0;
      } else if (n == 0) {
        ++report.unwritten_bytes;
      } else if (n > 1) {
        ++report.rewritten_bytes;
      }
    }
  }
  return report;
}

KvCacheSpec mixed_spec() {
  auto layer = [](KvKind kind, KvSharding sharding, int heads, int head_dim, int v_head_dim, DType dtype,
                  KvLayout layout, KvOrder order) {
    LayerKvSpec s;
    s.kind = kind;
    s.sharding = sharding;
    s.num_kv_heads = heads;
    s.head_dim = head_dim;
    s.v_head_dim = v_head_dim;
    s.dtype = dtype;
    s.layout = layout;
    s.order = order;
    return s;
  };
  constexpr auto kv = KvKind::kKv, key_only = KvKind::kKeyOnly;
  constexpr auto by_head = KvSharding::kByHead, replicated = KvSharding::kReplicated;
  constexpr auto f32 = DType::kF32, bf16 = DType::kBF16;
  constexpr auto sep = KvLayout::kSeparate, inter = KvLayout::kInterleaved;
  constexpr auto tok = KvOrder::kTokenMajor, head = KvOrder::kHeadMajor, outer = KvOrder::kHeadOuter;
  KvCacheSpec spec;
  spec.block_size = 4;
  spec.layers = {
      layer(kv, by_head, 8, 8, 8, f32, sep, tok),
      layer(kv, by_head, 4, 16, 8, bf16, inter, head),
      layer(key_only, by_head, 2, 8, 0, bf16, inter, tok),
      layer(kv, by_head, 1, 4, 4, f32, sep, head),
      layer(kv, replicated, 2, 8, 8, f32, inter, tok),
      layer(kv, by_head, 8, 4, 4, bf16, sep, head),
      layer(key_only, replicated, 1, 16, 0, f32, sep, head),
      layer(kv, by_head, 2, 8, 16, f32, inter, tok),
      layer(key_only, by_head, 4, 4, 0, f32, sep, head),
      layer(kv, by_head, 8, 8, 4, bf16, sep, outer),
      layer(key_only, by_head, 2, 4, 0, f32, sep, outer),
  };
  spec.layers[7].window = 8;
  return spec;
}

}  // namespace pdserve::kvtransfer::testing
