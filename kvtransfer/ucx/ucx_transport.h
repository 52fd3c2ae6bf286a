// The UCX backend of kvtransfer::Transport: one ucp context and one worker per instance,
// ucp_mem_map registration (and allocation: ucp_mem_map with ALLOCATE, which over shared
// memory gives posix/sysv segments peers map directly), packed remote keys, ucp_put_nbx/ucp_get_nbx and ucp_ep_flush_nbx,
// endpoints in UCP_ERR_HANDLING_MODE_PEER so that a dead peer fails its batches instead of
// hanging them. UCX reads its UCX_* environment (UCX_TLS chooses the transports) when
// create() runs, so set it before then.
#pragma once

#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <ucp/api/ucp.h>

#include "kvtransfer/transport.h"

namespace pdserve::kvtransfer {

struct UcxTransportOptions {
  // Run a background thread that drives progress (see transport.h). Without it the owner must
  // call progress() or wait() often, also while it is only the target of a peer's ops.
  bool progress_thread = true;
  // Clock for wait() deadlines (a FakeClock must be advanced, or wait() never times out).
  const Clock* clock = &RealClock::instance();
  // Copy puts and gets with memcpy when the peer's region is mapped into this process
  // (ucp_rkey_ptr succeeds: UCX's shared-memory transports over transport-allocated memory),
  // instead of one UCX request per op. UCX's own put over such a mapping is the same copy by
  // the initiator; what this skips is its per-op request and completion bookkeeping, which
  // dominates small requests (512 ops of 4 KiB for 16 tokens of an 8B-shape model). Off only to
  // measure against the per-op path (kvtransfer_bench --no-direct-copy).
  bool direct_copy = true;
  // Name used in logs.
  std::string name = "ucx";
};

class UcxTransport final : public Transport {
 public:
  // Creates the ucp context and worker (and the progress thread when asked for).
  static StatusOr<std::unique_ptr<UcxTransport>> create(UcxTransportOptions options = {});
  // Force-closes endpoints, fails unfinished batches, unmaps regions, destroys the worker.
  ~UcxTransport() override;

  UcxTransport(const UcxTransport&) = delete;
  UcxTransport& operator=(const UcxTransport&) = delete;

  std::string describe() const override;
  StatusOr<RegisteredRegion> register_region(const MemoryRegion& region) override;
  StatusOr<AllocatedRegion> allocate_region(size_t length, MemoryKind kind) override;
  Status deregister_region(RegionId region) override;
  std::string local_address() const override;
  StatusOr<PeerId> connect(std::string_view peer_address) override;
  Status disconnect(PeerId peer, std::string_view reason) override;
  StatusOr<RemoteRegionId> load_remote_region(PeerId peer, std::string_view descriptor) override;
  StatusOr<BatchId> post(const TransferBatch& batch) override;
  StatusOr<BatchId> flush(PeerId peer) override;
  unsigned progress() override;
  StatusOr<BatchStatus> batch_status(BatchId batch) override;
  Status wait(BatchId batch, Duration timeout) override;
  Status release_batch(BatchId batch) override;
  void set_peer_error_callback(PeerErrorCallback callback) override;
  void set_activity_callback(std::function<void()> callback) override;
  void expect_remote_ops(bool expected) override;
  TransportCounters counters() const override;

  // UCX's description of the lanes an endpoint really uses (transport and device per lane), so
  // logs can record which path ran rather than which was configured.
  StatusOr<std::string> endpoint_info(PeerId peer) const;

 private:
  struct Region {
    ucp_mem_h memh = nullptr;
    uintptr_t addr = 0;
    size_t length = 0;
    MemoryKind kind = MemoryKind::kHost;
  };
  struct RemoteRegion {
    uint64_t addr = 0;
    uint64_t length = 0;
    ucp_rkey_h rkey = nullptr;
    // The region's first byte in this process, when UCX maps it here (ucp_rkey_ptr) and it is
    // host memory; null otherwise. Valid until the rkey is destroyed.
    uint8_t* mapped = nullptr;
  };
  struct Peer {
    ucp_ep_h ep = nullptr;
    std::string address;
    Status error;  // Not OK once the endpoint failed or was disconnected.
    bool detects_failure = true;  // Endpoint runs in UCP_ERR_HANDLING_MODE_PEER.
    size_t inflight = 0;          // Its UCX requests not yet completed.
    std::map<RemoteRegionId, RemoteRegion> remotes;
    std::vector<BatchId> open_batches;  // Unfinished batches that use this endpoint.
  };
  struct Batch {
    PeerId peer = 0;
    size_t pending = 0;  // Requests still owned by UCX.
    BatchState state = BatchState::kInProgress;
    std::string error;
    bool posting = true;  // Ops are still being posted; not done even if pending hits 0.
    bool released = false;
  };
  // user_data of one UCX request.
  struct OpContext {
    UcxTransport* self;
    BatchId batch;
    OpCode opcode;
    uint64_t length;
    bool is_flush;
  };

