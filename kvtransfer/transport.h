// The kvtransfer data-path interface: one-sided RDMA-style puts and gets between registered
// memory regions of two processes, in the style of NIXL/Mooncake (a few verbs, plain request
// structs, status returned). Backends: UCX (kvtransfer/ucx/). Addresses and region descriptors
// are opaque byte strings that travel over the control channel (kvtransfer/control/).
//
// Completion rule: a put is complete *locally* when its batch is done (the source buffer may be
// reused); it is complete *remotely* (visible in the peer's memory) only after a later
// flush(peer) batch is done. Push mode is therefore: post puts → flush → notify (WriteDone).
//
// Progress model: the worker moves data only while progress() runs. A transport created with a
// progress thread runs it by itself (and then also serves as a passive target, e.g. for tcp,
// where the target side has to read the socket); one created without must be driven by its
// owner calling progress() — or wait() — often, including when it is only a target. Every
// method is thread-safe. Callbacks run on the thread that called progress(), never with
// internal locks held, so they may call back into the transport.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "common/clock.h"
#include "common/status.h"

namespace pdserve::kvtransfer {

// Where a region's memory lives. Only kHost is registrable today; device kinds are accepted by
// the interface so that callers need not change when GPU-direct or host staging arrives.
enum class MemoryKind : uint8_t { kHost = 0, kCuda = 1, kRocm = 2 };

constexpr const char* memory_kind_name(MemoryKind kind) {
  switch (kind) {
    case MemoryKind::kHost: return "host";
    case MemoryKind::kCuda: return "cuda";
    case MemoryKind::kRocm: return "rocm";
  }
  return "?";
}

// Memory to register.
struct MemoryRegion {
  void* addr = nullptr;
  size_t length = 0;
  MemoryKind kind = MemoryKind::kHost;
  int device_id = 0;  // For device kinds.
};

// Local handle of a registered region.
using RegionId = uint64_t;
// Handle of a connected peer.
using PeerId = uint64_t;
// Handle of a peer's region loaded from its descriptor (valid only with that peer).
using RemoteRegionId = uint64_t;
// Handle of a posted batch (or flush).
using BatchId = uint64_t;

// The result of registering a region.
struct RegisteredRegion {
  RegionId id = 0;
  // Opaque remote descriptor (address, length, packed remote key) to send to peers.
  std::string descriptor;
};

// The result of allocate_region(): memory the transport allocated and registered.
struct AllocatedRegion {
  RegionId id = 0;
  void* addr = nullptr;  // `length` bytes, not necessarily zeroed.
  // Opaque remote descriptor, as RegisteredRegion::descriptor.
  std::string descriptor;
};

enum class OpCode : uint8_t { kPut = 0, kGet = 1 };

// One transfer: `length` bytes between local region + offset and remote region + offset.
// Put copies local → remote, get copies remote → local.
struct TransferOp {
  OpCode opcode = OpCode::kPut;
  RegionId local = 0;
  uint64_t local_offset = 0;
  RemoteRegionId remote = 0;
  uint64_t remote_offset = 0;
  uint64_t length = 0;
};

// Operations to one peer, posted together and tracked as one unit.
struct TransferBatch {
  PeerId peer = 0;
  std::vector<TransferOp> ops;
};

enum class BatchState : uint8_t { kInProgress = 0, kDone = 1, kError = 2 };

struct BatchStatus {
  BatchState state = BatchState::kInProgress;
  std::string error;  // Set when state == kError: the first failure seen.
};

// Monotonic totals since creation.
struct TransportCounters {
  uint64_t bytes_put = 0;      // Bytes of put ops that completed successfully.
  uint64_t bytes_got = 0;      // Bytes of get ops that completed successfully.
  uint64_t ops_posted = 0;
  uint64_t ops_completed = 0;  // Successfully.
  // Of ops_completed, those the initiator copied itself into (or out of) a peer region mapped
  // into its process, with no transport request per op (UcxTransportOptions::direct_copy).
  uint64_t ops_copied_directly = 0;
  // Time spent in those copies (with their fences): a request's payload cost, as opposed to its
  // bookkeeping and notifications.
  uint64_t direct_copy_ns = 0;
  uint64_t ops_failed = 0;
  uint64_t flushes = 0;
  uint64_t peer_failures = 0;  // Peers whose endpoint reported an error or were failed.
};

// Called once per failed peer (the endpoint is unusable afterwards; reconnect to retry).
using PeerErrorCallback = std::function<void(PeerId peer, const Status& error)>;

class Transport {
 public:
  virtual ~Transport() = default;

