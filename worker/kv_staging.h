// KvStaging: a host mirror of a device KV arena, for transports that cannot reach device memory
// (a UCX built without CUDA/ROCm support, as Debian's). The transport registers the mirror —
// laid out exactly as the arena, so peers address the same offsets whatever memory they use —
// and the worker copies each request's blocks across: device → host before a producer exposes
// a layer (push) or holds the request (pull), host → device once a consumer's blocks are
// complete, before the engine decodes from them. Copies run on the backend's staging channel,
// beside the forward pass.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "common/status.h"
#include "engine/backend.h"
#include "engine/kv_cache_layout.h"

namespace pdserve::worker {

class KvStaging {
 public:
  // `device` is the rank's arena in `backend`'s memory, laid out by `layout`; `host` a mirror
  // of layout.total_bytes() bytes, pinned here for the staging's lifetime where the driver
  // allows (else copies run from pageable memory, with a warning).
  static StatusOr<std::unique_ptr<KvStaging>> create(const engine::KvCacheLayout& layout, void* device,
                                                     void* host, engine::Backend* backend);
  ~KvStaging();

  // Copies layer `layer` of `blocks` (every layer when layer < 0) from device to host and waits.
  Status to_host(const std::vector<int>& blocks, int layer = -1);
  // Copies every layer of `blocks` from host to device and waits.
  Status to_device(const std::vector<int>& blocks);

  bool pinned() const { return pinned_; }
  uint64_t bytes_to_host() const { return bytes_to_host_.load(); }
  uint64_t bytes_to_device() const { return bytes_to_device_.load(); }

 private:
  KvStaging(const engine::KvCacheLayout& layout, uint8_t* device, uint8_t* host, engine::Backend* backend)
      : layout_(layout), device_(device), host_(host), backend_(backend) {}
  // OutOfRange unless every block and the layer (< 0: all) exist.
  Status check(const std::vector<int>& blocks, int layer) const;
  // The arena byte ranges of `blocks` in `layer` (or every layer), adjacent ones merged.
  std::vector<engine::ByteRange> ranges(const std::vector<int>& blocks, int layer) const;
  Status copy(const std::vector<engine::ByteRange>& ranges, bool to_host);

  const engine::KvCacheLayout layout_;
  uint8_t* const device_;
  uint8_t* const host_;
  engine::Backend* const backend_;
  bool pinned_ = false;
  std::atomic<uint64_t> bytes_to_host_{0}, bytes_to_device_{0};
};

}  // namespace pdserve::worker
