// KvIndex: the router's index of which worker holds which KV block (docs/kv_events.md), built
// from the workers' KV-event batches: key -> a presence mask per tier, one bit per worker slot.
// It also runs each worker's consumer state machine, so that it knows whether its picture of
// a worker is exact: EXACT while seqs arrive contiguously; RECOVERING after a gap (a seq past
// last+1, or a heartbeat whose last_seq is past it) or a new epoch, while a replay or snapshot
// is asked for and live batches are buffered; DEGRADED after three failed replays. It owns no
// sockets: it says which replay to request, and KvEventSubscriber does the I/O. A worker added
// with the key space its Info advertises (KvScheme) has every batch of another key space,
// block size or KV geometry rejected: such keys could never match the router's; a replay
// reply with such batches leaves the worker DEGRADED (asking again would get the same), until
// it is added again with its new Info. Thread-safe.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "common/status.h"
#include "engine/prefix/block_key.h"
#include "engine/prefix/kv_event_sink.h"
#include "proto/kvevents.pb.h"

namespace pdserve::router {

enum class WorkerKvState : uint8_t { kExact, kRecovering, kDegraded };
const char* to_string(WorkerKvState state);

// A REPLAY request to send to a worker's replay socket; epoch 0 asks for a snapshot.
struct ReplayRequest {
  uint64_t epoch = 0;
  uint64_t from_seq = 0;
  bool operator==(const ReplayRequest&) const = default;
};

// The key space a worker's batches must carry (KvEventBatch.key_scheme, block_size,
// compat_hash), from its WorkerInfo.
struct KvScheme {
  std::string key_scheme;  // kvevents::kKeySchemeV1 followed by the 16-byte key root.
  uint32_t block_size = 0;
  uint64_t compat_hash = 0;
  bool operator==(const KvScheme&) const = default;
};

struct KvIndexOptions {
  int max_failed_replays = 3;            // Then DEGRADED.
  size_t max_buffered_batches = 100000;  // Live batches held per worker while recovering.
};

// Counters for the router's metrics (kv_events_* in docs/kv_events.md).
struct KvIndexStats {
  uint64_t applied_batches = 0;
  uint64_t applied_stored = 0;   // Keys.
  uint64_t applied_removed = 0;  // Keys.
  uint64_t applied_cleared = 0;
  uint64_t gaps = 0;
  uint64_t epochs = 0;  // New epochs seen (publisher restarts).
  uint64_t drifts = 0;  // Heartbeats whose key counts disagreed at an equal seq.
  uint64_t replays_requested = 0;
  uint64_t replays_succeeded = 0;
  uint64_t replays_failed = 0;
  uint64_t snapshots = 0;       // Snapshots applied.
  uint64_t rejected = 0;        // Batches of another key scheme, block size or compat hash.
  double last_lag_seconds = 0;  // Apply time minus the batch's ts_unix, for live batches.
  double max_lag_seconds = 0;
};

// How far a prompt's chain of keys is present on one worker.
struct WorkerMatch {
  std::string worker_id;
  size_t blocks = 0;  // Longest prefix of the chain present (in the queried tier).
  WorkerKvState state = WorkerKvState::kRecovering;
};

class KvIndex {
 public:
  static constexpr int kMaxWorkers = 64;  // Slots: one bit each in a presence mask.

  explicit KvIndex(KvIndexOptions options = {}) : options_(options) {}

  // Starts tracking a worker (RECOVERING, no keys) and returns the snapshot request to send:
  // there is no cold start. Re-adding a known worker starts it over. With `scheme`, batches
  // that do not carry it are rejected (counted, logged once per worker).
  StatusOr<ReplayRequest> add_worker(const std::string& worker_id, std::optional<KvScheme> scheme = std::nullopt);
  // Forgets a worker and its keys (the registry dropped it).
  void remove_worker(const std::string& worker_id);

