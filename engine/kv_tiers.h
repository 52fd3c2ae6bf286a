// The KV cache's tiers below the device (docs/kv_offload.md) and the cascade between them: the
// host tier (engine/host_kv_tier.h) and, under it, the filesystem tier (engine/fs_kv_tier.h).
// Stores write a sequence's blocks through to the host and send the whole chunks the host holds
// on to the files; loads continue a device hit with the host's blocks, then with chunk files
// promoted through the host, until --kv-load-timeout-ms. The engine owns one when it has a host
// tier and calls store and load from its scheduler thread; the decode side's reservations load
// from host() on their own threads (HostKvTier is thread-safe).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/clock.h"
#include "common/status.h"
#include "engine/fs_kv_tier.h"
#include "engine/host_kv_tier.h"

namespace pdserve::engine {

class KvEventSink;

// The filesystem tier's flags, checked on their own: --kv-offload-dir-bytes and
// --kv-load-timeout-ms need --kv-offload-dir, and the timeout is not negative.
Status check_disk_tier_flags(const std::string& dir, uint64_t dir_bytes, Duration load_timeout);

class KvTiers {
 public:
  struct Options {
    uint64_t host_bytes_per_rank = 0;  // --host-kv-bytes (> 0).
    FsKvTier::Options disk;            // The filesystem tier's; an empty dir: none.
    KvEventSink* sink = nullptr;  // The host tier's KV events; may be null.
    Duration load_timeout{0};     // --kv-load-timeout-ms (0: none), measured on `clock`.
    const Clock* clock = &RealClock::instance();
  };
  // The tiers over `device`'s ranks (whose arenas the host tier copies to and from).
  static StatusOr<std::unique_ptr<KvTiers>> create(std::vector<HostKvTier::DeviceRank> device, Options options);

  // A sequence as the tiers see it: keys[i] names tokens[i·B, (i+1)·B) of namespace `ns_root`,
  // held in device block blocks[i].
  struct Chain {
    std::span<const BlockKey> keys;
    const BlockKey& ns_root;
    std::span<const int32_t> tokens;
    std::span<const int> blocks;
  };
  // How far a sequence's leading blocks reached the tiers (the caller keeps one per sequence and
  // resets it when the sequence gives its blocks back).
  struct Progress {
    int host = 0;  // Leading blocks stored in the host tier (as far as known).
    int disk = 0;  // Leading blocks whose chunks went to the filesystem tier.
  };
  // Stores the chain's first `blocks` blocks in the host tier, and the chunks it then holds
  // whole in the filesystem tier (queued: the files are written on the tier's thread).
  void store(const Chain& chain, int blocks, Progress& progress, std::string_view request_id);
  // Loads what the tiers hold of blocks [from, limit) into the chain's device blocks: the host's
  // run, then chunk files promoted through the host until the load deadline.
  struct Loaded {
    int host_end = 0;  // The end of the host's run (`from` when it held nothing past it).
    int end = 0;       // The end of the whole run; [host_end, end) came from chunk files.
  };
  Loaded load(const Chain& chain, int from, int limit, Progress& progress, std::string_view request_id);

  HostKvTier& host() const { return *host_; }
  const FsKvTier* disk() const { return disk_.get(); }  // Null without a filesystem tier.
  // Seconds loads spent on chunk files, and the loads that reached the deadline (any thread).
  double disk_load_seconds() const { return double(disk_load_ns_.load()) * 1e-9; }
  uint64_t disk_load_timeouts() const { return disk_load_timeouts_.load(); }

 private:
  KvTiers(std::unique_ptr<HostKvTier> host, std::unique_ptr<FsKvTier> disk, const Options& options);
  // The host's run of the chain from block `at` on (`at` when it holds none, or fails).
  int load_host(const Chain& chain, int at, int limit, std::string_view request_id);

  std::unique_ptr<HostKvTier> host_;
  std::unique_ptr<FsKvTier> disk_;  // Destroyed first: it finishes its queued writes.
  const int block_size_;  // Tokens per block (the filesystem tier's chunks are cut in them).
  const Duration load_timeout_;
  const Clock& clock_;
  std::atomic<int64_t> disk_load_ns_{0};
  std::atomic<uint64_t> disk_load_timeouts_{0};
};

}  // namespace pdserve::engine
