// The workers a router drives: static address lists, plus workers that register themselves
// (Registry service) and stay listed while their heartbeats arrive. One gRPC channel each,
// polled with Worker.Info for health and load. A worker that fails a poll or an RPC is marked
// down and probed again after a back-off; placement sees a snapshot of the last poll plus what
// this router sent each worker since, so back-to-back requests do not all land on one worker.
// Indices are stable: a registered worker that expires keeps its slot (unlisted), and
// registering the same address again reuses it.
#pragma once

#include <grpcpp/security/credentials.h>

#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/clock.h"
#include "common/status.h"
#include "proto/worker.grpc.pb.h"
#include "router/metrics.h"
#include "router/policy.h"

namespace pdserve::router {

struct RegistryOptions {
  Duration poll_interval = std::chrono::milliseconds(200);
  Duration retry_interval = std::chrono::seconds(1);  // Back-off before probing a down worker.
  Duration rpc_timeout = std::chrono::seconds(2);     // For each Info call.
  int max_message_bytes = 64 << 20;
  // Registered workers: how often they should heartbeat, and how long without one drops them.
  Duration heartbeat_interval = std::chrono::seconds(1);
  Duration heartbeat_timeout = std::chrono::seconds(3);
  // Registry slots (one per address ever registered; they are never freed, so indices stay
  // stable): beyond, registration is refused, so a misbehaving client cannot grow it unbounded.
  int max_registered = 1024;
  // Failed request RPCs in a row (no request served between) that mark a worker down: one error
  // (a client's bad luck, a request the worker refused) is not enough. A failed health poll still
  // marks it down at once.
  int failure_threshold = 3;
  // How the router dials its workers: plaintext, or mutual TLS (--tls-ca; common/tls.h).
  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::InsecureChannelCredentials();
  // With TLS: the name workers' certificates are checked against instead of the host of the
  // address dialed (--tls-worker-name), which in Kubernetes is a pod IP no certificate names.
  std::string tls_server_name;
};

// Told what the registry learns of its workers (router/kv_routing.h subscribes to their KV
// events). Called under the registry's lock: it must not call back into the registry.
class WorkerInfoListener {
 public:
  virtual ~WorkerInfoListener() = default;
  // A poll of `address` answered `info` (every poll; the listener acts on what changed).
  virtual void on_worker_info(const std::string& address, const worker::WorkerInfo& info) = 0;
  // `address` left the registry (its registration expired, or it deregistered).
  virtual void on_worker_removed(const std::string& address) = 0;
};

// "prefill", "decode", "aggregated" or "unspecified".
std::string role_name(worker::Role role);

class WorkerRegistry {
 public:
  struct Endpoint {
    std::string address;  // host:port
    worker::Role role = worker::ROLE_UNSPECIFIED;
  };

  WorkerRegistry(std::vector<Endpoint> endpoints, const RegistryOptions& options, const Clock& clock);
  ~WorkerRegistry();

  // Polls every worker that is due (all of them the first time) and waits for the answers.
  void poll_once();
  // Starts polling in the background every poll_interval.
  void start();
  // Stops the background polling (also done by the destructor).
  void stop();
  // Tells `listener` (null: none) of every answered poll and every worker leaving; set before
  // the first poll_once, and outliving the registry's polls.
  void set_listener(WorkerInfoListener* listener);

  // Placement view of the workers of `role`; WorkerLoad::index is the registry index. With a
  // `producer` (a prefill worker's index), last_paired is when each was chosen with it.
  std::vector<WorkerLoad> loads(worker::Role role, int producer = -1) const;
  // Whether any worker of `role` is configured.
  bool has_role(worker::Role role) const;
  // The RPC stub of worker `index`.
  worker::Worker::Stub* stub(int index) const;
  const std::string& address(int index) const;
  worker::Role role(int index) const;
  // Whether worker `index` is listed and answered its last poll (not marked down since).
  bool is_up(int index) const;
  // What the router's watchdog reads of a worker, each tick.
  struct Watch {
    // Marked down, or dropped for missing heartbeats. A worker that deregistered (it is
    // draining) is not up, but has not failed: what it serves goes on.
    bool failed = false;
    // Its engine's mean step over the latest poll interval in which it ran steps
    // (WorkerInfo.steps_total, step_seconds_total); 0 until a poll saw steps.
    Duration step_time{0};
    // The expected length of the step its last Info showed in progress: that step's tokens
    // (step_tokens_in_progress, at most max_batch_tokens) times the interval's time per token
    // (step_tokens_total). Mostly too long — the time per token of decode steps, which read
    // every weight for a few tokens, is above a prefill chunk's — so it bounds the step. 0
    // between steps, and for a worker that left (no longer polled).
    Duration step_in_progress{0};
  };
  // Every worker's Watch, by index, under one lock.
  std::vector<Watch> watch() const;
  // The last Info of some up worker of `role` (for model limits and block size).
  std::optional<worker::WorkerInfo> info(int index) const;
  // Records that placement chose `index` (with prefill worker `producer`, -1 for none), for
  // WorkerLoad::last_chosen. Noted at the choice, before any RPC, so that the requests of a
  // burst placed meanwhile see it.
  void note_chosen(int index, int producer = -1);
  // Records that a request was sent to `index` (counted in its load until a poll sent after it
  // answers). The notes below are kept the same way.
  void note_assigned(int index, int blocks, int64_t prefill_tokens);
  // Records that `index` computed a prompt of `prefill_tokens` (as note_assigned counted it):
  // taken off its queued prefill tokens (and the request off its running ones), so that a poll
  // that went out while it was queued does not make a worker that is idle again look busy.
  void note_prefill_done(int index, int64_t prefill_tokens);
  // Records that a request note_assigned counted on `index` with `blocks` ended there (served,
  // failed or moved on): its blocks and its running slot come off the load, so that a worker
  // whose requests just ended — its blocks now cached and evictable — does not look full and
  // lose the credit of its cache to the imbalance guard.
  void note_request_done(int index, int blocks);
  // Marks `index` down at once; it is probed again (Worker.Info) after retry_interval and is
  // up again when that answers.
  void mark_down(int index, const Status& why);
  // A request RPC to `index` failed for `why`: after failure_threshold in a row it is marked
  // down. Returns whether it is down now.
  bool report_failure(int index, const Status& why);
  // A request was served by `index`: its run of failures ends.
  void report_success(int index);
  const RegistryOptions& options() const { return options_; }
  // Per-worker gauges for /metrics.
  std::vector<WorkerGauges> gauges() const;

