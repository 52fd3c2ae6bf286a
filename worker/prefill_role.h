// PrefillRole: the prefill side of disaggregated serving. Worker.Prefill runs a prefill-only
// request through the shared engine loop (so concurrent Prefill RPCs batch in its scheduler),
// then moves the prompt's KV blocks: push — registered when the engine admits the request,
// every rank writes each layer's share into the decode worker's reserved blocks as soon as the
// forward pass wrote that layer (the engine's layer hook), so the transfer overlaps the later
// layers; when the prefill ends each rank seals its write count and notifies (WRITE_DONE
// carries the first token), and the blocks are freed once the writes are remotely complete;
// the RPC answers as soon as the first token is sampled, so the router streams it while the
// transfer ends. Pull — every rank holds the blocks for the decode ranks to read, freed once
// all of them released or the lease ran out; the RPC answers once they are held. Pull-host — as
// pull, but the prompt's blocks are first copied to host-tier slots leased to the request and
// the device blocks freed at once; the decode side reads the host arena (docs/kv_offload.md).
// The engine's blocks go back exactly once, when every rank has given them back.
#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "engine/engine_loop.h"
#include "proto/worker.pb.h"
#include "worker/kv_ranks.h"

namespace pdserve::worker {

class PrefillRole {
 public:
  // Opens one kvtransfer producer endpoint per engine rank.
  static StatusOr<std::unique_ptr<PrefillRole>> create(engine::Engine& engine,
                                                       const KvRanksOptions& options);
  ~PrefillRole();

  // The engine loop to run prefills on; set once, before the first RPC.
  void attach(engine::EngineLoop* loop) { loop_ = loop; }
  // Serves Worker.Prefill; `cancelled` is polled while waiting (a cancelled call aborts).
  StatusOr<PrefillResponse> prefill(const PrefillRequest& request,
                                    const std::function<bool()>& cancelled);
  // Worker.Abort: stops the request's prefill or transfer; its blocks come back once safe.
  bool abort(const std::string& id);
  const KvRanks& kv() const { return *kv_; }
  // Requests with a transfer or hold not yet finished (a drain waits for none).
  size_t open_jobs() const;
  // pull-host: prompts copied to the host tier, and those read from the device for want of room.
  uint64_t host_copies() const { return host_copies_.load(); }
  uint64_t host_copy_fallbacks() const { return host_copy_fallbacks_.load(); }
  // Device block-seconds that finished prefills held for their transfers (from the prefill's end
  // to the blocks' release): what pull-host saves the prefill worker's device.
  double held_block_seconds() const { return double(held_block_us_.load()) * 1e-6; }
  // Aborts everything and drains the transfers for at most `drain`.
  void shutdown(Duration drain);

 private:
  struct Job;
  explicit PrefillRole(engine::Engine& engine, const Clock* clock, Duration lease);
  void on_token(const std::string& id, const engine::TokenEvent& event);
  // Push: the engine admitted the request into `blocks`; registers the push on every rank.
  void on_admitted(const std::string& id, const std::vector<int>& blocks);
  // The engine's layer hook: posts `layer` of every push that just completed its prompt.
  void on_layer(int rank, int layer, const std::vector<std::string>& completed);
  size_t prompt_blocks(const Job& job) const;
  // Push steps and the pull hold, each posted to the ranks' threads. Caller holds mu_.
  void begin_push(const std::string& id, Job& job);
  void post_layer(int rank, const std::string& id, Job& job, int layer);
  void seal_push(const std::string& id, Job& job);
  void start_hold(const std::string& id, Job& job);
  // pull-host: copies the prompt's blocks to leased host-tier slots and frees the device ones;
  // leaves them on the device (read from there) when the host tier has no room. An error (a
  // failed copy) fails the request; the caller still holds the device blocks then.
  Status copy_to_host(const std::string& id, Job& job);
  // Adds the job's device blocks, held since its prefill ended, to held_block_seconds().
  void note_held(const Job& job);
  // False once the job is gone or aborting: its queued commands then do nothing.
  bool transfer_live(const std::string& id);
  // A command failed on a rank's thread: aborts it there and fails the job.
  void command_failed(int rank, kvtransfer::KvRankEndpoint& ep, const std::string& id, const Status& error);
  void on_command_failed(int rank, const std::string& id, const Status& error, bool registered);
  void on_kv_event(int rank, const kvtransfer::KvTransferEvent& event);
  void on_kv_release(int rank, const std::string& id);
  // Marks the job aborting and stops its transfer. True if its prefill is still in the engine:
  // the caller aborts it there once it released mu_, since the engine may hold its own lock
  // while it calls on_token, which takes mu_.
  [[nodiscard]] bool abort_locked(const std::string& id, Job& job);
  // Frees the engine blocks once every rank gave them back; forgets finished jobs.
  void maybe_finish(const std::string& id);  // Caller holds mu_.

  engine::Engine& engine_;
  const Clock* clock_;
  const Duration lease_;
  engine::EngineLoop* loop_ = nullptr;
  std::unique_ptr<KvRanks> kv_;
  mutable std::mutex mu_;
  std::condition_variable changed_;
  std::map<std::string, Job> jobs_;
  std::atomic<uint64_t> host_copies_{0}, host_copy_fallbacks_{0};
  std::atomic<int64_t> held_block_us_{0};
};

}  // namespace pdserve::worker
