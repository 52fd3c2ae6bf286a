// KvRankEndpoint's peer table: rank maps, peers recorded from their handshakes, the fan of a
// request connected at once (cached control connections) or by non-blocking dials whose end
// binds or fails the waiting legs, and the transport connection to a peer's arena.
#include <algorithm>
#include <cstring>

#include "absl/strings/match.h"

#include "common/logging.h"
#include "kvtransfer/fault.h"
#include "kvtransfer/kv_endpoint.h"
#include "kvtransfer/kv_endpoint_internal.h"

namespace pdserve::kvtransfer {
namespace {

// The i-th incarnation of an optional list (0: unknown).
uint64_t incarnation_at(const std::vector<uint64_t>& incarnations, size_t i) {
  return i < incarnations.size() ? incarnations[i] : 0;
}

}  // namespace

StatusOr<const RankMap*> KvRankEndpoint::map_for(int producer_tp, int consumer_tp) {
  const auto key = std::make_pair(producer_tp, consumer_tp);
  if (auto it = maps_.find(key); it != maps_.end()) return &it->second;
  PD_ASSIGN_OR_RETURN(RankMap map, build_rank_map(producer_tp, consumer_tp, seams_.planning_spec));
  seams_.mutate_map(map);
  return &maps_.emplace(key, std::move(map)).first->second;
}

StatusOr<std::optional<KvRankEndpoint::Remote::Arena>> KvRankEndpoint::announced_arena(
    const ControlPeer& peer, const char* region_name, const proto::ArenaInfo& info, const char* what) const {
  auto it = peer.regions.find(region_name);
  if (it == peer.regions.end() || info.num_blocks() == 0) return std::nullopt;
  if (info.spec_fingerprint() != options_.spec.fingerprint()) {
    return absl::FailedPreconditionError("peer KV spec fingerprint differs");
  }
  Remote::Arena arena;
  PD_ASSIGN_OR_RETURN(arena.layout,
                      engine::KvCacheLayout::create(options_.spec, peer.rank, peer.tp_size, info.num_blocks()));
  if (arena.layout->total_bytes() != info.arena_bytes()) {
    return absl::FailedPreconditionError(absl::StrCat("peer ", what, " of ", info.arena_bytes(),
                                                      " bytes, its layout needs ", arena.layout->total_bytes()));
  }
  PD_ASSIGN_OR_RETURN(arena.planning_layout,
                      engine::KvCacheLayout::create(seams_.planning_spec, peer.rank, peer.tp_size, info.num_blocks()));
  arena.descriptor = it->second;
  return arena;
}

Status KvRankEndpoint::record_remote(const ControlPeer& peer, Remote** out) {
  PD_ASSIGN_OR_RETURN(std::optional<Remote::Arena> device, announced_arena(peer, kArenaRegion, peer.arena, "arena"));
  if (!device) {
    return absl::InvalidArgumentError(absl::StrCat("peer rank ", peer.rank, "/", peer.tp_size,
                                                   " announced no KV arena"));
  }
  PD_ASSIGN_OR_RETURN(std::optional<Remote::Arena> host,
                      announced_arena(peer, kHostArenaRegion, peer.host_arena, "host-tier arena"));
  Remote& remote = remotes_[peer.worker_address];
  if (!remote.error.ok() || remote.address.empty()) {
    remote = Remote{};  // New, or a lost peer that handshook again.
    remote.address = peer.worker_address;
  }
  remote.role = peer.role;
  remote.tp = static_cast<int>(peer.tp_size);
  remote.rank = static_cast<int>(peer.rank);
  auto update = [](Remote::Arena& arena, std::optional<Remote::Arena> fresh) {
    // A descriptor the transport already loaded for this peer stays loaded.
    if (fresh && fresh->descriptor == arena.descriptor) fresh->loaded = arena.loaded;
    arena = std::move(fresh).value_or(Remote::Arena{});
  };
  update(remote.arena(KvRegion::kDevice), std::move(device));
  update(remote.arena(KvRegion::kHost), std::move(host));
  // Prefer a connection we dialed for sending: it exists as long as we keep it.
  if (remote.control_id == 0 || peer.dialed || !remote.dialed) {
    remote.control_id = peer.id;
    remote.dialed = remote.dialed || peer.dialed;
  }
  remote_by_control_[peer.id] = peer.worker_address;
  if (out) *out = &remote;
  return absl::OkStatus();
}

StatusOr<KvRankEndpoint::Remote*> KvRankEndpoint::accept_dialed(const ControlPeer& peer, const std::string& endpoint,
                                                                int tp, int rank) {
  // A cached connection already recorded (and checked) needs no second look: rebuilding its
  // layouts was a good part of a small request's overhead.
  Remote* remote = nullptr;
  if (auto known = remote_by_control_.find(peer.id); known != remote_by_control_.end()) {
    auto rit = remotes_.find(known->second);
    if (rit != remotes_.end() && rit->second.error.ok() && rit->second.control_id == peer.id) remote = &rit->second;
  }
  if (remote == nullptr) PD_RETURN_IF_ERROR(record_remote(peer, &remote));
  const proto::Role want =
      options_.side == SessionSide::kProducer ? proto::ROLE_DECODE : proto::ROLE_PREFILL;
  if (remote->role != want || remote->tp != tp || remote->rank != rank) {
    return absl::InvalidArgumentError(absl::StrCat(
        endpoint, " is ", proto::Role_Name(remote->role), " rank ", remote->rank, "/",
        remote->tp, ", expected ", proto::Role_Name(want), " rank ", rank, "/", tp));
  }
  return remote;
}

StatusOr<KvRankEndpoint::Fan> KvRankEndpoint::connect_fan(
    const std::string& request_id, const std::vector<int>& ranks,
    const std::vector<std::string>& endpoints, int tp, const std::vector<uint64_t>& incarnations,
    const std::vector<int>* remote_blocks, KvRegion remote_region, const char* what) {
  Fan fan;
  auto unreachable = [&](int r, const Status& why) {
    fan.unreachable = unreachable_peer(absl::Status(
        why.code(), absl::StrCat("request ", request_id, ": ", what, " rank ", r, ": ", std::string(why.message()))));
  };
  for (int r : ranks) {
    const std::string& endpoint = endpoints[r];
    const uint64_t incarnation = incarnation_at(incarnations, r);
    if (const ControlPeer* peer = control_->cached(endpoint, incarnation)) {
      StatusOr<Remote*> remote = accept_dialed(*peer, endpoint, tp, r);
      if (!remote.ok()) {
        unreachable(r, remote.status());
        break;
      }
      if (remote_blocks) PD_RETURN_IF_ERROR(check_remote_blocks(**remote, remote_region, *remote_blocks, what));
      fan.remotes[r] = *remote;
      continue;
    }
    // Dialed without blocking this thread: a slow or dead peer stalls only the requests that
    // need it, for at most connect_timeout (on_dialed).
    if (auto it = dial_by_endpoint_.find(endpoint); it != dial_by_endpoint_.end()) {
      fan.dialing[r] = it->second;
      continue;
    }
    StatusOr<uint64_t> dial = control_->start_connect(endpoint, options_.connect_timeout, incarnation);
    if (!dial.ok()) {
      unreachable(r, dial.status());
      break;
    }
    dials_[*dial].endpoint = endpoint;
    dial_by_endpoint_[endpoint] = *dial;
    fan.dialing[r] = *dial;
  }
  return fan;
}

void KvRankEndpoint::wait_for_dials(const std::string& id, Request& request, const Fan& fan) {
  for (const auto& [r, dial] : fan.dialing) {
    request.legs.at(r).dialing = true;
    ++request.dials_pending;
    dials_.at(dial).waiters.emplace_back(id, r);
  }
}

void KvRankEndpoint::on_dialed(const ControlEvent& event) {
  auto dit = dials_.find(event.dial);
  if (dit == dials_.end()) return;
  const Dial dial = std::move(dit->second);
  dials_.erase(dit);
  dial_by_endpoint_.erase(dial.endpoint);
  StatusOr<ControlPeer> peer = event.error.ok() ? control_->peer(event.peer) : StatusOr<ControlPeer>(event.error);
  if (peer.ok()) {
    for (const proto::Envelope& abort : dial.aborts) (void)control_->send(event.peer, abort);
  }
  const bool producer = options_.side == SessionSide::kProducer;
  const char* what = peer_side_name();
  for (const auto& [id, r] : dial.waiters) {
    auto it = requests_.find(id);
    if (it == requests_.end()) continue;
    Request& request = it->second;
    Leg& leg = request.legs.at(r);
    if (!leg.dialing) continue;
    leg.dialing = false;
    --request.dials_pending;
    const int tp = producer ? request.consumer_tp : request.producer_tp;
    StatusOr<Remote*> remote = peer.ok() ? accept_dialed(*peer, dial.endpoint, tp, r) : StatusOr<Remote*>(peer.status());
    if (!request.session->active()) {
      // Failed meanwhile (abort, lease, another leg): bound all the same, so that step_abort's
      // abort reaches the peer, which may already have been told of the request by others.
      if (remote.ok() && leg.remote.empty()) leg.remote = (*remote)->address;
      continue;
    }
    Status status = remote.status();
    const bool reached = status.ok();
    const TransferRole role = request.session->role();
    // The peer's blocks this side names in its ops (a push consumer names none).
    const std::vector<int>* remote_blocks = role == TransferRole::kPushProducer ? &request.consumer_blocks
                                            : role == TransferRole::kPushConsumer ? nullptr
                                                                                  : &request.producer_blocks;
    // A pull consumer's are in the producer's arena request.region; a push producer's in the
    // consumer's KV arena (request.region stays kDevice).
    if (status.ok() && remote_blocks) status = check_remote_blocks(**remote, request.region, *remote_blocks, what);
    if (status.ok()) status = open_leg(id, request, r, **remote);
    if (!status.ok() && request.session->active()) {
      Status why = leg_status(id, what, r, status);
      if (!reached) {
        why = unreachable_peer(std::move(why));
        // Nothing of ours reached that peer, and it did not reach us: that leg is quiet.
        if (request.session->role() == TransferRole::kPushConsumer) request.session->leg_quiet(r);
      } else if (is_peer_fault(status)) {
        why = peer_fault(std::move(why));
      }
      fail(request, why);
    }
  }
}

Status KvRankEndpoint::open_leg(const std::string& id, Request& request, int r, Remote& remote) {
  Leg& leg = request.legs.at(r);
  switch (request.session->role()) {
    case TransferRole::kPullProducer:
    case TransferRole::kPullConsumer: return open_pull_leg(id, request, r, leg, remote);
    case TransferRole::kPushProducer:
      PD_RETURN_IF_ERROR(open_push_leg(id, request, r, leg, remote));
      // seal() ran while legs were dialing: it goes out once the last of them is open.
      if (request.dials_pending == 0 && request.deferred_seal) return seal_now(id, request, *request.deferred_seal);
      return absl::OkStatus();
    case TransferRole::kPushConsumer: leg.remote = remote.address; return absl::OkStatus();
  }
  return absl::OkStatus();
}

Status KvRankEndpoint::start_legs(const std::string& id, Request& request, const Fan& fan) {
  if (!fan.unreachable.ok()) {
    fail(request, fan.unreachable);
    return fan.unreachable;
  }
  wait_for_dials(id, request, fan);
  for (const auto& [r, remote] : fan.remotes) {
    const Status status = open_leg(id, request, r, *remote);
    if (!status.ok()) {
      Status why = leg_status(id, peer_side_name(), r, status);
      if (is_peer_fault(status)) why = peer_fault(std::move(why));
      fail(request, why);
      return why;
    }
  }
  return absl::OkStatus();
}

Status KvRankEndpoint::leg_status(const std::string& id, const char* what, int r, const Status& status) {
  return absl::Status(status.code(),
                      absl::StrCat("request ", id, ": ", what, " rank ", r, ": ", std::string(status.message())));
}

Status KvRankEndpoint::ensure_transport(Remote& remote) {
  // A lost peer, or one whose data path cannot be opened, is the peer's fault (fault.h).
  if (!remote.error.ok()) return peer_fault(remote.error);
  if (remote.transport_ready) return absl::OkStatus();
  StatusOr<PeerId> peer = transport_->connect(remote.address);
  if (!peer.ok()) return peer_fault(peer.status());
  remote.transport_peer = *peer;
  remote.transport_ready = true;  // Its arenas' descriptors are loaded when first used (remote_region).
  return absl::OkStatus();
}

StatusOr<RemoteRegionId> KvRankEndpoint::remote_region(Remote& remote, KvRegion region) {
  Remote::Arena& arena = remote.arena(region);
  if (arena.loaded) return *arena.loaded;
  if (!arena.layout) return missing_arena(remote, region, "peer");
  StatusOr<RemoteRegionId> id = transport_->load_remote_region(remote.transport_peer, arena.descriptor);
  if (!id.ok()) return peer_fault(id.status());
  arena.loaded = *id;
  return *id;
}

Status KvRankEndpoint::check_remote_blocks(const Remote& remote, KvRegion region, const std::vector<int>& blocks,
                                           const char* what) const {
  const Remote::Arena& arena = remote.arena(region);
  if (!arena.layout) return missing_arena(remote, region, what);
  return check_blocks(blocks, arena.layout->num_blocks(), what);
}

Status KvRankEndpoint::missing_arena(const Remote& remote, KvRegion region, const char* who) {
  const char* arena =
      region == KvRegion::kHost ? "host-tier arena (it runs without --host-kv-bytes) to read from" : "KV arena";
  return absl::FailedPreconditionError(absl::StrCat(who, " rank ", remote.rank, "/", remote.tp, " announced no ", arena));
}

}  // namespace pdserve::kvtransfer