  explicit UcxTransport(UcxTransportOptions options);
  Status init();
  // Fails unless this UCX build handles `kind` memory. Requires mu_.
  Status check_memory_kind(MemoryKind kind);
  // Packs the key of a mapped region, records it and returns its id and descriptor; unmaps
  // it on failure. Requires mu_.
  StatusOr<RegisteredRegion> add_region(ucp_mem_h memh, void* addr, size_t length,
                                        MemoryKind kind);

  static void on_op_done(void* request, ucs_status_t status, void* user_data);
  static void on_ep_error(void* arg, ucp_ep_h ep, ucs_status_t status);

  // Books a finished (or failed to start) op on its batch. Requires mu_.
  void complete_op(const OpContext& op, ucs_status_t status);
  // Who ends a batch: the post()/flush() call that started it, or a completion arriving later.
  enum class EndedBy { kPostingCall, kCompletion };
  // Marks the batch done once nothing is pending and posting ended; signals (batch_ended) only
  // an end by a later completion. Requires mu_.
  void maybe_finish(BatchId id, Batch& batch, EndedBy by);
  // A batch ended (done or failed) after its post()/flush() returned: wakes wait() and the
  // activity callback. Under mu_.
  void batch_ended();
  // Records a peer failure, fails its open batches, destroys its rkeys and force-closes its
  // endpoint; queues the user callback. Requires mu_.
  void fail_peer(PeerId id, Peer& peer, const Status& error);
  // The regions an op of a batch being posted names, as post()'s validation found them.
  struct ResolvedOp {
    const Region* local = nullptr;
    const RemoteRegion* remote = nullptr;
  };
  // Performs the batch's ops (resolved_ops_) with memcpy and books them complete. Requires mu_.
  void copy_directly(BatchId id, const TransferBatch& batch);
  // Starts a request for `op` (nullptr: immediate completion already booked). Requires mu_.
  void track_request(ucs_status_ptr_t request, OpContext* ctx);
  // Runs ucp_worker_progress and handles endpoint errors; returns events. Requires mu_.
  unsigned progress_locked();
  // Runs queued callbacks without mu_.
  void run_callbacks(std::unique_lock<std::mutex>& lock);
  void progress_loop();
  BatchId new_batch(PeerId peer);

  const UcxTransportOptions options_;
  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  std::string address_;
  std::string tls_;  // UCX_TLS as configured, for describe().

  mutable std::mutex mu_;
  std::condition_variable cv_;  // Batch state changes, and work for the progress thread.
  std::map<RegionId, Region> regions_;
  std::map<PeerId, Peer> peers_;
  std::map<std::string, PeerId> peer_by_address_;
  std::map<BatchId, Batch> batches_;
  // post()'s validation results, one per op, reused so that a batch allocates nothing here and
  // its regions are looked up once (a 16-token request posts 512 ops). Under mu_.
  std::vector<ResolvedOp> resolved_ops_;
  std::mutex failed_mu_;  // Guards failed_eps_ only; never held across a UCX call.
  std::vector<std::pair<ucp_ep_h, ucs_status_t>> failed_eps_;  // From on_ep_error.
  std::vector<std::pair<PeerId, Status>> pending_callbacks_;
  std::vector<void*> closing_eps_;  // Close requests still in flight.
  PeerErrorCallback peer_error_callback_;
  std::function<void()> activity_callback_;
  TransportCounters counters_;
  size_t inflight_ = 0;       // UCX requests not yet completed, over all peers.
  size_t inflight_live_ = 0;  // Those of peers that have not failed.
  uint64_t next_id_ = 1;
  bool peer_mode_usable_ = true;  // UCP_ERR_HANDLING_MODE_PEER worked or was not tried.
  bool work_posted_ = false;
  bool remote_ops_expected_ = false;
  bool stop_ = false;
  std::thread progress_thread_;
};

}  // namespace pdserve::kvtransfer
