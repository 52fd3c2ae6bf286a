// PeerTier: the KV cache's peer tier on one worker (docs/kv_offload.md, "Peer tier"): blocks
// read from another worker's host tier instead of computed — the reverse reuse of P/D serving,
// where the decode worker holds a conversation's KV (its answers included) that the prefill
// worker of the next turn lacks.
//
// Serving (Worker.PeerLease / PeerRelease): the leading blocks of a prompt that this worker's
// host tier holds are pinned for the reader, each with its stamp (key and cache generation),
// and every rank's serving endpoint holds their slots for the reader's ranks to get; the
// release unpins them and says whether every stamp still holds — the lease may have run out
// and a slot been reused under the reader, whose copy is then another prompt's KV and must
// not be used (vllm#52234). Reading (before a prefill whose PrefixSource names a worker that
// holds more than this one): lease, get into host-tier slots reserved for the read, release,
// and only if every rank read its share and the stamps held, cache the slots under the
// prompt's keys; the engine's admission then loads them as host hits. Any failure is a miss:
// the prefill computes the prefix, and is never failed by the peer tier.
//
// The peer endpoints are kvtransfer endpoints of their own (one producer and one consumer per
// rank, KvArena::kHostTier) whose arena is the host tier's, so the worker's P/D endpoints and
// sessions are untouched, and a reader of another TP reads through the same rank maps.
#pragma once

#include <atomic>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "engine/engine.h"
#include "engine/host_kv_tier.h"
#include "proto/worker.grpc.pb.h"
#include "worker/kv_ranks.h"
#include "worker/rank_progress.h"

namespace pdserve::worker {

struct PeerTierOptions {
  // How the peer endpoints bind and time out (`side` and `arena` are set per group; port_base
  // is ignored: they take free ports).
  KvRanksOptions kv;
  // A serving lease's length when the reader gives none (a reader asks for its read timeout and
  // a second); and the reader's whole wait (lease, gets, release) before its prefill computes the
  // prefix instead.
  Duration lease = std::chrono::seconds(10);
  Duration read_timeout = std::chrono::seconds(2);
  // To call other workers' Worker API (mutual TLS where the cluster uses it).
  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::InsecureChannelCredentials();
  std::string tls_server_name;
};

struct PeerTierStats {
  // Reading.
  uint64_t reads = 0;          // Reads attempted (the source held more than this worker).
  uint64_t read_blocks = 0;    // Blocks read and cached in the host tier.
  uint64_t read_bytes = 0;     // Over every rank.
  uint64_t failed_reads = 0;   // Refused or empty lease, no slots, a failed transfer or RPC.
  uint64_t timed_out_reads = 0;
  uint64_t stale_reads = 0;    // Read, then dropped: a stamp no longer held.
  double read_seconds = 0;
  // Serving.
  uint64_t leases = 0;         // Granted with at least one block.
  uint64_t leased_blocks = 0;
  uint64_t expired_leases = 0;  // Unpinned at their end, without PeerRelease.
};

class PeerTier {
 public:
  // Opens the peer endpoints over `engine`'s host tier (FailedPrecondition without one).
  static StatusOr<std::unique_ptr<PeerTier>> create(engine::Engine& engine, PeerTierOptions options);
  // Unpins every lease and stops the endpoints.
  ~PeerTier();

  // Worker.PeerLease: pins and holds the prompt's leading blocks the host tier has.
  StatusOr<PeerLeaseResponse> lease(const PeerLeaseRequest& request);
  // Worker.PeerRelease: unpins a lease; whether its stamps held.
  PeerReleaseResponse release(const PeerReleaseRequest& request);
  // Reads what `source` holds of `prompt`'s prefix (namespace `cache_salt`) beyond what this
  // worker's caches hold into the host tier; returns the leading blocks the host tier holds
  // afterwards. Never fails the request: a failed read is counted and computed.
  int read(const std::string& request_id, const std::vector<int>& prompt, const std::string& cache_salt,
           const PrefixSource& source);
  PeerTierStats stats() const;
  // The serving endpoints (what PeerLeaseResponse.kv_source names).
  KvGroup serving_group() const { return serving_->group(); }

 private:
  struct Lease {
    engine::HostKvTier::PeerLease pinned;
    TimePoint end;
    bool expired = false;  // Unpinned at `end`; forgotten a lease later.
  };
  // A read in flight on the reading endpoints, until every rank is quiet (ready or released).
  struct Read {
    RankProgress ranks;
    std::vector<int> slots;  // Reserved in the host tier.
    Status error;
    bool abandoned = false;  // The reader gave up: the slots go back once the ranks are quiet.
    uint64_t bytes = 0;
    bool quiet() const { return ranks.all_of_any(RankProgress::kReady | RankProgress::kReleased); }
  };

  PeerTier(engine::Engine& engine, PeerTierOptions options);
  Worker::Stub& stub(const std::string& address);  // Caller holds mu_.
  // A read's lease: the source's pin and holds and the reader's pull (its timeout and a margin).
  Duration read_lease() const;
  // Reading endpoints' callbacks (rank threads).
  void on_read_event(int rank, const kvtransfer::KvTransferEvent& event);
  void on_read_release(int rank, const std::string& id);
  // Gives an abandoned read's slots back once its ranks are quiet. Caller holds mu_.
  void maybe_forget_read(const std::string& id);
  // Ends leases past their end, forgets expired ones a lease later (the reaper thread).
  void reap();

  engine::Engine& engine_;
  engine::HostKvTier& host_;
  const PeerTierOptions options_;
  const std::string id_prefix_;  // Makes this worker's read ids unique on every source.
  std::unique_ptr<KvRanks> serving_, reading_;
  mutable std::mutex mu_;
  std::condition_variable changed_;
  std::map<std::string, Lease> leases_;  // Served, by lease id.
  std::set<std::string> granting_;       // Lease ids being granted (not in leases_ yet).
  std::map<std::string, Read> reads_;    // In flight, by lease id.
  std::map<std::string, std::unique_ptr<Worker::Stub>> stubs_;  // By address.
  uint64_t next_read_ = 0;
  PeerTierStats stats_;
  bool stopping_ = false;
  std::thread reaper_;
};

}  // namespace pdserve::worker
