#include "tests/kvtransfer/kv_fill.h"

#include <cstring>

#include "common/splitmix64.h"

namespace pdserve::kvtransfer::testing {
namespace {

uint64_t mix(uint64_t x) { return splitmix64(x); }

// Calls fn(byte offset, value) for every element of the request's blocks.
template <typename Fn>
void for_each(const engine::KvCacheLayout& layout, const std::vector<int>& blocks, uint64_t salt,
              int stride, Fn fn, size_t first_block = 0) {
  const int bs = layout.block_size();
  for (int l = 0; l < layout.num_layers(); ++l) {
    const engine::LayerKvSpec& spec = layout.spec().layers[l];
    const size_t esize = engine::dtype_size(spec.dtype);
    for (engine::KvPart part : {engine::KvPart::kK, engine::KvPart::kV}) {
      if (part == engine::KvPart::kV && !spec.has_v()) continue;
      const int dim = layout.part_head_dim(l, part);
      for (size_t i = first_block; i < blocks.size(); ++i) {
        for (int slot = 0; slot < bs; ++slot) {
          // Sampling by token position keeps the same elements on sides of different TP.
          if (stride > 1 && (i * bs + slot) % stride != 0) continue;
          for (int h = 0; h < layout.num_local_heads(l); ++h) {
            const uint64_t base = layout.offset(l, part, blocks[i], slot, h);
            const uint64_t key = mix(mix(mix(salt ^ uint64_t(l)) ^ uint64_t(layout.heads(l).begin + h)) ^
                                     (uint64_t(i * bs + slot) << 1 | uint64_t(part)));
            for (int e = 0; e < dim; ++e) {
              fn(base + e * esize, key + uint64_t(e) * 0x9e3779b97f4a7c15ull, esize);
            }
          }
        }
      }
    }
  }
}

}  // namespace

uint64_t request_salt(std::string_view request_id) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (char c : request_id) h = (h ^ uint8_t(c)) * 0x100000001b3ull;
  return mix(h);
}

void fill_request(const engine::KvCacheLayout& layout, void* arena, const std::vector<int>& blocks,
                  uint64_t salt, int stride) {
  auto* bytes = static_cast<uint8_t*>(arena);
  for_each(layout, blocks, salt, stride,
           [&](uint64_t off, uint64_t v, size_t esize) { std::memcpy(bytes + off, &v, esize); });
}

int64_t count_wrong(const engine::KvCacheLayout& layout, const void* arena,
                    const std::vector<int>& blocks, uint64_t salt, int stride, int first_block) {
  const auto* bytes = static_cast<const uint8_t*>(arena);
  int64_t wrong = 0;
  for_each(
      layout, blocks, salt, stride,
      [&](uint64_t off, uint64_t v, size_t esize) { wrong += std::memcmp(bytes + off, &v, esize) != 0; },
      static_cast<size_t>(first_block));
  return wrong;
}

int64_t count_not_sentinel(const engine::KvCacheLayout& layout, const void* arena,
                           const std::vector<int>& blocks, uint8_t sentinel) {
  const auto* bytes = static_cast<const uint8_t*>(arena);
  int64_t touched = 0;
  std::vector<engine::ByteRange> ranges;
  for (int l = 0; l < layout.num_layers(); ++l) {
    for (engine::KvPart part : {engine::KvPart::kK, engine::KvPart::kV}) {
      if (part == engine::KvPart::kV && !layout.spec().layers[l].has_v()) continue;
      for (int b : blocks) {
        ranges.clear();
        layout.ranges(l, b, part, 0, layout.num_local_heads(l), &ranges);
        for (const engine::ByteRange& r : ranges) {
          for (uint64_t i = 0; i < r.length; ++i) touched += bytes[r.offset + i] != sentinel;
        }
      }
    }
  }
  return touched;
}

}  // namespace pdserve::kvtransfer::testing
