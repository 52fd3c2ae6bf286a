// KvEventSubscriber: the router's side of the KV-event transport (docs/kv_events.md). For each
// worker it holds a ZeroMQ SUB socket on the worker's PUB endpoint and a DEALER for its replay
// endpoint, and on its own thread feeds what they receive into a KvIndex, sending the replay
// and snapshot requests the index asks for, timing them out and retrying them (1 s apart,
// every 10 s once the worker is DEGRADED). Socket work stays on that thread; add_worker and
// remove_worker post commands to it.
#pragma once

#include <atomic>
#include <chrono>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "common/clock.h"
#include "common/status.h"
#include "common/wake_fd.h"
#include "router/kv_index.h"

namespace pdserve::router {

struct KvEventSubscriberOptions {
  Clock* clock = &RealClock::instance();
  Duration replay_timeout = std::chrono::seconds(2);  // Longest silence of a pending reply.
  Duration retry_backoff = std::chrono::seconds(1);
  Duration degraded_retry = std::chrono::seconds(10);
};

struct KvEventSubscriberStats {
  uint64_t live_messages = 0;
  uint64_t replay_messages = 0;
  uint64_t malformed = 0;  // Messages with a wrong frame count or an unparsable payload.
};

class KvEventSubscriber {
 public:
  KvEventSubscriber(KvIndex& index, KvEventSubscriberOptions options = {});
  ~KvEventSubscriber();
  KvEventSubscriber(const KvEventSubscriber&) = delete;
  KvEventSubscriber& operator=(const KvEventSubscriber&) = delete;

  // Subscribes to a worker (again, with new endpoints, after it restarted elsewhere) and asks
  // for its snapshot. An empty replay endpoint leaves the worker DEGRADED. `scheme`: as
  // KvIndex::add_worker.
  Status add_worker(const std::string& worker_id, const std::string& pub_endpoint, const std::string& replay_endpoint,
                    std::optional<KvScheme> scheme = std::nullopt);
  void remove_worker(const std::string& worker_id);
  KvEventSubscriberStats stats() const;

 private:
  struct Io;
  struct Command {
    bool add = false;
    std::string worker_id, pub_endpoint, replay_endpoint;
    ReplayRequest request;
  };
  void run();

  KvIndex& index_;
  const KvEventSubscriberOptions options_;
  std::unique_ptr<Io> io_;
  WakeFd wake_;
  mutable std::mutex mu_;
  std::deque<Command> commands_;  // Guarded by mu_.
  KvEventSubscriberStats stats_;  // Guarded by mu_.
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace pdserve::router
