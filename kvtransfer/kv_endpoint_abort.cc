// KvRankEndpoint's abort path: local aborts and failures, aborts from peers (answered, and
// remembered in the bounded finished-id set), lost peers, and the steps of an aborted request
// until its blocks are safe to give back.
#include <algorithm>
#include <cstring>

#include "absl/strings/match.h"

#include "common/logging.h"
#include "kvtransfer/fault.h"
#include "kvtransfer/kv_endpoint.h"
#include "kvtransfer/kv_endpoint_internal.h"

namespace pdserve::kvtransfer {
namespace {

// An Abort whose reason starts with this answers another Abort; it is never answered itself.
constexpr const char* kAbortAckPrefix = "ack: ";

proto::Envelope abort_message(const std::string& id, const std::string& reason) {
  proto::Envelope message;
  message.mutable_abort()->set_request_id(id);
  message.mutable_abort()->set_reason(reason);
  return message;
}

}  // namespace

Status KvRankEndpoint::abort(const std::string& id, const std::string& reason) {
  auto it = requests_.find(id);
  if (it == requests_.end()) return absl::NotFoundError(absl::StrCat("no request ", id));
  fail(it->second, absl::AbortedError(absl::StrCat("request ", id, " aborted: ", reason)));
  return absl::OkStatus();
}

void KvRankEndpoint::fail(Request& request, const Status& why) {
  if (!request.session->fail(why)) return;
  ++counters_.failures;
  PD_LOG_WARN("kvtransfer {}.{}: {}", options_.name, options_.rank, why.ToString());
}

void KvRankEndpoint::on_abort(Remote& from, const proto::Abort& abort) {
  const bool is_ack = absl::StartsWith(abort.reason(), kAbortAckPrefix);
  auto it = requests_.find(abort.request_id());
  if (it == requests_.end()) {
    ++counters_.stale_ignored;
    if (!is_ack) {
      // Answering lets the peer free at once; remembering the id refuses a late start of it.
      finished_.remember(abort.request_id(), abort.reason());
      (void)send(from, abort_message(abort.request_id(), absl::StrCat(kAbortAckPrefix, "request not active")));
    }
    return;
  }
  Request& request = it->second;
  auto leg_it = request.legs.find(from.rank);
  if (leg_it == request.legs.end() || (!leg_it->second.remote.empty() &&
                                       leg_it->second.remote != from.address)) {
    ++counters_.refused;
    return;
  }
  // A leg whose own dial is still under way learns its peer here (the abort came over the peer's
  // connection): the answer goes back at once instead of waiting for the dial.
  const int peer_tp = options_.side == SessionSide::kProducer ? request.consumer_tp : request.producer_tp;
  if (leg_it->second.remote.empty() && from.tp == peer_tp) leg_it->second.remote = from.address;
  // A peer that accesses our blocks (push producer, pull consumer) sends Abort only once its
  // ops on them ended (step_abort), so that leg is quiet now; our own ops we track ourselves.
  if (request.session->remote_access()) request.session->leg_quiet(from.rank);
  // The peer ended the request (it failed, was told to by its router, or shut down): its side's
  // doing, which callers report as such (fault.h) — a push producer that already answered its
  // Prefill has no other way to say that it, not the decode worker, failed.
  fail(request, peer_fault(absl::AbortedError(absl::StrCat("request ", abort.request_id(),
                                                           " aborted by peer rank ", from.rank, "/",
                                                           from.tp, ": ", abort.reason()))));
}

void KvRankEndpoint::on_remote_lost(const std::string& address, const Status& why) {
  auto rit = remotes_.find(address);
  if (rit == remotes_.end() || !rit->second.error.ok()) return;
  Remote& remote = rit->second;
  remote.error = why;
  if (remote.transport_ready) {
    (void)transport_->disconnect(remote.transport_peer, std::string(why.message()));
  }
  for (auto& [id, request] : requests_) {
    for (auto& [rank, leg] : request.legs) {
      if (leg.remote != address) continue;
      if (request.session->leg_is_done(rank)) continue;
      fail(request, peer_fault(absl::UnavailableError(absl::StrCat("request ", id, ": peer rank ",
                                                        remote.rank, "/", remote.tp, " lost: ",
                                                        std::string(why.message())))));
    }
  }
}

void KvRankEndpoint::send_abort(Request& request, int rank, Leg& leg, const std::string& reason) {
  if (leg.abort_sent) return;
  std::vector<Remote*> targets;
  if (!leg.remote.empty()) {
    targets.push_back(&remotes_.at(leg.remote));
  } else if (options_.side == SessionSide::kConsumer) {
    // Unbound push consumer leg: every live producer rank of that TP and rank may be the one.
    for (auto& [address, remote] : remotes_) {
      if (remote.error.ok() && remote.role == proto::ROLE_PREFILL &&
          remote.tp == request.producer_tp && remote.rank == rank) {
        targets.push_back(&remote);
      }
    }
  }
  // Without a target yet (a leg whose dial is still under way), the next step tries again.
  if (targets.empty()) return;
  leg.abort_sent = true;
  const proto::Envelope message = abort_message(request.session->request_id(), reason);
  for (Remote* remote : targets) (void)send(*remote, message);
}


void KvRankEndpoint::queue_abort_on_dial(const std::string& id, int rank, const std::string& reason) {
  for (auto& [dial_id, dial] : dials_) {
    for (const auto& [waiting, waiting_rank] : dial.waiters) {
      if (waiting != id || waiting_rank != rank) continue;
      dial.aborts.push_back(abort_message(id, reason));
      return;
    }
  }
}

void KvRankEndpoint::step_abort(const std::string& id, Request& request) {
  Session& session = *request.session;
  const TimePoint now = options_.clock->now();
  const bool local_ops = posts_ops(session.role());
  const std::string reason = std::string(session.error().message());
  for (auto& [rank, leg] : request.legs) {
    if (leg.dialing && leg.remote.empty()) {
      // No ops went on this leg, but its peer may know of the request (its own dial, or the
      // other ranks): without a target yet, the abort waits on the dial and leaves when it ends,
      // and our blocks need not wait for it. Untold, the peer would hold its blocks until its
      // lease.
      send_abort(request, rank, leg, reason);  // A consumer reaches the producer ranks it knows.
      if (!leg.abort_sent) {
        queue_abort_on_dial(id, rank, reason);
        leg.abort_sent = true;
      }
      if (local_ops) session.leg_quiet(rank);
      continue;
    }
    if (local_ops && !session.leg_is_quiet(rank)) {
      // Our puts/gets on this leg must end before the blocks may be reused; puts must also be
      // remotely complete before we tell the consumer we stopped.
      Remote* remote = leg.remote.empty() ? nullptr : &remotes_.at(leg.remote);
      std::string error;
      if (!leg_ops_ended(leg, &error)) {
        if (now >= session.deadline() + options_.quarantine && remote && !leg.disconnected) {
          leg.disconnected = true;  // Stuck past the lease: failing the endpoint ends them.
          (void)transport_->disconnect(remote->transport_peer, "kvtransfer lease expired");
        }
        continue;
      }
      if (session.role() == TransferRole::kPushProducer && leg.posted > 0 && !leg.flush && remote &&
          remote->error.ok()) {
        StatusOr<BatchId> flush = flush_peer(remote->transport_peer);
        if (flush.ok()) {
          leg.flush = *flush;
          continue;
        }
      }
      session.leg_quiet(rank);
    }
    if (!session.leg_is_done(rank)) send_abort(request, rank, leg, reason);
  }
}

}  // namespace pdserve::kvtransfer
