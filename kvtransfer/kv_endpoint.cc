// KvRankEndpoint (kv_endpoint.h): creation, request registration and planning, the progress
// loop and the debug checksums. The other concepts have their own files: the peer table and
// dials (kv_endpoint_peers.cc), push and pull sessions (kv_endpoint_push.cc,
// kv_endpoint_pull.cc) and the abort path (kv_endpoint_abort.cc).
#include "kvtransfer/kv_endpoint.h"
#include "kvtransfer/kv_endpoint_internal.h"

#include "kvtransfer/block_checksums.h"
#include "kvtransfer/fault.h"

#include <algorithm>
#include <cstring>
#include <random>

#include "absl/strings/match.h"

#include "common/logging.h"
#include "kvtransfer/control/compat.h"
#include "kvtransfer/ucx/ucx_transport.h"

namespace pdserve::kvtransfer {
namespace {

// How many finished ids an endpoint remembers (FinishedIds).
constexpr size_t kFinishedMemory = 4096;

uint64_t new_incarnation() {
  std::random_device device;
  std::mt19937_64 bits((uint64_t(device()) << 32) ^ device());
  uint64_t id = 0;
  while (id == 0) id = bits();
  return id;
}

}  // namespace

StatusOr<std::unique_ptr<KvRankEndpoint>> KvRankEndpoint::create(KvEndpointOptions options) {
  if ((options.arena == nullptr) != options.allocate_arena) {
    return absl::InvalidArgumentError(options.allocate_arena
                                          ? "allocate_arena needs a null arena"
                                          : "no KV arena given");
  }
  if (options.arena_memory != MemoryKind::kHost && (options.allocate_arena || options.checksums))
    return absl::InvalidArgumentError(absl::StrCat("a ", memory_kind_name(options.arena_memory),
                                                   " arena is the engine's own, without debug checksums"));
  PD_ASSIGN_OR_RETURN(engine::KvCacheLayout layout,
                      engine::KvCacheLayout::create(options.spec, options.rank, options.tp,
                                                    options.num_blocks));
  std::unique_ptr<KvRankEndpoint> endpoint(
      new KvRankEndpoint(std::move(options), std::move(layout)));
  PD_RETURN_IF_ERROR(endpoint->init());
  return endpoint;
}

KvRankEndpoint::KvRankEndpoint(KvEndpointOptions options, engine::KvCacheLayout layout)
    : options_(std::move(options)),
      layout_(std::move(layout)),
      incarnation_(new_incarnation()),
      finished_(kFinishedMemory),
      seams_(make_endpoint_seams(options_.spec, options_.test_faults)) {}

KvRankEndpoint::~KvRankEndpoint() {
  // Sessions still open die with the process's arena; nothing may call back into us now.
  if (transport_) {
    transport_->set_peer_error_callback(nullptr);
    transport_->set_activity_callback(nullptr);
  }
}

Status KvRankEndpoint::init() {
  UcxTransportOptions topts;
  topts.clock = options_.clock;
  topts.direct_copy = options_.direct_copy;
  topts.name = absl::StrCat(options_.name, ".", options_.rank);
  PD_ASSIGN_OR_RETURN(transport_, UcxTransport::create(topts));
  transport_->set_peer_error_callback([this](PeerId peer, const Status& error) {
    std::lock_guard<std::mutex> lock(transport_errors_mu_);
    transport_errors_.emplace_back(peer, error);
    wake_.signal();
  });
  // A finished batch may let a request move on (WRITE_DONE, release): progress() looks at once.
  transport_->set_activity_callback([this] { wake_.signal(); });
  RegisteredRegion region;
  if (options_.allocate_arena) {
    PD_ASSIGN_OR_RETURN(AllocatedRegion allocated,
                        transport_->allocate_region(layout_.total_bytes(), MemoryKind::kHost));
    std::memset(allocated.addr, 0, layout_.total_bytes());  // Not zeroed by the transport.
    options_.arena = allocated.addr;
    region = {allocated.id, std::move(allocated.descriptor)};
  } else {
    PD_ASSIGN_OR_RETURN(region, transport_->register_region({options_.arena, layout_.total_bytes(),
                                                             options_.arena_memory, options_.arena_device}));
  }
  region_ = region.id;
  PD_ASSIGN_OR_RETURN(planning_layout_, engine::KvCacheLayout::create(seams_.planning_spec, options_.rank,
                                                                      options_.tp, layout_.num_blocks()));
  RegisteredRegion host_region;
  if (options_.host_arena != nullptr) {
    PD_ASSIGN_OR_RETURN(host_.layout, engine::KvCacheLayout::create(options_.spec, options_.rank, options_.tp,
                                                                    options_.host_num_blocks));
    PD_ASSIGN_OR_RETURN(host_.planning_layout,
                        engine::KvCacheLayout::create(seams_.planning_spec, options_.rank, options_.tp,
                                                      options_.host_num_blocks));
    PD_ASSIGN_OR_RETURN(host_region, transport_->register_region({options_.host_arena, host_.layout->total_bytes(),
                                                                  MemoryKind::kHost, 0}));
    host_.id = host_region.id;
  }

  ControlChannelOptions copts;
  copts.bind_endpoint = options_.bind_endpoint;
  copts.clock = options_.clock;
  copts.heartbeat_interval = options_.heartbeat_interval;
  copts.peer_timeout = options_.peer_timeout;
  copts.wake = &wake_;
  copts.curve_secret_key = options_.curve_secret_key;
  copts.local_lane = options_.local_lane;
  proto::Handshake& local = copts.local;
  local.set_compat_hash(compat_hash(options_.model_id, options_.spec));
  local.set_role(options_.side == SessionSide::kProducer ? proto::ROLE_PREFILL
                                                         : proto::ROLE_DECODE);
  local.set_tp_size(options_.tp);
  local.set_rank(options_.rank);
  local.set_worker_address(transport_->local_address());
  local.set_incarnation(incarnation_);
  local.set_geometry(absl::StrCat(options_.model_id, ": ", options_.spec.describe()));
  auto* arena = local.add_regions();
  arena->set_name(kArenaRegion);
  arena->set_blob(region.descriptor);
  proto::ArenaInfo& info = *local.mutable_arena();
  info.set_num_blocks(layout_.num_blocks());
  info.set_arena_bytes(layout_.total_bytes());
  info.set_spec_fingerprint(options_.spec.fingerprint());
  if (host_.layout) {
    auto* host = local.add_regions();
    host->set_name(kHostArenaRegion);
    host->set_blob(host_region.descriptor);
    proto::ArenaInfo& hinfo = *local.mutable_host_arena();
    hinfo.set_num_blocks(host_.layout->num_blocks());
    hinfo.set_arena_bytes(host_.layout->total_bytes());
    hinfo.set_spec_fingerprint(options_.spec.fingerprint());
  }
  PD_ASSIGN_OR_RETURN(control_, ControlChannel::create(std::move(copts)));
  PD_LOG_INFO("kvtransfer {}.{}: {} rank {}/{} on {}, {} blocks ({} bytes){}, control {} ({})",
              options_.name, options_.rank,
              options_.side == SessionSide::kProducer ? "producer" : "consumer", options_.rank,
              options_.tp, transport_->describe(), layout_.num_blocks(), layout_.total_bytes(),
              host_.layout ? absl::StrCat(" + host tier ", host_.layout->num_blocks(), " blocks") : "",
              control_->endpoint(), options_.curve_secret_key.empty() ? "plaintext" : "CURVE-encrypted");
  return absl::OkStatus();
}

void KvEndpointCounters::merge_rank(const KvEndpointCounters& other) {
  bytes += other.bytes;
  ops += other.ops;
  requests_done = std::max(requests_done, other.requests_done);
  failures = std::max(failures, other.failures);
  leases_expired += other.leases_expired;
  duplicates_ignored += other.duplicates_ignored;
  stale_ignored += other.stale_ignored;
  refused += other.refused;
  blocks_released += other.blocks_released;
  notifications_on_lane += other.notifications_on_lane;
  latency_total = std::max(latency_total, other.latency_total);
  latency_max = std::max(latency_max, other.latency_max);
}

const std::string& KvRankEndpoint::control_endpoint() const { return control_->endpoint(); }

std::string KvRankEndpoint::describe() const {
  return absl::StrCat(options_.side == SessionSide::kProducer ? "producer" : "consumer", " rank ",
                      options_.rank, "/", options_.tp, " ", transport_->describe(), " control ",
                      control_->endpoint(), options_.local_lane ? " + same-host lane" : "",
                      options_.checksums ? " checksums" : "");
}

KvEndpointCounters KvRankEndpoint::counters() const {
  KvEndpointCounters counters = counters_;
  counters.notifications_on_lane = control_->lane_counters().sent;
  return counters;
}

StatusOr<TransferPlan> KvRankEndpoint::plan(int producer_rank, int consumer_rank,
                                            const Remote& remote, const Request& request,
                                            const std::vector<int>& consumer_blocks,
                                            int skip_blocks) {
  PD_ASSIGN_OR_RETURN(const RankMap* map, map_for(request.producer_tp, request.consumer_tp));
  // Planned with the seams' layouts: the real ones, except in the mutation tests (TestFaults).
  // A pull reads the producer's arena request.region; the consumer's blocks are always its KV arena's.
  const bool producer = options_.side == SessionSide::kProducer;
  if (producer) {
    return plan_for_pair(producer_rank, consumer_rank, *map, own_planning_layout(request.region),
                         *remote.arena(KvRegion::kDevice).planning_layout, request.producer_blocks, consumer_blocks,
                         skip_blocks);
  }
  const Remote::Arena& source = remote.arena(request.region);
  if (!source.planning_layout) return missing_arena(remote, request.region, "producer");
  return plan_for_pair(producer_rank, consumer_rank, *map, *source.planning_layout, *planning_layout_,
                       request.producer_blocks, consumer_blocks, skip_blocks);
}

const engine::KvCacheLayout& KvRankEndpoint::own_planning_layout(KvRegion region) const {
  // hold() refuses a host region on a rank without one, so the host layout is set here.
  return region == KvRegion::kHost ? *host_.planning_layout : *planning_layout_;
}

uint8_t* KvRankEndpoint::own_memory(KvRegion region) const {
  return region == KvRegion::kHost ? static_cast<uint8_t*>(options_.host_arena) : arena();
}

Status KvRankEndpoint::check_blocks(const std::vector<int>& blocks, int num_blocks,
                                    const char* what) const {
  if (blocks.empty()) return absl::InvalidArgumentError(absl::StrCat("no ", what, " blocks"));
  std::set<int> seen;
  for (int b : blocks) {
    if (b < 0 || b >= num_blocks) {
      return absl::OutOfRangeError(absl::StrCat(what, " block id ", b, " outside [0, ",
                                                num_blocks, ")"));
    }
    if (!seen.insert(b).second) {
      return absl::InvalidArgumentError(absl::StrCat(what, " block id ", b, " listed twice"));
    }
  }
  return absl::OkStatus();
}

Status KvRankEndpoint::check_new_request(const std::string& request_id) const {
  if (request_id.empty()) return absl::InvalidArgumentError("empty request id");
  if (requests_.count(request_id) || finished_.contains(request_id)) {
    return absl::AlreadyExistsError(absl::StrCat("request ", request_id, " already seen"));
  }
  return absl::OkStatus();
}

KvRankEndpoint::Request& KvRankEndpoint::add_request(const std::string& id, TransferMode mode,
                                                     std::vector<int> blocks,
                                                     std::vector<int> peers, Duration lease) {
  const TimePoint now = options_.clock->now();
  Request& request = requests_[id];
  request.start = now;
  BlockReleaseFn release = [this](const std::string& rid, std::vector<int> b) {
    counters_.blocks_released += b.size();
    if (options_.on_release) options_.on_release(rid, std::move(b));
  };
  request.session = std::make_unique<Session>(
      id, options_.side, mode, std::move(blocks), std::move(peers),
      now + (lease.count() > 0 ? lease : options_.default_lease), options_.quarantine,
      std::move(release));
  for (int p : request.session->peers()) request.legs[p];
  return request;
}

Status KvRankEndpoint::send(Remote& remote, const proto::Envelope& message) {
  if (!remote.error.ok()) return remote.error;
  return control_->send(remote.control_id, message);
}

Status KvRankEndpoint::notify(Remote& remote, const proto::Envelope& message) {
  if (!remote.error.ok()) return remote.error;
  return seams_.notifier->notify(*control_, remote.control_id, message);
}


// ---------------------------------------------------------------------------------------------
// Progress

StatusOr<BatchId> KvRankEndpoint::post_batch(const TransferBatch& batch) {
  step_before_waiting_ = true;
  return transport_->post(batch);
}

StatusOr<BatchId> KvRankEndpoint::flush_peer(PeerId peer) {
  step_before_waiting_ = true;
  return transport_->flush(peer);
}

BatchState KvRankEndpoint::batch_state(BatchId batch, std::string* error) {
  StatusOr<BatchStatus> st = transport_->batch_status(batch);
  if (!st.ok()) {
    if (error) *error = std::string(st.status().message());
    return BatchState::kError;
  }
  if (st->state == BatchState::kError && error) *error = st->error;
  return st->state;
}

bool KvRankEndpoint::leg_ops_ended(Leg& leg, std::string* error) {
  bool ended = true;
  for (BatchId b : leg.batches) {
    if (batch_state(b, error) == BatchState::kInProgress) ended = false;
  }
  if (leg.flush && batch_state(*leg.flush, error) == BatchState::kInProgress) ended = false;
  return ended;
}

bool KvRankEndpoint::step(const std::string& id, Request& request,
                          std::vector<KvTransferEvent>& events) {
  Session& session = *request.session;
  const TimePoint now = options_.clock->now();
  if (session.check_lease(now)) {
    ++counters_.leases_expired;
    ++counters_.failures;
    PD_LOG_WARN("kvtransfer {}.{}: {}", options_.name, options_.rank,
                session.error().ToString());
  }
  if (session.active()) {
    // The side posting the data ops drives them; the other waits for its peer's messages.
    switch (session.role()) {
      case TransferRole::kPushProducer: step_push_producer(id, request); break;
      case TransferRole::kPullConsumer: step_pull_consumer(id, request); break;
      case TransferRole::kPushConsumer:
      case TransferRole::kPullProducer: break;
    }
  }
  if (session.state() == SessionState::kAborted) step_abort(id, request);
  session.maybe_release(now);

  if (!request.event_sent && !session.active()) {
    KvTransferEvent event;
    event.request_id = id;
    event.latency = now - request.start;
    event.bytes = request.bytes;
    event.ops = request.ops;
    switch (session.state()) {
      case SessionState::kReady:
        event.kind = KvTransferEvent::Kind::kReady;
        event.first_token = request.first_token;
        event.push_tail = request.push_tail;
        break;
      case SessionState::kComplete: event.kind = KvTransferEvent::Kind::kComplete; break;
      default:
        event.kind = KvTransferEvent::Kind::kFailed;
        event.error = session.error();
        break;
    }
    if (event.kind != KvTransferEvent::Kind::kFailed) {
      ++counters_.requests_done;
      counters_.bytes += request.bytes;
      counters_.ops += request.ops;
      counters_.latency_total += event.latency;
      counters_.latency_max = std::max(counters_.latency_max, event.latency);
    }
    // A failed request is reported once its blocks are back, so "failed" means "cleaned up".
    if (event.kind != KvTransferEvent::Kind::kFailed || session.released()) {
      request.event_sent = true;
      events.push_back(std::move(event));
    }
  }
  return request.event_sent && session.finished();
}

void KvRankEndpoint::on_control_event(const ControlEvent& event) {
  switch (event.kind) {
    case ControlEvent::Kind::kPeerJoined: {
      StatusOr<ControlPeer> peer = control_->peer(event.peer);
      if (!peer.ok()) return;
      const Status st = record_remote(*peer, nullptr);
      if (!st.ok()) {
        ++counters_.refused;
        PD_LOG_WARN("kvtransfer {}.{}: peer rank {}/{} refused: {}", options_.name, options_.rank,
                    peer->rank, peer->tp_size, st.ToString());
      }
      return;
    }
    case ControlEvent::Kind::kPeerLost: {
      auto it = remote_by_control_.find(event.peer);
      if (it != remote_by_control_.end()) on_remote_lost(it->second, event.error);
      return;
    }
    case ControlEvent::Kind::kWoken: return;  // progress() steps every request anyway.
    case ControlEvent::Kind::kDialed: on_dialed(event); return;
    case ControlEvent::Kind::kMessage: {
      auto it = remote_by_control_.find(event.peer);
      if (it == remote_by_control_.end()) {
        // A connection this side dialed but never recorded (a dial whose requests had gone), which
        // a lane message may name: the peer handshook on it, so it is recorded now.
        StatusOr<ControlPeer> peer = control_->peer(event.peer);
        if (peer.ok() && record_remote(*peer, nullptr).ok()) it = remote_by_control_.find(event.peer);
      }
      if (it == remote_by_control_.end()) {
        ++counters_.refused;
        return;
      }
      Remote& from = remotes_.at(it->second);
      if (event.message.has_write_done()) {
        on_write_done(from, event.message);
      } else if (event.message.has_release()) {
        on_release(from, event.message.release());
      } else if (event.message.has_abort()) {
        on_abort(from, event.message.abort());
      } else if (event.message.has_checksum_request()) {
        on_checksum_request(from, event.message.checksum_request());
      } else if (event.message.has_block_checksums()) {
        on_block_checksums(from, event.message.block_checksums());
      }
      return;
    }
  }
}

std::vector<KvTransferEvent> KvRankEndpoint::progress(Duration timeout) {
  std::vector<KvTransferEvent> events;
  // Our own ops' later completions, peer messages and wake() all end the wait early; ops that
  // ended inside our own calls since the last round are stepped without waiting.
  const Duration wait = step_before_waiting_ ? Duration(0) : timeout;
  step_before_waiting_ = false;
  StatusOr<ControlEvent> event = absl::DeadlineExceededError("no control event");
  if (options_.busy_poll && !requests_.empty()) {
    const auto until = std::chrono::steady_clock::now() + wait;
    do {
      transport_->progress();
      event = control_->receive(Duration(0));  // One look at the sockets, without waiting.
    } while (!event.ok() && std::chrono::steady_clock::now() < until);
  } else {
    event = control_->receive(wait);
  }
  while (event.ok()) {
    on_control_event(*event);
    event = control_->receive(Duration(0));
  }
  std::vector<std::pair<PeerId, Status>> errors;
  {
    std::lock_guard<std::mutex> lock(transport_errors_mu_);
    errors.swap(transport_errors_);
  }
  for (const auto& [peer, error] : errors) {
    for (auto& [address, remote] : remotes_) {
      if (remote.transport_ready && remote.transport_peer == peer) {
        remote.transport_ready = false;  // The endpoint is unusable; a retry reconnects.
        on_remote_lost(address, error);
      }
    }
  }
  bool remote_ops = false;
  for (auto it = requests_.begin(); it != requests_.end();) {
    remote_ops |= it->second.session->remote_access() && it->second.session->active();
    if (step(it->first, it->second, events)) {
      for (auto& [rank, leg] : it->second.legs) {
        for (BatchId b : leg.batches) (void)transport_->release_batch(b);
        if (leg.flush) (void)transport_->release_batch(*leg.flush);
      }
      const Session& ended = *it->second.session;
      finished_.remember(it->first, ended.error().ok() ? "finished" : ended.error().ToString());
      it = requests_.erase(it);
    } else {
      ++it;
    }
  }
  if (remote_ops != remote_ops_expected_) {
    remote_ops_expected_ = remote_ops;
    transport_->expect_remote_ops(remote_ops);
  }
  return events;
}

// ---------------------------------------------------------------------------------------------
// Debug checksums (block_checksums.h)

std::span<const int> KvRankEndpoint::sent_consumer_blocks(const Request& request) {
  // skip_blocks was checked against the list when the request was registered.
  return std::span<const int>(request.consumer_blocks).subspan(static_cast<size_t>(request.skip_blocks));
}

std::vector<uint64_t> KvRankEndpoint::checksums(std::span<const int> consumer_blocks, const TransferPlan& plan,
                                                const Remote& remote, ChecksumSide side, KvRegion region) const {
  // The consumer's layout attributes bytes to blocks; the bytes are in this rank's arena that the
  // plan's offsets address (a producer's source may be its host tier's).
  const bool consumer = options_.side == SessionSide::kConsumer;
  return block_checksums(consumer ? layout_ : *remote.arena(KvRegion::kDevice).layout,
                         consumer ? arena() : own_memory(region), consumer_blocks, plan,
                         side);
}

Status KvRankEndpoint::verify_checksums(const std::string& id, const Request& request, int producer_rank,
                                        const Leg& leg, const std::vector<uint64_t>& expected) const {
  const std::vector<uint64_t> mine =
      checksums(sent_consumer_blocks(request), leg.plan, remotes_.at(leg.remote), ChecksumSide::kDestination,
                request.region);
  return compare_block_checksums(mine, expected, id, producer_rank, options_.rank, request.producer_blocks,
                                 request.consumer_blocks, request.skip_blocks);
}

}  // namespace pdserve::kvtransfer
