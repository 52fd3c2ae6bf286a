// The per-layer KV cache specification: the single source of truth for cache geometry.
// The model, the paged cache allocator and kvtransfer all derive every byte offset from it;
// nothing infers a layer's layout from another layer or from a tensor. Public reports of P/D
// serving show what goes wrong otherwise (a transfer that assumed layer 0's layout for every
// layer "completed" and produced garbage).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/dtype.h"

namespace pdserve::engine {

// What a layer caches: keys and values, or keys only (e.g. a sparse-attention index cache).
enum class KvKind : uint8_t { kKv = 0, kKeyOnly = 1 };

// How a layer's KV heads are spread over tensor-parallel ranks: split by head (replicated when
// ranks outnumber heads), or held whole by every rank.
enum class KvSharding : uint8_t { kByHead = 0, kReplicated = 1 };

// Where K and V of one block live: in two separate tensors (K tensor, V tensor), or next to
// each other inside each block ([K part][V part] per block).
enum class KvLayout : uint8_t { kSeparate = 0, kInterleaved = 1 };

// Element order of a layer's K (or V) part. Token-major and head-major order the elements
// inside each block: [block][token][head][dim] or [block][head][token][dim]. Head-outer gives
// each KV head its own pool of blocks, [head][block][token][dim] (separate layout only): the
// same head of consecutive blocks is contiguous, so a transfer between different TP degrees —
// which moves head ranges — sends one op per run of blocks instead of one per block.
enum class KvOrder : uint8_t { kTokenMajor = 0, kHeadMajor = 1, kHeadOuter = 2 };

// "token-major", "head-major" or "head-outer".
const char* kv_order_name(KvOrder order);

// One layer's cache. Head counts are the model's (global) counts; a rank's share comes from
// engine/tp_shard.h.
struct LayerKvSpec {
  KvKind kind = KvKind::kKv;
  KvSharding sharding = KvSharding::kByHead;
  int num_kv_heads = 0;
  int head_dim = 0;    // K head dim.
  int v_head_dim = 0;  // V head dim; 0 for key-only layers.
  DType dtype = DType::kF32;
  KvLayout layout = KvLayout::kSeparate;
  KvOrder order = KvOrder::kTokenMajor;
  int window = 0;  // Sliding-window length in tokens; 0 means full attention.

  bool has_v() const { return kind == KvKind::kKv; }
  bool operator==(const LayerKvSpec&) const = default;
};

// The whole model's cache: one spec per layer plus the tokens per block.
struct KvCacheSpec {
  int block_size = 16;
  std::vector<LayerKvSpec> layers;

  bool operator==(const KvCacheSpec&) const = default;
  // A stable 64-bit hash of every field, for compatibility checks between processes.
  uint64_t fingerprint() const;
  // Human-readable one-line-per-layer description, for logs and error messages.
  std::string describe() const;
};

// The K or V part of a block (key-only layers have only kK).
enum class KvPart : uint8_t { kK = 0, kV = 1 };

}  // namespace pdserve::engine
