// KvRanks: a worker's kvtransfer endpoints, one per TP rank, each owned and driven by a thread
// of its own. An endpoint is single-threaded (its ZeroMQ sockets and session tables), so every
// call to it is posted to its thread as a command and runs there in posting order, between
// progress() rounds; the thread reports transfer events and block releases through callbacks.
// The group's descriptor (TP size, control endpoints, compat hash) is what routers and peers
// exchange as WorkerInfo.kv_endpoint / ReserveResponse.kv_target.
#pragma once

#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/clock.h"
#include "common/status.h"
#include "engine/engine.h"
#include "kvtransfer/kv_endpoint.h"
#include "worker/kv_staging.h"
#include "proto/worker.pb.h"

namespace pdserve::worker {

// Where the transport reads and writes a rank's KV.
enum class KvMemory {
  kAuto,    // The engine's arena when it is host memory, or GPU memory the transport can
            // register as such; else a staged host mirror.
  kStaged,  // Always a host mirror the worker copies through (forced: tests, debugging).
};

// Which arena a group's endpoints register as their KV arena.
enum class KvArena {
  kEngine,    // The engine's KV blocks (P/D transfers).
  kHostTier,  // The host tier's slots (the peer tier: worker/peer_tier.h).
};

struct KvRanksOptions {
  kvtransfer::SessionSide side = kvtransfer::SessionSide::kProducer;
  KvArena arena = KvArena::kEngine;
  KvMemory memory = KvMemory::kAuto;
  std::string model_id;  // With the engine's KV spec, the compat hash.
  const Clock* clock = &RealClock::instance();
  Duration default_lease = std::chrono::seconds(30);
  Duration peer_timeout = std::chrono::seconds(10);
  Duration heartbeat_interval = std::chrono::seconds(1);
  // Where rank r's control channel listens: bind_host, port port_base + r (0: any free port),
  // and the host peers are told to dial (empty: bind_host), for a worker that binds a wildcard
  // address behind a pod IP.
  std::string bind_host = "127.0.0.1";
  int port_base = 0;
  std::string advertise_host;
  // The cluster's kvtransfer key: every rank's control channel is CURVE-encrypted with it.
  std::string curve_secret_key;
  // Every rank's deliberate faults: set only by the mutation tests' worker binaries (through
  // WorkerSeams), never by the production ones.
  kvtransfer::TestFaults test_faults;
};

// `bound` (a ZeroMQ "tcp://HOST:PORT" endpoint) with its host replaced by `host` (brackets
// added for IPv6); `bound` itself when `host` is empty.
std::string advertised_endpoint(const std::string& bound, const std::string& host);

// A finished transfer on one rank (called on that rank's thread).
using KvEventFn = std::function<void(int rank, const kvtransfer::KvTransferEvent& event)>;
// A rank gave a request's blocks back (called on that rank's thread, once per request).
using KvReleaseFn = std::function<void(int rank, const std::string& id, std::vector<int> blocks)>;
using KvCommand = std::function<void(kvtransfer::KvRankEndpoint& endpoint)>;

class KvRanks {
 public:
  // One endpoint per engine rank over its KV arena (or its host tier's), bound as the options say.
  static StatusOr<std::unique_ptr<KvRanks>> create(const engine::Engine& engine,
                                                   const KvRanksOptions& options,
                                                   const KvEventFn& on_event, const KvReleaseFn& on_release);
  // Stops the threads (see stop()).
  ~KvRanks();

  int tp() const { return int(ranks_.size()); }
  uint64_t compat_hash() const { return compat_hash_; }
  // This group: TP size, each rank's control endpoint, compat hash.
  KvGroup group() const;
  // Runs `command` on every rank's thread, after the commands posted there before it.
  void post_all(const std::function<void(int rank, kvtransfer::KvRankEndpoint&)>& command);
  // Runs `command` on rank `rank`'s thread, after the commands posted there before it.
  void post(int rank, KvCommand command);
  // Keeps progressing until no rank has open requests or `drain` passed, then joins. Idempotent.
  void stop(Duration drain);
  // Rank `rank`'s host mirror of a device arena, or nullptr when the transport uses the
  // engine's arena itself.
  KvStaging* staging(int rank) const;
  // Where the transport reads and writes KV: "host" (the engine's arena, host memory),
  // "device" (the engine's GPU arena, registered as device memory) or "staged" (a host mirror).
  const std::string& memory_path() const { return memory_path_; }
  // Bytes copied device → host and host → device by the staging, over every rank.
  uint64_t staged_bytes_to_host() const;
  uint64_t staged_bytes_to_device() const;
  // Transfer events that failed (not counting aborts), over every rank.
  uint64_t transfer_failures() const;
  // The endpoints' counters over every rank, as of each rank's last progress round: bytes,
  // expired leases and refusals summed; requests, failures and time as the rank with the most
  // (every rank takes part in every request of the worker).
  kvtransfer::KvEndpointCounters counters() const;

 private:
  class Rank;
  KvRanks() = default;
  std::vector<std::unique_ptr<Rank>> ranks_;
  // Per rank, when staged. Declared after ranks_ so that it goes first: each staging unpins its
  // mirror while the endpoint that allocated it (kept by its Rank past stop()) still holds it.
  std::vector<std::unique_ptr<KvStaging>> staged_;
  std::string memory_path_ = "host";
  uint64_t compat_hash_ = 0;
};

// Parses and checks a KvGroup descriptor (`what` names it in errors).
StatusOr<KvGroup> parse_kv_group(const std::string& bytes, const std::string& what);

}  // namespace pdserve::worker
