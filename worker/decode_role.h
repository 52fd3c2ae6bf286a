// DecodeRole: the decode side of disaggregated serving. Push: Worker.Reserve takes blocks from
// the engine and registers the transfer with every kvtransfer rank before the producer can
// write; Worker.Generate then waits (bounded by the lease) until every rank's fan-in sealed with
// matching counts. Pull: Worker.Generate takes blocks and every rank reads its share from the
// producer's kv_source, then releases it. Either way the blocks start with the engine's own
// prefix-cache hit for the prompt (Engine::reserve_cached_blocks, retained), which the transfer
// skips: only the prompt blocks this worker lacks move, and the fan-in counts cover only them.
// The ready blocks and the first token become a preloaded engine request, which the caller
// submits. Blocks never claimed by a Generate, or of a failed transfer, go back to the engine
// (one reference each, hit blocks included) once every rank has let go of them.
#pragma once

#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "engine/engine_loop.h"
#include "proto/worker.pb.h"
#include "worker/kv_ranks.h"

namespace pdserve::worker {

// A request whose KV is in this worker's blocks, ready to decode.
struct PreparedDecode {
  engine::GenerationRequest request;  // Preloaded; the engine owns the blocks once submitted.
  // The prefill side's first token was a stop token: nothing to decode (blocks already freed).
  bool finished_by_prefill = false;
  double kv_transfer_s = 0;  // Push: the transfer's unhidden tail (KvTransferEvent::push_tail); pull: the read.
  int cached_tokens = 0;       // Prompt tokens this worker's prefix cache held (whole blocks).
  int transferred_blocks = 0;  // Prompt blocks that moved in: the prompt's blocks less the hit.
};

class DecodeRole {
 public:
  // Opens one kvtransfer consumer endpoint per engine rank and the lease sweeper.
  static StatusOr<std::unique_ptr<DecodeRole>> create(engine::Engine& engine, const KvRanksOptions& options);
  ~DecodeRole();

  // Serves Worker.Reserve (push): ReserveResponse.cached_prefix_blocks is the hit.
  StatusOr<ReserveResponse> reserve(const ReserveRequest& request);
  // Waits for a push or pull request's KV and returns the preloaded request; `cancelled` is
  // polled while waiting (a cancelled wait aborts the transfer).
  StatusOr<PreparedDecode> prepare(const WorkerGenerateRequest& request, engine::SamplingParams params,
                                   const std::function<bool()>& cancelled);
  // Worker.Abort for a request still waiting for its KV; false if none is.
  bool abort(const std::string& id);
  const KvRanks& kv() const { return *kv_; }
  // Requests with a transfer or hold not yet finished (a drain waits for none).
  size_t open_jobs() const;
  // Aborts everything and drains the transfers for at most `drain`.
  void shutdown(Duration drain);

 private:
  struct Job;
  DecodeRole(engine::Engine& engine, const Clock* clock, Duration lease);
  // Pull: the prompt's blocks, waiting (up to half the lease) while the pool is short.
  StatusOr<engine::Engine::Reservation> reserve_for_pull(const WorkerGenerateRequest& request, int prompt_len,
                                                         const std::function<bool()>& cancelled);
  StatusOr<PreparedDecode> wait_ready(const std::string& id, std::unique_lock<std::mutex>& lock,
                                      const std::function<bool()>& cancelled);
  void post_transfer(const std::string& id, const std::function<Status(int, kvtransfer::KvRankEndpoint&)>& command);
  void on_kv_event(int rank, const kvtransfer::KvTransferEvent& event);
  void on_kv_release(int rank, const std::string& id);
  void fail_locked(const std::string& id, Job& job, const Status& why);
  void maybe_free(const std::string& id);  // Caller holds mu_.
  void sweep();

  engine::Engine& engine_;
  const Clock* clock_;
  const Duration lease_;
  std::unique_ptr<KvRanks> kv_;
  mutable std::mutex mu_;
  std::condition_variable changed_;
  std::map<std::string, Job> jobs_;
  bool stopping_ = false;
  std::thread sweeper_;
};

}  // namespace pdserve::worker
