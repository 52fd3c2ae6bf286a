#include "engine/kv_spec.h"

#include "absl/strings/str_cat.h"

namespace pdserve::engine {
namespace {
// FNV-1a, 64 bit: stable across processes, builds and machines (unlike std::hash).
void mix(uint64_t& h, uint64_t v) {
  for (int i = 0; i < 8; ++i) {
    h ^= (v >> (8 * i)) & 0xff;
    h *= 1099511628211ull;
  }
}
}  // namespace

const char* kv_order_name(KvOrder order) {
  switch (order) {
    case KvOrder::kTokenMajor: return "token-major";
    case KvOrder::kHeadMajor: return "head-major";
    case KvOrder::kHeadOuter: return "head-outer";
  }
  return "?";
}

uint64_t KvCacheSpec::fingerprint() const {
  uint64_t h = 1469598103934665603ull;
  mix(h, uint64_t(block_size));
  mix(h, layers.size());
  for (const LayerKvSpec& s : layers) {
    mix(h, uint64_t(s.kind));
    mix(h, uint64_t(s.sharding));
    mix(h, uint64_t(s.num_kv_heads));
    mix(h, uint64_t(s.head_dim));
    mix(h, uint64_t(s.v_head_dim));
    mix(h, uint64_t(s.dtype));
    mix(h, uint64_t(s.layout));
    mix(h, uint64_t(s.order));
    mix(h, uint64_t(s.window));
  }
  return h;
}

std::string KvCacheSpec::describe() const {
  std::string out = absl::StrCat("block_size=", block_size);
  for (size_t l = 0; l < layers.size(); ++l) {
    const LayerKvSpec& s = layers[l];
    absl::StrAppend(&out, "\n  layer ", l, ": ", s.kind == KvKind::kKv ? "kv" : "key-only",
                    s.sharding == KvSharding::kReplicated ? " replicated" : "", " heads=",
                    s.num_kv_heads, " head_dim=", s.head_dim, " v_head_dim=", s.v_head_dim, " ",
                    dtype_name(s.dtype), s.layout == KvLayout::kSeparate ? " separate" : " interleaved",
                    " ", kv_order_name(s.order),
                    s.window ? absl::StrCat(" window=", s.window) : "");
  }
  return out;
}

}  // namespace pdserve::engine