  // Lists a worker that registered itself (or renews it), to be polled at once and kept while
  // heartbeats arrive within heartbeat_timeout. Registering a static worker's address with its
  // role is accepted (it never expires); with another role, FailedPrecondition.
  Status register_worker(const Endpoint& endpoint, const std::string& worker_id);
  // Renews a registration; false when `address` is not listed (never registered, expired,
  // deregistered), which tells the worker to register again.
  bool heartbeat(const std::string& address);
  // Unlists a registered worker at once; false when it is not a listed registered worker.
  bool deregister(const std::string& address);
  // Unlists the registered workers whose last heartbeat is older than heartbeat_timeout on the
  // clock (the poller runs it; tests call it on a FakeClock); returns their addresses.
  std::vector<std::string> expire();
  // The workers listed now, static and registered.
  std::vector<Endpoint> listed() const;

 private:
  // The router's own notes of a worker's load between polls.
  struct LoadNotes {
    int assigned_requests = 0;
    int assigned_blocks = 0;
    int64_t assigned_prefill_tokens = 0;
    int done_requests = 0, done_blocks = 0;  // Ended (note_request_done, note_prefill_done).
    int64_t done_prefill_tokens = 0;          // Computed (note_prefill_done).
    // Takes off what `sent` holds (the notes a poll's Info already reflects), never below 0.
    void forget(const LoadNotes& sent);
  };
  struct Worker {
    Endpoint endpoint;
    std::unique_ptr<worker::Worker::Stub> stub;
    bool registered = false;  // Came through register_worker (expires), not a static list.
    bool listed = true;       // False once a registered worker expired or deregistered.
    std::string worker_id;
    TimePoint last_heartbeat{};
    bool up = false;
    bool ever_polled = false;
    TimePoint next_poll{};
    worker::WorkerInfo info;
    // What this router sent and saw end since the last poll was sent: a poll's Info already
    // counts what came before it went out, and only that is taken off when it is applied.
    LoadNotes notes;
    uint64_t last_chosen = 0;             // note_chosen's sequence number; 0: never.
    std::map<int, uint64_t> chosen_with;  // The same, per producer index.
    // The latest poll interval that ran steps (see Watch::step_time): its mean step, and its
    // time per token; and the expected length of the step the last poll saw in progress.
    Duration step_time{0};
    double token_seconds = 0;
    Duration step_in_progress{0};
    int consecutive_failures = 0;  // Request RPCs failed since the last request it served.
    bool leaving = false;          // Deregistered: draining, not failed.
  };
  // `sent` is the worker's notes when the poll went out.
  void apply_poll(int index, const Status& status, const worker::WorkerInfo& info, const LoadNotes& sent);
  void poll_loop();
  std::unique_ptr<worker::Worker::Stub> make_stub(const std::string& address) const;
  Worker* find(const std::string& address);  // Under mu_.

  const RegistryOptions options_;
  const Clock& clock_;
  mutable std::mutex mu_;
  // Never shrinks and never moves a Worker, so indices, stubs and addresses stay valid.
  std::vector<std::unique_ptr<Worker>> workers_;
  std::condition_variable cv_;
  bool stopping_ = false;
  bool poll_now_ = false;  // A worker registered: poll without waiting for the next round.
  uint64_t choices_ = 0;   // note_chosen calls so far.
  WorkerInfoListener* listener_ = nullptr;  // Guarded by mu_.
  std::thread poller_;
};

}  // namespace pdserve::router