  // A batch from the worker's PUB socket (a heartbeat or a live batch). Returns the replay to
  // request when it reveals a gap or a new epoch.
  std::optional<ReplayRequest> on_live(const std::string& worker_id, const pdserve::kvevents::KvEventBatch& batch);
  // A batch of the reply to the worker's pending replay request.
  void on_replay_batch(const std::string& worker_id, const pdserve::kvevents::KvEventBatch& batch);
  // The reply's end marker: applies the buffered live batches; returns a further replay to
  // request when they still leave a gap.
  std::optional<ReplayRequest> on_replay_end(const std::string& worker_id);
  // The pending replay got no complete reply (timeout, socket error). Returns the request to
  // retry later, the worker's state telling how soon (DEGRADED: rarely).
  std::optional<ReplayRequest> on_replay_failed(const std::string& worker_id);

  std::optional<WorkerKvState> state(const std::string& worker_id) const;
  std::optional<uint64_t> epoch(const std::string& worker_id) const;
  std::optional<uint64_t> last_seq(const std::string& worker_id) const;
  // The worker's keys in `tier`, sorted (tests, the debug RPC).
  std::vector<engine::BlockKey> keys(const std::string& worker_id, engine::KvTier tier) const;
  // Distinct keys present on any worker in `tier` (kv_index_keys{tier}).
  size_t num_keys(engine::KvTier tier) const;
  // The keys the worker holds in `tier` (0 for an unknown worker).
  size_t num_keys(const std::string& worker_id, engine::KvTier tier) const;
  KvIndexStats stats() const;

  // For each worker, the longest prefix of `chain` (a prompt's block keys, in order) that it
  // holds in `tier`. O(chain) lookups, stopping once no worker continues.
  std::vector<WorkerMatch> match(std::span<const engine::BlockKey> chain,
                                 engine::KvTier tier = engine::KvTier::kDevice) const;

 private:
  static constexpr size_t kTiers = 3;
  struct Entry {
    std::array<uint64_t, kTiers> masks{};
  };
  struct Worker {
    int slot = 0;
    uint64_t epoch = 0;  // 0 until the first snapshot.
    uint64_t last_seq = 0;
    WorkerKvState state = WorkerKvState::kRecovering;
    ReplayRequest wanted;           // What to request (again) while not EXACT.
    bool snapshot_started = false;  // The pending reply's snapshot cleared the worker.
    int failures = 0;
    std::map<uint64_t, pdserve::kvevents::KvEventBatch> buffered;  // Live batches while recovering, by seq.
    std::array<uint64_t, kTiers> num_keys{};
    std::optional<KvScheme> scheme;
    bool warned = false;          // Logged a rejected batch.
    bool rejected_reply = false;  // The pending reply carried a rejected batch.
  };

  Worker* find(const std::string& worker_id);
  const Worker* find(const std::string& worker_id) const;
  std::optional<ReplayRequest> start_recovery(Worker& w, ReplayRequest request);
  // Whether `batch` is of the worker's key space; counts and logs (once) when not.
  bool accepts(const std::string& worker_id, Worker& w, const pdserve::kvevents::KvEventBatch& batch);
  void buffer(Worker& w, const pdserve::kvevents::KvEventBatch& batch);
  void apply(Worker& w, const pdserve::kvevents::KvEventBatch& batch);
  void set_present(Worker& w, size_t tier, const engine::BlockKey& key);
  void clear_present(Worker& w, size_t tier, const engine::BlockKey& key);
  void clear_worker(Worker& w, std::optional<size_t> tier);

  const KvIndexOptions options_;
  mutable std::mutex mu_;
  absl::flat_hash_map<engine::BlockKey, Entry> entries_;
  std::map<std::string, Worker> workers_;
  uint64_t used_slots_ = 0;
  std::array<size_t, kTiers> distinct_keys_{};
  KvIndexStats stats_;
};

}  // namespace pdserve::router