  // Backend and the concrete transports it selected (e.g. "ucx[tcp,self]"), for logs/metrics.
  virtual std::string describe() const = 0;

  // Registers memory for remote access; returns the local handle and the remote descriptor.
  virtual StatusOr<RegisteredRegion> register_region(const MemoryRegion& region) = 0;
  // Allocates `length` bytes of `kind` memory that the transport itself owns and registers.
  // Memory a backend allocated can be faster to reach than registered memory: UCX's
  // shared-memory transports map such a region into the peer and copy straight into it,
  // while memory they did not allocate needs the target's help for every op. The contents
  // are unspecified (not zeroed). Freed by deregister_region(), or when the transport dies.
  virtual StatusOr<AllocatedRegion> allocate_region(size_t length, MemoryKind kind) = 0;
  // Unregisters a region (and frees it, if allocate_region() made it); ops in flight on it
  // must have completed.
  virtual Status deregister_region(RegionId region) = 0;

  // This worker's address, to give to peers that will connect().
  virtual std::string local_address() const = 0;
  // Connects to a peer from its address (idempotent per address: returns the same PeerId).
  virtual StatusOr<PeerId> connect(std::string_view peer_address) = 0;
  // Closes the endpoint at once; its unfinished batches fail with `reason`. Used by upper layers
  // that learn of a dead peer first (e.g. missed heartbeats on the control channel).
  virtual Status disconnect(PeerId peer, std::string_view reason) = 0;

  // Loads a peer's region from the descriptor it sent, for use as TransferOp::remote.
  virtual StatusOr<RemoteRegionId> load_remote_region(PeerId peer,
                                                      std::string_view descriptor) = 0;

  // Posts every op of the batch; bounds are checked first, nothing is posted on error.
  virtual StatusOr<BatchId> post(const TransferBatch& batch) = 0;
  // Starts a flush of every op posted to `peer` so far; done means remotely complete.
  virtual StatusOr<BatchId> flush(PeerId peer) = 0;
  // Advances communication once; returns the number of events processed.
  virtual unsigned progress() = 0;
  // Current state of a batch; NotFound for an unknown or released handle.
  virtual StatusOr<BatchStatus> batch_status(BatchId batch) = 0;
  // Blocks until the batch is done (OK), failed (its error) or `timeout` passed
  // (DeadlineExceeded), progressing the worker when there is no progress thread.
  virtual Status wait(BatchId batch, Duration timeout) = 0;
  // Forgets a batch; unfinished ops still complete internally. Every batch must be released.
  virtual Status release_batch(BatchId batch) = 0;

  // Sets the callback for peer failures (replaces any earlier one).
  virtual void set_peer_error_callback(PeerErrorCallback callback) = 0;
  // Sets a callback run whenever a batch ends (done or failed) after the post() or flush() that
  // started it returned, from whichever thread ended it and possibly under the transport's own
  // lock: it may only signal (e.g. WakeFd::signal), so that an owner blocked in poll() looks at
  // its batches at once. A batch that ended within its post()/flush() (copied directly, or
  // every op completed at once) runs no callback: that call's caller finds it done. Replaces
  // any earlier one.
  virtual void set_activity_callback(std::function<void()> callback) = 0;
  // Whether peers are expected to access this side's memory now (a push consumer awaiting KV, a
  // pull producer holding it). Transports that emulate one-sided ops with the target's help (UCX
  // over shared memory it did not allocate, tcp) then progress at their busy pace instead of
  // backing off as if idle.
  virtual void expect_remote_ops(bool expected) = 0;
  virtual TransportCounters counters() const = 0;
};

}  // namespace pdserve::kvtransfer
