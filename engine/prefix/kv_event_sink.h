// Where a KV cache reports its set transitions, for KV events (docs/kv_events.md): a key is
// "stored" once when it becomes present in a tier and "removed" once when it stops being
// present, never twice in a row, so a consumer that applies them in order holds exactly the
// cache's key set. The engine's prefix cache (device tier) and its host and filesystem tiers
// call it; a worker's publisher implements it. Calls come from the engine's scheduler thread, a
// transfer thread releasing blocks, or the filesystem tier's threads (which end a batch after
// each file's events: no engine step ends them), always under the tier's lock and in causal
// order: implementations must be quick and must not call back into the engine.
#pragma once

#include <cstdint>
#include <optional>
#include <span>

#include "engine/prefix/block_key.h"

namespace pdserve::engine {

enum class KvTier : uint8_t { kDevice = 1, kHost = 2, kDisk = 3 };

class KvEventSink {
 public:
  virtual ~KvEventSink() = default;
  // `keys` became present in `tier`: a chain in which keys[0]'s predecessor is `parent`
  // (nullopt: keys[0] starts its namespace) and keys[i]'s is keys[i-1]; keys[0] is block
  // `first_block_index` of its sequence. `tokens` holds the blocks' token ids
  // (keys.size() × block size), for consumers that want them.
  virtual void stored(KvTier tier, const std::optional<BlockKey>& parent, std::span<const BlockKey> keys,
                      uint32_t first_block_index, std::span<const int32_t> tokens) = 0;
  // `keys` stopped being present in `tier`.
  virtual void removed(KvTier tier, std::span<const BlockKey> keys) = 0;
  // Every key of `tier` is gone.
  virtual void cleared(KvTier tier) = 0;
  // The events since the previous call belong to one engine step: a publisher sends them as
  // one batch (an idle step calls it too, with no events).
  virtual void step_end() = 0;
};

}  // namespace pdserve::engine
