// KvEventPublisher: a worker's KV-event publisher (docs/kv_events.md). It implements
// engine::KvEventSink, so the engine's prefix cache reports its set transitions to it, and
// publishes them as KvEventBatch messages on a ZeroMQ PUB socket, one batch per step_end() —
// an engine step, or a filesystem-tier file — (split at max_batch_events), with contiguous 1-based seqs under a random epoch, heartbeats
// that carry the last seq, and a ROUTER replay socket that answers from a bounded ring of
// recent batches or, when that cannot cover the request, with a snapshot of its own mirror of
// the key set. ZeroMQ sockets are not thread safe and the sink's callers hold the engine's
// cache lock, so the sink methods only queue; every socket is driven by the publisher's own
// I/O thread.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/clock.h"
#include "common/status.h"
#include "common/wake_fd.h"
#include "engine/prefix/block_key.h"
#include "engine/prefix/kv_event_sink.h"
#include "kvevents/drop_policy.h"

namespace pdserve::kvevents {

// Who publishes: every batch's header. Known only once the worker has its id and its engine,
// which is after the publisher must exist (the engine takes the sink at creation), so it is
// given to start().
struct KvEventSource {
  std::string worker_id;
  uint32_t block_size = 0;
  uint64_t compat_hash = 0;
  engine::BlockKey key_root;  // Goes into key_scheme, so consumers can reject another key space.
};

struct KvEventPublisherOptions {
  std::string pub_endpoint = "tcp://*:0";     // ZeroMQ bind address; port 0 picks a free port.
  std::string replay_endpoint = "tcp://*:0";  // Empty: no replay socket (consumers degrade).
  uint32_t block_size = 0;
  uint64_t compat_hash = 0;
  engine::BlockKey key_root;               // Goes into key_scheme, so consumers can reject another key space.
  size_t max_batch_events = 4096;          // Block transitions (keys) per batch; an AllCleared counts one.
  size_t buffer_batches = 10000;           // Replay ring, by count...
  size_t buffer_bytes = size_t(64) << 20;  // ...and by encoded bytes.
  Duration heartbeat_interval = std::chrono::milliseconds(1000);
  bool include_tokens = false;            // BlocksStored.token_ids, for foreign consumers.
  Clock* clock = &RealClock::instance();  // Heartbeat timing.
  std::shared_ptr<PubDropPolicy> drop_policy = std::make_shared<NeverDrop>();
  std::optional<uint64_t> epoch;  // Default: random (never 0, which requests mean "unknown").
};

// What the publisher has done, for metrics and tests.
struct KvEventPublisherStats {
  uint64_t last_seq = 0;
  uint64_t batches = 0;
  uint64_t events = 0;
  uint64_t dropped = 0;  // Live messages the drop policy discarded.
  uint64_t heartbeats = 0;
  uint64_t replays = 0;    // Replay requests answered from the ring.
  uint64_t snapshots = 0;  // Replay requests answered with a snapshot.
};

class KvEventPublisher final : public engine::KvEventSink {
 public:
  // Binds the sockets; nothing is sent before start(), sink calls until then are queued.
  static StatusOr<std::unique_ptr<KvEventPublisher>> create(KvEventPublisherOptions options);
  ~KvEventPublisher() override;  // Stops the I/O thread; queued, unpublished events are lost.
  // Starts the I/O thread, publishing as `source`. Once.
  Status start(KvEventSource source);
  KvEventPublisher(const KvEventPublisher&) = delete;
  KvEventPublisher& operator=(const KvEventPublisher&) = delete;

  void stored(engine::KvTier tier, const std::optional<engine::BlockKey>& parent,
              std::span<const engine::BlockKey> keys, uint32_t first_block_index,
              std::span<const int32_t> tokens) override;
  void removed(engine::KvTier tier, std::span<const engine::BlockKey> keys) override;
  void cleared(engine::KvTier tier) override;
  void step_end() override;

  // The bound endpoints as ZeroMQ reports them ("tcp://0.0.0.0:41234"); replay is empty when
  // there is no replay socket.
  const std::string& pub_endpoint() const { return bound_pub_; }
  const std::string& replay_endpoint() const { return bound_replay_; }
  uint64_t epoch() const { return epoch_; }
  KvEventPublisherStats stats() const;
  // After start(): blocks until every step ended before the call is published (tests,
  // orderly shutdown).
  void flush();

 private:
  struct Io;  // The I/O thread's sockets and state.
  enum class EventType : uint8_t { kStored, kRemoved, kCleared };
  struct RawEvent {
    EventType type;
    engine::KvTier tier;
    std::optional<engine::BlockKey> parent;
    std::vector<engine::BlockKey> keys;
    uint32_t first_block_index = 0;
    std::vector<int32_t> tokens;
  };
  using Step = std::vector<RawEvent>;

  KvEventPublisher(KvEventPublisherOptions options, std::unique_ptr<Io> io, uint64_t epoch);
  void run();
  void publish_step(const Step& step);
  void send_heartbeat();

  const KvEventPublisherOptions options_;
  KvEventSource source_;  // Set by start(), before the I/O thread, which alone reads it.
  const std::unique_ptr<Io> io_;
  const uint64_t epoch_;
  std::string bound_pub_;
  std::string bound_replay_;
  WakeFd wake_;

  mutable std::mutex mu_;
  Step pending_;                  // Events of the current step (guarded by mu_).
  std::deque<Step> steps_;        // Ended steps not yet published (guarded by mu_).
  uint64_t steps_ended_ = 0;      // Guarded by mu_.
  uint64_t steps_published_ = 0;  // Guarded by mu_.
  std::condition_variable published_cv_;
  KvEventPublisherStats stats_;  // Guarded by mu_.

  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace pdserve::kvevents
