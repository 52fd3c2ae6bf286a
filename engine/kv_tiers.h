// The KV cache's tiers below the device (docs/kv_offload.md) and the cascade between them: the
// host tier (engine/host_kv_tier.h) and, under it, the filesystem tier (engine/fs_kv_tier.h).
// Stores write a sequence's blocks through to the host and send the whole chunks the host holds
// on to the files; loads continue a device hit with the host's blocks, then with chunk files
// promoted through the host. Chunk files are read ahead of admission on the tiers' loader thread
// (prefetch: the request is PENDING meanwhile, until --kv-load-timeout-ms), never on the
// scheduler's, so a slow disk delays only the requests that wait for it. The engine owns one when
// it has a host tier and calls store, prefetch and load from its scheduler thread; the decode
// side's reservations load from host() on their own threads (HostKvTier is thread-safe).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <thread>
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
    // Called on the loader thread when a prefetch is done (the engine wakes its scheduler).
    std::function<void()> on_prefetched;
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
  // A read of chunk files ahead of a sequence's admission (PENDING): the files that continue its
  // chain from block `first` (a chunk boundary) are read and verified on the loader thread until
  // the first miss, the chain's limit or the load deadline (counted from prefetch()). Admission
  // hands it to load() once done(), which imports its chunks instead of reading files.
  class Prefetch {
   public:
    bool done() const { return done_.load(std::memory_order_acquire); }
    // Its request is gone (aborted): the loader reads no more files for it.
    void cancel() { cancelled_.store(true, std::memory_order_relaxed); }

   private:
    friend class KvTiers;
    std::string request_id;
    std::vector<BlockKey> keys;   // Of blocks [first, first + keys.size()): whole chunks.
    std::vector<int32_t> tokens;  // Their tokens.
    int first = 0;
    TimePoint started;
    std::vector<std::vector<uint8_t>> payloads;  // Chunks read, in order from `first`; the loader's until done.
    std::atomic<bool> done_{false};
    std::atomic<bool> cancelled_{false};
  };
  // Starts reading the chunk files past the tiers' run of the chain, which ends at block `from`
  // (what the device and the host hold), up to block `limit`; null when no whole chunk fits (or
  // there is no filesystem tier): load() then reads nothing from files.
  std::shared_ptr<Prefetch> prefetch(const Chain& chain, int from, int limit, std::string_view request_id);
  // Stores the chain's first `blocks` blocks in the host tier, and the chunks it then holds
  // whole in the filesystem tier (queued: the files are written on the tier's thread).
  void store(const Chain& chain, int blocks, Progress& progress, std::string_view request_id);
  // Loads what the tiers hold of blocks [from, limit) into the chain's device blocks: the host's
  // run, then the chunks `prefetched` (done; may be null) read, promoted through the host.
  struct Loaded {
    int host_end = 0;  // The end of the host's run (`from` when it held nothing past it).
    int end = 0;       // The end of the whole run; [host_end, end) came from chunk files.
  };
  Loaded load(const Chain& chain, int from, int limit, Progress& progress, std::string_view request_id,
              const Prefetch* prefetched);

  HostKvTier& host() const { return *host_; }
  const FsKvTier* disk() const { return disk_.get(); }  // Null without a filesystem tier.
  // Seconds the loader spent reading chunk files, the prefetches that reached the deadline, and
  // the prefetches started (requests that waited PENDING for files) (any thread).
  double disk_load_seconds() const { return double(disk_load_ns_.load()) * 1e-9; }
  uint64_t disk_load_timeouts() const { return disk_load_timeouts_.load(); }
  uint64_t disk_pending_loads() const { return disk_pending_loads_.load(); }
  // Waits until the filesystem tier's queued writes are done (no-op without one).
  void flush_disk_writes() const {
    if (disk_) disk_->flush();
  }
  // Finishes the prefetch under way (the queued ones are dropped, done), then the tiers.
  ~KvTiers();

 private:
  KvTiers(std::unique_ptr<HostKvTier> host, std::unique_ptr<FsKvTier> disk, const Options& options);
  // The host's run of the chain from block `at` on (`at` when it holds none, or fails).
  int load_host(const Chain& chain, int at, int limit, std::string_view request_id);
  void loader();
  void read_chunks(Prefetch& prefetch);

  std::unique_ptr<HostKvTier> host_;
  std::unique_ptr<FsKvTier> disk_;  // Destroyed first: it finishes its queued writes.
  const int block_size_;  // Tokens per block (the filesystem tier's chunks are cut in them).
  const Duration load_timeout_;
  const Clock& clock_;
  std::atomic<int64_t> disk_load_ns_{0};
  std::atomic<uint64_t> disk_load_timeouts_{0};
  std::atomic<uint64_t> disk_pending_loads_{0};
  const std::function<void()> on_prefetched_;
  std::mutex loader_mu_;
  std::condition_variable loader_cv_;
  std::deque<std::shared_ptr<Prefetch>> prefetches_;  // Guarded by loader_mu_.
  std::atomic<bool> stop_{false};                     // Set under loader_mu_.
  std::thread loader_;  // Only with a filesystem tier.
};

}  // namespace pdserve::engine
