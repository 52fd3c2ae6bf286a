#include "kvtransfer/session.h"

#include "kvtransfer/fault.h"

namespace pdserve::kvtransfer {

TransferRole transfer_role(SessionSide side, TransferMode mode) {
  if (mode == TransferMode::kPush)
    return side == SessionSide::kProducer ? TransferRole::kPushProducer : TransferRole::kPushConsumer;
  return side == SessionSide::kProducer ? TransferRole::kPullProducer : TransferRole::kPullConsumer;
}

bool posts_ops(TransferRole role) {
  return role == TransferRole::kPushProducer || role == TransferRole::kPullConsumer;
}

const char* transfer_role_name(TransferRole role) {
  switch (role) {
    case TransferRole::kPushProducer: return "push producer";
    case TransferRole::kPushConsumer: return "push consumer";
    case TransferRole::kPullProducer: return "pull producer";
    case TransferRole::kPullConsumer: return "pull consumer";
  }
  return "?";
}

const char* session_state_name(SessionState state) {
  switch (state) {
    case SessionState::kActive: return "active";
    case SessionState::kSealed: return "sealed";
    case SessionState::kComplete: return "complete";
    case SessionState::kReady: return "ready";
    case SessionState::kAborted: return "aborted";
  }
  return "?";
}

Session::Session(std::string request_id, SessionSide side, TransferMode mode,
                 std::vector<int> blocks, std::vector<int> peers, TimePoint deadline,
                 Duration quarantine, BlockReleaseFn release)
    : request_id_(std::move(request_id)),
      side_(side),
      mode_(mode),
      role_(transfer_role(side, mode)),
      blocks_(std::move(blocks)),
      deadline_(deadline),
      quarantine_(quarantine),
      release_(std::move(release)) {
  const bool pull_producer = side_ == SessionSide::kProducer && mode_ == TransferMode::kPull;
  if (!peers.empty() || !pull_producer) {
    for (int p : peers) legs_[p];
    peers_known_ = true;
  }
  maybe_finish();
}

std::vector<int> Session::peers() const {
  std::vector<int> out;
  for (const auto& [p, leg] : legs_) out.push_back(p);
  return out;
}

Status Session::set_peers(std::vector<int> peers) {
  if (peers_known_) return absl::FailedPreconditionError("session peers are already known");
  for (int p : peers) legs_[p];
  peers_known_ = true;
  maybe_finish();
  return absl::OkStatus();
}

Status Session::add_scheduled(int peer, uint64_t ops) {
  if (sealed_) {
    return absl::FailedPreconditionError(
        absl::StrCat("request ", request_id_, ": write scheduled after the count was sealed"));
  }
  if (state_ != SessionState::kActive) return error_;
  auto it = legs_.find(peer);
  if (it == legs_.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat("request ", request_id_, ": rank ", peer, " is not in the fan-out"));
  }
  it->second.scheduled += ops;
  return absl::OkStatus();
}

uint64_t Session::scheduled(int peer) const {
  auto it = legs_.find(peer);
  return it == legs_.end() ? 0 : it->second.scheduled;
}

Status Session::seal() {
  if (sealed_) {
    return absl::FailedPreconditionError(absl::StrCat("request ", request_id_, " already sealed"));
  }
  if (state_ != SessionState::kActive) return error_;
  sealed_ = true;
  state_ = SessionState::kSealed;
  maybe_finish();
  return absl::OkStatus();
}

LegResult Session::leg_done(int peer, uint64_t count, uint64_t expected) {
  auto it = legs_.find(peer);
  if (it == legs_.end()) return LegResult::kUnknownPeer;
  Leg& leg = it->second;
  if (leg.done) return leg.done_count == count ? LegResult::kDuplicate : LegResult::kMismatch;
  if (!active()) return LegResult::kInactive;
  if (count != expected) {
    fail(absl::DataLossError(absl::StrCat(
        "request ", request_id_, ": rank ", peer, " sealed ", count, " writes but the plan has ",
        expected, "; cannot prove the KV arrived whole")));
    return LegResult::kMismatch;
  }
  leg.done = true;
  leg.done_count = count;
  leg.quiet = true;
  maybe_finish();
  return LegResult::kAccepted;
}

bool Session::leg_is_done(int peer) const {
  auto it = legs_.find(peer);
  return it != legs_.end() && it->second.done;
}

void Session::leg_quiet(int peer) {
  if (auto it = legs_.find(peer); it != legs_.end()) it->second.quiet = true;
}

bool Session::leg_is_quiet(int peer) const {
  auto it = legs_.find(peer);
  return it != legs_.end() && it->second.quiet;
}

bool Session::all_quiet() const {
  if (!peers_known_) return false;
  for (const auto& [p, leg] : legs_) {
    if (!leg.quiet) return false;
  }
  return true;
}

bool Session::fail(const Status& why) {
  if (!active()) return false;
  state_ = SessionState::kAborted;
  error_ = why.ok() ? absl::UnknownError("aborted") : why;
  return true;
}

bool Session::check_lease(TimePoint now) {
  if (!active() || now < deadline_) return false;
  Status expired = absl::DeadlineExceededError(
      absl::StrCat("request ", request_id_, ": lease expired in state ", session_state_name(state_)));
  // A side whose blocks the peer accesses (push consumer, pull producer) waits for the peer's
  // word that it is done: its lease passing means the peer never gave it — stalled, or its message
  // lost — so the peer is at fault (the router re-places the request and counts it against the
  // peer). A side posting the ops itself ran out of time on its own transfer.
  return fail(remote_access() ? peer_fault(std::move(expired)) : std::move(expired));
}

bool Session::maybe_release(TimePoint now) {
  if (released_) return false;
  switch (state_) {
    case SessionState::kComplete:
      release_now();
      return true;
    case SessionState::kAborted:
      if (all_quiet() || (remote_access() && now >= deadline_ + quarantine_)) {
        release_now();
        return true;
      }
      return false;
    default:
      return false;
  }
}

void Session::release_now() {
  released_ = true;
  if (release_) release_(request_id_, blocks_);
}

void Session::maybe_finish() {
  if (!active() || !peers_known_) return;
  for (const auto& [p, leg] : legs_) {
    if (!leg.done) return;
  }
  if (side_ == SessionSide::kConsumer) {
    state_ = SessionState::kReady;
  } else if (mode_ == TransferMode::kPull || sealed_) {
    state_ = SessionState::kComplete;
  }
}

}  // namespace pdserve::kvtransfer
