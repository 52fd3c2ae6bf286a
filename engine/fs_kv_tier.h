// The filesystem tier of the KV cache (docs/kv_offload.md, --kv-offload-dir): chunks of
// consecutive blocks of a sequence as content-addressed files that outlive the worker and can
// be shared by workers of the same model, whatever their TP — the payload is in a canonical,
// TP-independent order ([layer][K|V][kv head][token][dim]), which the host tier converts to and
// from its per-rank layout.
//
// A file can never hand back wrong KV: it is self-describing (magic, version, the KV geometry's
// fingerprint, the key root, its blocks' keys and tokens, an xxh3 checksum of its payload and one
// of its header), written to a temporary file, fdatasync'ed and renamed into place (atomic), and
// a read checks all of it against what the request expects, deleting a file that fails (a
// corrupt file is a miss). Start-up removes temporary files left by dead writers; a background
// scan indexes the directory for eviction, which keeps the bytes under --kv-offload-dir-bytes
// (from 95 % down to 85 %, least recently used first). Writes run on a thread of their own from
// a bounded queue; a store that finds the queue full is dropped and counted (a later miss, never
// an error). KV events (tier "disk") follow the index: a chunk's blocks are stored when its file
// enters it (written here, found by the scan or by a read) and removed when it leaves (evicted,
// or deleted as corrupt); each file names its first block's parent key, so the events chain.
// Thread-safe.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "common/status.h"
#include "engine/prefix/block_key.h"
#include "engine/prefix/kv_event_sink.h"

namespace pdserve::engine {

class FsKvTier {
 public:
  struct Options {
    std::string dir;
    uint64_t max_bytes = 0;         // --kv-offload-dir-bytes; 0: no limit.
    int chunk_blocks = 16;          // Blocks per file.
    int block_size = 16;            // Tokens per block.
    uint64_t compat = 0;            // The KV geometry's fingerprint (KvCacheSpec::fingerprint()).
    BlockKey key_root;              // The engine's key root: files of other roots are never read.
    size_t max_queued_chunks = 64;  // Stores beyond this many queued are dropped.
    KvEventSink* sink = nullptr;    // The tier's KV events (KvTier::kDisk); may be null.
  };
  // One chunk to store: its blocks' keys and tokens, the key before them in their sequence
  // (nullopt: they start it) and the first one's block index, and its canonical payload.
  struct Chunk {
    std::vector<BlockKey> keys;
    std::vector<int32_t> tokens;
    std::optional<BlockKey> parent;
    uint32_t first_block_index = 0;
    std::vector<uint8_t> payload;
  };
  struct Counters {
    uint64_t stored_chunks = 0;   // Files written.
    uint64_t dropped_chunks = 0;  // Stores dropped (queue full) or failed.
    uint64_t loaded_chunks = 0;   // Files read and verified.
    uint64_t corrupt_files = 0;   // Files that failed a check (deleted).
    uint64_t evicted_files = 0;
    uint64_t removed_temp_files = 0;  // At start-up.
    uint64_t bytes = 0;               // Indexed bytes on disk.
    uint64_t files = 0;
  };

  // Creates the directory as needed, removes dead writers' temporary files, starts the writer
  // and the background scan.
  static StatusOr<std::unique_ptr<FsKvTier>> create(Options options);
  // Finishes the queued writes, then stops.
  ~FsKvTier();
  FsKvTier(const FsKvTier&) = delete;
  FsKvTier& operator=(const FsKvTier&) = delete;

  // Queues a chunk (keys: chunk_blocks of them; tokens: chunk_blocks × block_size); false when
  // it was dropped (queue full) or is already stored or queued.
  bool store(Chunk chunk);
  // The payload of the chunk whose blocks have `keys` and `tokens`, if a file holds exactly that
  // (nullopt: a miss; a file that fails a check is deleted).
  std::optional<std::vector<uint8_t>> load(std::span<const BlockKey> keys, std::span<const int32_t> tokens);
  // Waits until every queued chunk is written (or dropped).
  void flush();
  Counters counters() const;
  // The file a chunk ending with block key `last` lives in.
  std::string path_of(const BlockKey& last) const;
  // The block keys of the files the tier indexes (the KV events' exactness checks).
  std::vector<BlockKey> cached_keys() const;
  // Waits until the start-up scan has indexed the directory.
  void wait_scanned();
  int chunk_blocks() const { return options_.chunk_blocks; }

 private:
  explicit FsKvTier(Options options);
  void writer();
  void scan();
  Status write_file(const Chunk& chunk);
  // A file is used (read or written): its bytes and use; one new to the index is announced
  // (stored events of `chunk`'s keys, chain and tokens). Caller holds mu_.
  void note_file(const std::string& path, uint64_t bytes, const Chunk& chunk);
  // Forgets a file (removed events of its keys). Caller holds mu_.
  void forget_file(const std::string& path);
  void evict_locked();

  Options options_;
  std::string root_;  // dir/pdkv-v<format version>-<root>.
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Chunk> queue_;
  bool writing_ = false, stop_ = false, scanned_ = false;
  // The index for eviction: path → bytes and last use (a counter), and its total.
  struct File {
    uint64_t bytes = 0;
    uint64_t used = 0;
    std::vector<BlockKey> keys;  // Its blocks', for their removed events.
  };
  std::map<std::string, File> files_;
  uint64_t clock_ = 0;
  Counters counters_;
  std::thread writer_, scanner_;
};

}  // namespace pdserve::engine
