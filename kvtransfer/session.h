// The state machine of one request's KV transfer on one rank, with one leg per peer rank it
// exchanges with (the per-(request, peer rank) sessions). It is pure bookkeeping — no I/O, time
// from the caller — so that sealing, duplicate handling, leases and the exactly-once block
// release can be unit-tested with a FakeClock; KvRankEndpoint drives it from the network.
//
//   producer, push: writing ──seal──> sealed ──every leg flushed + WriteDone sent──> complete
//   producer, pull: holding ──every fan-out leg released──> complete
//   consumer, push: reserved ──every fan-in leg sent a matching sealed WriteDone──> ready
//   consumer, pull: reading ──every fan-in leg read + Release sent──> ready
//   any active state ──error, abort, lost peer, lease──> aborted
//
// Blocks go back through the release callback exactly once: a producer's when it completes; a
// consumer's only when it aborts (a ready consumer's blocks now belong to decode). An aborted
// session releases once no peer can still touch its blocks: every leg is quiet (its ops ended,
// or the peer confirmed it stopped). A session whose blocks a *remote* peer accesses (consumer
// push: the producer writes; producer pull: the consumer reads) cannot force that peer to stop,
// so without confirmation it releases only at lease deadline + quarantine (peers stop at their
// own lease). A request whose safety cannot be proven (count mismatch) is aborted, never ready.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/status.h"

namespace pdserve::kvtransfer {

// Push: the producer writes into blocks the consumer reserved. Pull: the consumer reads blocks
// the producer holds.
enum class TransferMode : uint8_t { kPush = 0, kPull = 1 };
enum class SessionSide : uint8_t { kProducer = 0, kConsumer = 1 };

// What one side of one request does, fixed with its session: the (side, mode) pair every step,
// abort and message check dispatches on, chosen once instead of compared field by field. The
// side that posts the data ops (push producer: writes; pull consumer: reads) tracks them itself;
// the other side's blocks are touched by its peer, whose word that it stopped it must wait for.
enum class TransferRole : uint8_t { kPushProducer, kPushConsumer, kPullProducer, kPullConsumer };
TransferRole transfer_role(SessionSide side, TransferMode mode);
// Whether `role` posts the data ops (push producer, pull consumer).
bool posts_ops(TransferRole role);
const char* transfer_role_name(TransferRole role);

enum class SessionState : uint8_t {
  kActive,    // Producer: writing (push) or holding (pull); consumer: reserved or reading.
  kSealed,    // Producer push: the write counts are sealed, flushes / WriteDones pending.
  kComplete,  // Producer: every leg done.
  kReady,     // Consumer: every leg done; the blocks hold the request's KV.
  kAborted,
};

const char* session_state_name(SessionState state);

// Hands a request's blocks back to the engine's block allocator.
using BlockReleaseFn = std::function<void(const std::string& request_id, std::vector<int> blocks)>;

// What a leg completion did.
enum class LegResult : uint8_t {
  kAccepted,
  kDuplicate,    // The leg was already done with the same count: ignored.
  kMismatch,     // The count differs from the expected one: the session aborted.
  kUnknownPeer,  // The peer is not a leg of this session: ignored.
  kInactive,     // The session already finished or aborted: ignored (stale).
};

class Session {
 public:
  // `peers` are the peer ranks of the legs (fan-out for a producer, fan-in for a consumer); a
  // pull producer that does not know the consumer TP yet passes none and calls set_peers().
  Session(std::string request_id, SessionSide side, TransferMode mode, std::vector<int> blocks,
          std::vector<int> peers, TimePoint deadline, Duration quarantine, BlockReleaseFn release);

  const std::string& request_id() const { return request_id_; }
  SessionSide side() const { return side_; }
  TransferMode mode() const { return mode_; }
  TransferRole role() const { return role_; }
  SessionState state() const { return state_; }
  const Status& error() const { return error_; }
  TimePoint deadline() const { return deadline_; }
  const std::vector<int>& blocks() const { return blocks_; }
  bool peers_known() const { return peers_known_; }
  std::vector<int> peers() const;
  bool released() const { return released_; }
  // Active or sealed: still moving data.
  bool active() const { return state_ == SessionState::kActive || state_ == SessionState::kSealed; }
  // Nothing left to do: ready, or complete/aborted with the blocks released.
  bool finished() const { return state_ == SessionState::kReady || released_; }

  // Sets the legs once (pull producer, learnt from the first Release); refused if set.
  Status set_peers(std::vector<int> peers);
  // Producer push: adds `ops` writes scheduled to `peer`; refused once sealed or aborted.
  Status add_scheduled(int peer, uint64_t ops);
  // Writes scheduled to `peer` so far (the sealed count after seal()).
  uint64_t scheduled(int peer) const;
  // Producer push: seals the counts (the forward pass ended); refused twice or after abort.
  Status seal();
  bool sealed() const { return sealed_; }

  // A leg finished with `count` ops where `expected` were planned (equal for legs that do not
  // carry a count). A mismatch aborts the session: its safety cannot be proven.
  LegResult leg_done(int peer, uint64_t count, uint64_t expected);
  bool leg_is_done(int peer) const;
  // The peer can no longer touch the blocks (its ops ended, or it confirmed it stopped).
  void leg_quiet(int peer);
  bool leg_is_quiet(int peer) const;
  bool all_quiet() const;

  // Aborts an active session (the first error is kept); returns false if it was not active.
  bool fail(const Status& why);
  // Aborts with DeadlineExceeded when the lease passed while active (marked the peer's fault on
  // the side waiting for the peer's word, kvtransfer/fault.h); returns true if it did.
  bool check_lease(TimePoint now);
  // Releases the blocks through the callback if that is safe now; true if this call did.
  bool maybe_release(TimePoint now);
  // Whether the peer accesses this side's blocks (push consumer, pull producer), rather than
  // this side the peer's.
  bool remote_access() const { return !posts_ops(role_); }

 private:
  struct Leg {
    uint64_t scheduled = 0;
    bool done = false;
    uint64_t done_count = 0;
    bool quiet = false;
  };
  void maybe_finish();
  void release_now();

  const std::string request_id_;
  const SessionSide side_;
  const TransferMode mode_;
  const TransferRole role_;
  const std::vector<int> blocks_;
  const TimePoint deadline_;
  const Duration quarantine_;
  BlockReleaseFn release_;
  std::map<int, Leg> legs_;
  bool peers_known_ = false;
  bool sealed_ = false;
  bool released_ = false;
  SessionState state_ = SessionState::kActive;
  Status error_;
};

}  // namespace pdserve::kvtransfer
