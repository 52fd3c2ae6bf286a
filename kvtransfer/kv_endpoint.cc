#include "kvtransfer/kv_endpoint.h"

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

constexpr const char* kArenaRegion = "kv_arena";
// An Abort whose reason starts with this answers another Abort; it is never answered itself.
constexpr const char* kAbortAckPrefix = "ack: ";
// How many finished ids an endpoint remembers (FinishedIds).
constexpr size_t kFinishedMemory = 4096;

uint64_t new_incarnation() {
  std::random_device device;
  std::mt19937_64 bits((uint64_t(device()) << 32) ^ device());
  uint64_t id = 0;
  while (id == 0) id = bits();
  return id;
}

// The i-th incarnation of an optional list (0: unknown).
uint64_t incarnation_at(const std::vector<uint64_t>& incarnations, size_t i) {
  return i < incarnations.size() ? incarnations[i] : 0;
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

  ControlChannelOptions copts;
  copts.bind_endpoint = options_.bind_endpoint;
  copts.clock = options_.clock;
  copts.heartbeat_interval = options_.heartbeat_interval;
  copts.peer_timeout = options_.peer_timeout;
  copts.wake = &wake_;
  copts.curve_secret_key = options_.curve_secret_key;
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
  PD_ASSIGN_OR_RETURN(control_, ControlChannel::create(std::move(copts)));
  PD_LOG_INFO("kvtransfer {}.{}: {} rank {}/{} on {}, {} blocks ({} bytes), control {} ({})",
              options_.name, options_.rank,
              options_.side == SessionSide::kProducer ? "producer" : "consumer", options_.rank,
              options_.tp, transport_->describe(), layout_.num_blocks(), layout_.total_bytes(),
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
  latency_total = std::max(latency_total, other.latency_total);
  latency_max = std::max(latency_max, other.latency_max);
}

const std::string& KvRankEndpoint::control_endpoint() const { return control_->endpoint(); }

std::string KvRankEndpoint::describe() const {
  return absl::StrCat(options_.side == SessionSide::kProducer ? "producer" : "consumer", " rank ",
                      options_.rank, "/", options_.tp, " ", transport_->describe(), " control ",
                      control_->endpoint(), options_.checksums ? " checksums" : "");
}

// ---------------------------------------------------------------------------------------------
// Peers, maps, plans

StatusOr<const RankMap*> KvRankEndpoint::map_for(int producer_tp, int consumer_tp) {
  const auto key = std::make_pair(producer_tp, consumer_tp);
  if (auto it = maps_.find(key); it != maps_.end()) return &it->second;
  PD_ASSIGN_OR_RETURN(RankMap map, build_rank_map(producer_tp, consumer_tp, seams_.planning_spec));
  seams_.mutate_map(map);
  return &maps_.emplace(key, std::move(map)).first->second;
}

Status KvRankEndpoint::record_remote(const ControlPeer& peer, Remote** out) {
  auto arena_it = peer.regions.find(kArenaRegion);
  const proto::ArenaInfo& info = peer.arena;
  if (arena_it == peer.regions.end() || info.num_blocks() == 0) {
    return absl::InvalidArgumentError(absl::StrCat("peer rank ", peer.rank, "/", peer.tp_size,
                                                   " announced no KV arena"));
  }
  if (info.spec_fingerprint() != options_.spec.fingerprint()) {
    return absl::FailedPreconditionError("peer KV spec fingerprint differs");
  }
  PD_ASSIGN_OR_RETURN(engine::KvCacheLayout layout,
                      engine::KvCacheLayout::create(options_.spec, peer.rank, peer.tp_size,
                                                    info.num_blocks()));
  if (layout.total_bytes() != info.arena_bytes()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "peer arena of ", info.arena_bytes(), " bytes, its layout needs ", layout.total_bytes()));
  }
  Remote& remote = remotes_[peer.worker_address];
  if (!remote.error.ok() || remote.address.empty()) {
    remote = Remote{};  // New, or a lost peer that handshook again.
    remote.address = peer.worker_address;
  }
  remote.role = peer.role;
  remote.tp = static_cast<int>(peer.tp_size);
  remote.rank = static_cast<int>(peer.rank);
  PD_ASSIGN_OR_RETURN(engine::KvCacheLayout planning,
                      engine::KvCacheLayout::create(seams_.planning_spec, peer.rank, peer.tp_size, info.num_blocks()));
  remote.layout = std::move(layout);
  remote.planning_layout = std::move(planning);
  remote.arena_descriptor = arena_it->second;
  // Prefer a connection we dialed for sending: it exists as long as we keep it.
  if (remote.control_id == 0 || peer.dialed || !remote.dialed) {
    remote.control_id = peer.id;
    remote.dialed = remote.dialed || peer.dialed;
  }
  remote_by_control_[peer.id] = peer.worker_address;
  if (out) *out = &remote;
  return absl::OkStatus();
}

StatusOr<KvRankEndpoint::Remote*> KvRankEndpoint::dial(const std::string& endpoint, int tp, int rank,
                                                       uint64_t incarnation) {
  PD_ASSIGN_OR_RETURN(ControlPeer peer, control_->connect(endpoint, options_.connect_timeout, incarnation));
  Remote* remote = nullptr;
  PD_RETURN_IF_ERROR(record_remote(peer, &remote));
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
    const std::vector<int>* remote_blocks, const char* what) {
  Fan fan;
  for (int r : ranks) {
    StatusOr<Remote*> remote = dial(endpoints[r], tp, r, incarnation_at(incarnations, r));
    if (!remote.ok()) {
      fan.unreachable = unreachable_peer(absl::Status(
          remote.status().code(), absl::StrCat("request ", request_id, ": ", what, " rank ", r, ": ",
                                               std::string(remote.status().message()))));
      break;
    }
    if (remote_blocks) {
      PD_RETURN_IF_ERROR(check_blocks(*remote_blocks, (*remote)->layout->num_blocks(), what));
    }
    fan.remotes[r] = *remote;
  }
  return fan;
}

Status KvRankEndpoint::ensure_transport(Remote& remote) {
  // A lost peer, or one whose data path cannot be opened, is the peer's fault (fault.h).
  if (!remote.error.ok()) return peer_fault(remote.error);
  if (remote.transport_ready) return absl::OkStatus();
  StatusOr<PeerId> peer = transport_->connect(remote.address);
  if (!peer.ok()) return peer_fault(peer.status());
  remote.transport_peer = *peer;
  StatusOr<RemoteRegionId> region = transport_->load_remote_region(remote.transport_peer, remote.arena_descriptor);
  if (!region.ok()) return peer_fault(region.status());
  remote.remote_region = *region;
  remote.transport_ready = true;
  return absl::OkStatus();
}

StatusOr<TransferPlan> KvRankEndpoint::plan(int producer_rank, int consumer_rank,
                                            const Remote& remote, const Request& request,
                                            const std::vector<int>& consumer_blocks,
                                            int skip_blocks) {
  PD_ASSIGN_OR_RETURN(const RankMap* map, map_for(request.producer_tp, request.consumer_tp));
  // Planned with the seams' layouts: the real ones, except in the mutation tests (TestFaults).
  const bool producer = options_.side == SessionSide::kProducer;
  const engine::KvCacheLayout& other = *remote.planning_layout;
  return plan_for_pair(producer_rank, consumer_rank, *map, producer ? *planning_layout_ : other,
                       producer ? other : *planning_layout_, request.producer_blocks, consumer_blocks,
                       skip_blocks);
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

// Refusals of caller input are logged here: a router bug must be visible in the worker's log.
#define PD_REFUSE_IF_ERROR(expr)                                                      \
  do {                                                                                \
    ::absl::Status pd_refused_ = (expr);                                              \
    if (!pd_refused_.ok()) {                                                          \
      ++counters_.refused;                                                            \
      PD_LOG_WARN("kvtransfer {}.{}: refused: {}", options_.name, options_.rank,      \
                  pd_refused_.ToString());                                            \
      return pd_refused_;                                                             \
    }                                                                                 \
  } while (0)

// ---------------------------------------------------------------------------------------------
// Push

Status KvRankEndpoint::begin_push(const PushRequest& in) {
  PD_REFUSE_IF_ERROR(options_.side == SessionSide::kProducer
                         ? absl::OkStatus()
                         : absl::FailedPreconditionError("begin_push on a consumer rank"));
  PD_REFUSE_IF_ERROR(check_new_request(in.request_id));
  PD_REFUSE_IF_ERROR(check_blocks(in.producer_blocks, layout_.num_blocks(), "producer"));
  PD_REFUSE_IF_ERROR(in.consumer_blocks.size() == in.producer_blocks.size()
                         ? absl::OkStatus()
                         : absl::InvalidArgumentError("producer and consumer block counts differ"));
  PD_REFUSE_IF_ERROR(static_cast<int>(in.consumer_endpoints.size()) == in.consumer_tp
                         ? absl::OkStatus()
                         : absl::InvalidArgumentError("need one endpoint per consumer rank"));
  PD_REFUSE_IF_ERROR(sent_blocks(in.producer_blocks, in.skip_blocks).status());
  StatusOr<const RankMap*> map = map_for(options_.tp, in.consumer_tp);
  PD_REFUSE_IF_ERROR(map.status());
  // Connect first, so that block ids outside a consumer's arena are refused like other bad
  // input; a consumer that cannot be reached fails the registered request instead.
  StatusOr<Fan> fan = connect_fan(in.request_id, (*map)->fan_out[options_.rank], in.consumer_endpoints,
                                  in.consumer_tp, in.consumer_incarnations, &in.consumer_blocks, "consumer");
  PD_REFUSE_IF_ERROR(fan.status());
  Request& request = add_request(in.request_id, TransferMode::kPush, in.producer_blocks,
                                 (*map)->fan_out[options_.rank], in.lease);
  request.producer_tp = options_.tp;
  request.consumer_tp = in.consumer_tp;
  request.producer_blocks = in.producer_blocks;
  request.consumer_blocks = in.consumer_blocks;
  request.skip_blocks = in.skip_blocks;
  request.layers_posted.assign(layout_.num_layers(), false);
  if (!fan->unreachable.ok()) {
    fail(request, fan->unreachable);
    return fan->unreachable;
  }
  for (auto& [c, leg] : request.legs) {
    Remote& remote = *fan->remotes.at(c);
    leg.remote = remote.address;
    Status status = ensure_transport(remote);
    if (status.ok()) {
      StatusOr<TransferPlan> p =
          plan(options_.rank, c, remote, request, request.consumer_blocks, request.skip_blocks);
      status = p.status();
      if (p.ok()) leg.plan = std::move(*p);
    }
    if (!status.ok()) {
      Status why = absl::Status(status.code(), absl::StrCat("request ", in.request_id, ": consumer rank ", c, ": ",
                                                            std::string(status.message())));
      if (is_peer_fault(status)) why = peer_fault(std::move(why));
      fail(request, why);
      return why;
    }
  }
  return absl::OkStatus();
}

Status KvRankEndpoint::layer_ready(const std::string& id, int layer) {
  auto it = requests_.find(id);
  if (it == requests_.end()) return absl::NotFoundError(absl::StrCat("no request ", id));
  Request& request = it->second;
  Session& session = *request.session;
  if (session.mode() != TransferMode::kPush || options_.side != SessionSide::kProducer) {
    return absl::FailedPreconditionError("layer_ready outside a push producer request");
  }
  if (!session.active()) return session.error();
  if (layer < 0 || layer >= layout_.num_layers()) {
    return absl::OutOfRangeError(absl::StrCat("layer ", layer, " out of range"));
  }
  if (request.layers_posted[layer]) {
    return absl::FailedPreconditionError(absl::StrCat("layer ", layer, " of ", id, " posted twice"));
  }
  request.layers_posted[layer] = true;
  for (auto& [c, leg] : request.legs) {
    const LayerCopies& copies = leg.plan.layers[layer];
    if (copies.ops.empty()) continue;
    Remote& remote = remotes_.at(leg.remote);
    TransferBatch batch{remote.transport_peer, {}};
    batch.ops.reserve(copies.ops.size());
    for (const CopyOp& op : copies.ops) {
      batch.ops.push_back(
          {OpCode::kPut, region_, op.src_offset, remote.remote_region, op.dst_offset, op.length});
    }
    Status status = remote.error;
    if (status.ok()) {
      StatusOr<BatchId> posted = transport_->post(batch);
      status = posted.status();
      if (posted.ok()) {
        leg.batches.push_back(*posted);
        leg.posted += copies.ops.size();
        request.bytes += copies.bytes;
        request.ops += copies.ops.size();
        status = session.add_scheduled(c, copies.ops.size());
      }
    }
    if (!status.ok()) {
      fail(request, absl::Status(status.code(),
                                 absl::StrCat("request ", id, ": puts of layer ", layer,
                                              " to consumer rank ", c, ": ",
                                              std::string(status.message()))));
      return request.session->error();
    }
  }
  return absl::OkStatus();
}

Status KvRankEndpoint::seal(const std::string& id, std::optional<int32_t> first_token) {
  auto it = requests_.find(id);
  if (it == requests_.end()) return absl::NotFoundError(absl::StrCat("no request ", id));
  Request& request = it->second;
  if (request.session->mode() != TransferMode::kPush ||
      options_.side != SessionSide::kProducer) {
    return absl::FailedPreconditionError("seal outside a push producer request");
  }
  PD_RETURN_IF_ERROR(request.session->seal());
  request.first_token = first_token;
  request.sealed_at = options_.clock->now();
  // A flush completes once every put posted before it is remotely complete.
  for (auto& [c, leg] : request.legs) {
    if (leg.posted == 0) continue;
    StatusOr<BatchId> flush = transport_->flush(remotes_.at(leg.remote).transport_peer);
    if (!flush.ok()) {
      fail(request, absl::Status(flush.status().code(),
                                 absl::StrCat("request ", id, ": flush to consumer rank ", c,
                                              ": ", std::string(flush.status().message()))));
      return request.session->error();
    }
    leg.flush = *flush;
  }
  // Shared-memory puts are complete once posted, so one progress round usually ends the flush:
  // WRITE_DONE leaves now, not after the progress thread and this one took turns.
  transport_->progress();
  step_push_producer(id, request);
  return absl::OkStatus();
}

Status KvRankEndpoint::expect_push(const ExpectPushRequest& in) {
  PD_REFUSE_IF_ERROR(options_.side == SessionSide::kConsumer
                         ? absl::OkStatus()
                         : absl::FailedPreconditionError("expect_push on a producer rank"));
  PD_REFUSE_IF_ERROR(check_new_request(in.request_id));
  PD_REFUSE_IF_ERROR(check_blocks(in.consumer_blocks, layout_.num_blocks(), "consumer"));
  PD_REFUSE_IF_ERROR(in.producer_endpoints.empty() ||
                             static_cast<int>(in.producer_endpoints.size()) == in.producer_tp
                         ? absl::OkStatus()
                         : absl::InvalidArgumentError("need one endpoint per producer rank"));
  PD_REFUSE_IF_ERROR(sent_blocks(in.consumer_blocks, in.skip_blocks).status());
  StatusOr<const RankMap*> map = map_for(in.producer_tp, options_.tp);
  PD_REFUSE_IF_ERROR(map.status());
  Request& request = add_request(in.request_id, TransferMode::kPush, in.consumer_blocks,
                                 (*map)->fan_in[options_.rank], in.lease);
  request.producer_tp = in.producer_tp;
  request.consumer_tp = options_.tp;
  request.consumer_blocks = in.consumer_blocks;
  request.skip_blocks = in.skip_blocks;
  if (in.producer_endpoints.empty()) return absl::OkStatus();
  // The producer's blocks are unknown until its WRITE_DONE: nothing to range-check yet.
  StatusOr<Fan> fan = connect_fan(in.request_id, (*map)->fan_in[options_.rank], in.producer_endpoints,
                                  in.producer_tp, in.producer_incarnations, nullptr, "producer");
  if (fan.ok() && fan->unreachable.ok()) {
    for (auto& [p, leg] : request.legs) leg.remote = fan->remotes.at(p)->address;
    return absl::OkStatus();
  }
  const Status why = fan.ok() ? fan->unreachable : fan.status();
  // Nobody has written yet: the producer could not be reached, so it is quiet.
  for (auto& [q, l] : request.legs) request.session->leg_quiet(q);
  fail(request, why);
  return why;
}

void KvRankEndpoint::on_write_done(Remote& from, const proto::Envelope& envelope) {
  const proto::WriteDone& done = envelope.write_done();
  auto it = requests_.find(done.request_id());
  if (it == requests_.end()) {
    ++counters_.stale_ignored;
    PD_LOG_DEBUG("kvtransfer: stale write_done for {}", done.request_id());
    return;
  }
  Request& request = it->second;
  Session& session = *request.session;
  const int p = static_cast<int>(done.producer_rank());
  auto refuse = [&](const std::string& why) {
    ++counters_.refused;
    PD_LOG_WARN("kvtransfer {}.{}: refused write_done for {} from rank {}/{}: {}", options_.name,
                options_.rank, done.request_id(), from.rank, from.tp, why);
  };
  if (session.side() != SessionSide::kConsumer || session.mode() != TransferMode::kPush) {
    return refuse("not a push consumer request");
  }
  if (from.role != proto::ROLE_PREFILL || from.tp != request.producer_tp || from.rank != p ||
      static_cast<int>(done.consumer_rank()) != options_.rank) {
    return refuse(absl::StrCat("sender or ranks do not match (producer_rank ", p,
                               ", consumer_rank ", done.consumer_rank(), ")"));
  }
  auto leg_it = request.legs.find(p);
  if (leg_it == request.legs.end()) return refuse("producer rank not in the fan-in");
  Leg& leg = leg_it->second;
  if (!leg.remote.empty() && leg.remote != from.address) {
    return refuse("from another producer group than the request's");
  }
  leg.remote = from.address;
  if (session.leg_is_done(p)) {
    if (session.leg_done(p, done.sealed_count(), done.sealed_count()) == LegResult::kDuplicate) {
      ++counters_.duplicates_ignored;
    }
    return;
  }
  if (!session.active()) {
    ++counters_.stale_ignored;
    session.leg_quiet(p);  // It flushed before notifying: it no longer writes.
    return;
  }
  request.producer_blocks.assign(done.producer_blocks().begin(), done.producer_blocks().end());
  Status status = request.producer_blocks.size() == request.consumer_blocks.size()
                      ? check_blocks(request.producer_blocks, from.layout->num_blocks(), "producer")
                      : absl::InvalidArgumentError("write_done without the producer's block ids");
  if (status.ok() && static_cast<int>(done.skip_blocks()) != request.skip_blocks) {
    status = absl::InvalidArgumentError(absl::StrCat("producer skipped ", done.skip_blocks(),
                                                     " blocks, this consumer expected ", request.skip_blocks));
  }
  StatusOr<TransferPlan> planned = absl::UnknownError("unplanned");
  if (status.ok()) {
    planned = plan(p, options_.rank, from, request, request.consumer_blocks, request.skip_blocks);
    status = planned.status();
  }
  session.leg_quiet(p);
  if (!status.ok()) {
    refuse(status.ToString());
    fail(request, absl::DataLossError(absl::StrCat("request ", done.request_id(),
                                                   ": cannot check producer rank ", p,
                                                   "'s writes: ", status.ToString())));
    return;
  }
  leg.plan = std::move(*planned);
  seams_.received->before_verify(arena(), leg.plan);
  if (options_.checksums && done.block_checksums_size() > 0) {
    const Status verified = verify_checksums(done.request_id(), request, p, leg,
                                             {done.block_checksums().begin(),
                                              done.block_checksums().end()});
    if (!verified.ok()) {
      fail(request, verified);
      return;
    }
  }
  if (done.has_first_token()) request.first_token = done.first_token();
  if (done.seal_to_send_s() > 0)
    request.push_tail = std::max(request.push_tail, std::chrono::duration_cast<Duration>(
                                                        std::chrono::duration<double>(done.seal_to_send_s())));
  request.bytes += leg.plan.total_bytes;
  request.ops += done.sealed_count();
  if (session.leg_done(p, done.sealed_count(), leg.plan.total_ops) == LegResult::kMismatch) {
    ++counters_.failures;
    PD_LOG_WARN("kvtransfer {}.{}: {}", options_.name, options_.rank, session.error().ToString());
  }
}

// ---------------------------------------------------------------------------------------------
// Pull

Status KvRankEndpoint::hold(const HoldRequest& in) {
  PD_REFUSE_IF_ERROR(options_.side == SessionSide::kProducer
                         ? absl::OkStatus()
                         : absl::FailedPreconditionError("hold on a consumer rank"));
  PD_REFUSE_IF_ERROR(check_new_request(in.request_id));
  PD_REFUSE_IF_ERROR(check_blocks(in.producer_blocks, layout_.num_blocks(), "producer"));
  std::vector<int> peers;
  if (in.consumer_tp > 0) {
    StatusOr<const RankMap*> map = map_for(options_.tp, in.consumer_tp);
    PD_REFUSE_IF_ERROR(map.status());
    peers = (*map)->fan_out[options_.rank];
  }
  Request& request = add_request(in.request_id, TransferMode::kPull, in.producer_blocks,
                                 std::move(peers), in.lease);
  request.producer_tp = options_.tp;
  request.consumer_tp = in.consumer_tp;
  request.producer_blocks = in.producer_blocks;
  return absl::OkStatus();
}

Status KvRankEndpoint::pull(const PullRequest& in) {
  PD_REFUSE_IF_ERROR(options_.side == SessionSide::kConsumer
                         ? absl::OkStatus()
                         : absl::FailedPreconditionError("pull on a producer rank"));
  PD_REFUSE_IF_ERROR(check_new_request(in.request_id));
  PD_REFUSE_IF_ERROR(check_blocks(in.consumer_blocks, layout_.num_blocks(), "consumer"));
  PD_REFUSE_IF_ERROR(in.consumer_blocks.size() == in.producer_blocks.size()
                         ? absl::OkStatus()
                         : absl::InvalidArgumentError("producer and consumer block counts differ"));
  PD_REFUSE_IF_ERROR(static_cast<int>(in.producer_endpoints.size()) == in.producer_tp
                         ? absl::OkStatus()
                         : absl::InvalidArgumentError("need one endpoint per producer rank"));
  PD_REFUSE_IF_ERROR(sent_blocks(in.consumer_blocks, in.skip_blocks).status());
  StatusOr<const RankMap*> map = map_for(in.producer_tp, options_.tp);
  PD_REFUSE_IF_ERROR(map.status());
  StatusOr<Fan> fan = connect_fan(in.request_id, (*map)->fan_in[options_.rank], in.producer_endpoints,
                                  in.producer_tp, in.producer_incarnations, &in.producer_blocks, "producer");
  PD_REFUSE_IF_ERROR(fan.status());
  Request& request = add_request(in.request_id, TransferMode::kPull, in.consumer_blocks,
                                 (*map)->fan_in[options_.rank], in.lease);
  request.producer_tp = in.producer_tp;
  request.consumer_tp = options_.tp;
  request.producer_blocks = in.producer_blocks;
  request.consumer_blocks = in.consumer_blocks;
  request.skip_blocks = in.skip_blocks;
  if (!fan->unreachable.ok()) {
    fail(request, fan->unreachable);
    return fan->unreachable;
  }
  for (auto& [p, leg] : request.legs) {
    Remote& remote = *fan->remotes.at(p);
    leg.remote = remote.address;
    Status status = ensure_transport(remote);
    StatusOr<TransferPlan> planned = absl::UnknownError("unplanned");
    if (status.ok()) {
      planned = plan(p, options_.rank, remote, request, request.consumer_blocks, request.skip_blocks);
      status = planned.status();
    }
    if (status.ok()) {
      leg.plan = std::move(*planned);
      TransferBatch batch{remote.transport_peer, {}};
      batch.ops.reserve(leg.plan.total_ops);
      for (const LayerCopies& layer : leg.plan.layers) {
        for (const CopyOp& op : layer.ops) {
          batch.ops.push_back({OpCode::kGet, region_, op.dst_offset, remote.remote_region,
                               op.src_offset, op.length});
        }
      }
      if (!batch.ops.empty()) {
        StatusOr<BatchId> posted = transport_->post(batch);
        status = posted.status();
        if (posted.ok()) {
          leg.batches.push_back(*posted);
          leg.posted = batch.ops.size();
          request.bytes += leg.plan.total_bytes;
          request.ops += batch.ops.size();
        }
      }
    }
    if (status.ok() && options_.checksums) {
      // Asked now, so that the answer usually arrives while the gets still run.
      proto::Envelope message;
      proto::ChecksumRequest& ask = *message.mutable_checksum_request();
      ask.set_request_id(in.request_id);
      ask.set_consumer_rank(options_.rank);
      ask.set_consumer_tp(options_.tp);
      ask.set_producer_rank(p);
      for (int b : in.consumer_blocks) ask.add_consumer_blocks(b);
      ask.set_skip_blocks(in.skip_blocks);
      status = send(remote, message);
    }
    if (!status.ok()) {
      Status why = absl::Status(status.code(), absl::StrCat("request ", in.request_id, ": producer rank ", p, ": ",
                                                            std::string(status.message())));
      if (is_peer_fault(status)) why = peer_fault(std::move(why));
      fail(request, why);
      return why;
    }
  }
  return absl::OkStatus();
}

void KvRankEndpoint::on_release(Remote& from, const proto::Release& release) {
  auto it = requests_.find(release.request_id());
  if (it == requests_.end()) {
    ++counters_.stale_ignored;
    return;
  }
  Request& request = it->second;
  Session& session = *request.session;
  const int c = static_cast<int>(release.consumer_rank());
  const int consumer_tp = static_cast<int>(release.consumer_tp());
  if (!from_pull_consumer(from, request, c, consumer_tp, static_cast<int>(release.producer_rank()))) {
    ++counters_.refused;
    PD_LOG_WARN("kvtransfer {}.{}: refused release of {} from rank {}/{}", options_.name,
                options_.rank, release.request_id(), from.rank, from.tp);
    return;
  }
  if (!learn_fan_out(request, consumer_tp).ok()) {
    ++counters_.refused;
    return;
  }
  switch (session.leg_done(c, 0, 0)) {
    case LegResult::kDuplicate: ++counters_.duplicates_ignored; break;
    case LegResult::kUnknownPeer: ++counters_.refused; break;
    case LegResult::kInactive:
      ++counters_.stale_ignored;
      session.leg_quiet(c);  // It finished reading before it released.
      break;
    default: break;
  }
}

bool KvRankEndpoint::from_pull_consumer(const Remote& from, const Request& request, int consumer_rank,
                                        int consumer_tp, int producer_rank) const {
  const Session& session = *request.session;
  return session.side() == SessionSide::kProducer && session.mode() == TransferMode::kPull &&
         from.role == proto::ROLE_DECODE && from.rank == consumer_rank && from.tp == consumer_tp &&
         producer_rank == options_.rank && (request.consumer_tp == 0 || request.consumer_tp == consumer_tp);
}

Status KvRankEndpoint::learn_fan_out(Request& request, int consumer_tp) {
  Session& session = *request.session;
  if (session.peers_known()) return absl::OkStatus();
  PD_ASSIGN_OR_RETURN(const RankMap* map, map_for(options_.tp, consumer_tp));
  request.consumer_tp = consumer_tp;
  PD_RETURN_IF_ERROR(session.set_peers(map->fan_out[options_.rank]));
  for (int q : session.peers()) request.legs[q];
  return absl::OkStatus();
}

void KvRankEndpoint::on_checksum_request(Remote& from, const proto::ChecksumRequest& ask) {
  auto it = requests_.find(ask.request_id());
  if (it == requests_.end()) {
    ++counters_.stale_ignored;
    if (const std::string* ended = finished_.find(ask.request_id())) {
      // It ended here (another consumer rank aborted it) before this rank asked: without an
      // answer the asker would wait for its checksums until its lease. The reason travels on,
      // so every consumer rank reports the first failure, not only that there was one.
      proto::Envelope reply;
      reply.mutable_abort()->set_request_id(ask.request_id());
      reply.mutable_abort()->set_reason(absl::StrCat("the producer no longer holds the request: ", *ended));
      (void)send(from, reply);
    }
    return;
  }
  Request& request = it->second;
  Session& session = *request.session;
  const int c = static_cast<int>(ask.consumer_rank());
  const int consumer_tp = static_cast<int>(ask.consumer_tp());
  auto refuse = [&](const std::string& why) {
    ++counters_.refused;
    PD_LOG_WARN("kvtransfer {}.{}: refused checksum request for {} from rank {}/{}: {}",
                options_.name, options_.rank, ask.request_id(), from.rank, from.tp, why);
  };
  if (!from_pull_consumer(from, request, c, consumer_tp, static_cast<int>(ask.producer_rank())))
    return refuse("sender or ranks do not match");
  if (!session.active()) {
    // Failed here (another consumer rank aborted it) but not yet forgotten: as for a finished
    // id, the asker must hear why, or it would wait for its checksums until its lease (a pull
    // producer's legs are unbound, so step_abort's aborts do not reach it).
    ++counters_.stale_ignored;
    proto::Envelope reply;
    reply.mutable_abort()->set_request_id(ask.request_id());
    reply.mutable_abort()->set_reason(
        absl::StrCat("the producer no longer holds the request: ", session.error().ToString()));
    (void)send(from, reply);
    return;
  }
  const Status learnt = learn_fan_out(request, consumer_tp);
  if (!learnt.ok()) return refuse(learnt.ToString());
  if (!request.legs.count(c)) return refuse("consumer rank not in the fan-out");
  proto::Envelope message;
  proto::BlockChecksums& reply = *message.mutable_block_checksums();
  reply.set_request_id(ask.request_id());
  reply.set_producer_rank(options_.rank);
  reply.set_consumer_rank(c);
  // Without checksums on this side the answer is empty, and the consumer does not verify.
  if (options_.checksums) {
    const std::vector<int> consumer_blocks(ask.consumer_blocks().begin(),
                                           ask.consumer_blocks().end());
    Status status = consumer_blocks.size() == request.producer_blocks.size()
                        ? check_blocks(consumer_blocks, from.layout->num_blocks(), "consumer")
                        : absl::InvalidArgumentError("producer and consumer block counts differ");
    const int skip = static_cast<int>(ask.skip_blocks());
    StatusOr<TransferPlan> planned = absl::UnknownError("unplanned");
    if (status.ok()) {
      planned = plan(options_.rank, c, from, request, consumer_blocks, skip);
      status = planned.status();
    }
    if (!status.ok()) return refuse(status.ToString());
    const std::span<const int> sent(consumer_blocks.begin() + skip, consumer_blocks.end());
    for (uint64_t sum : checksums(sent, *planned, from, ChecksumSide::kSource)) {
      reply.add_checksums(sum);
    }
  }
  const Status sent = send(from, message);
  if (!sent.ok()) {
    PD_LOG_WARN("kvtransfer {}.{}: checksums of {} to consumer rank {}: {}", options_.name,
                options_.rank, ask.request_id(), c, sent.ToString());
  }
}

void KvRankEndpoint::on_block_checksums(Remote& from, const proto::BlockChecksums& sums) {
  auto it = requests_.find(sums.request_id());
  if (it == requests_.end()) {
    ++counters_.stale_ignored;
    return;
  }
  Request& request = it->second;
  Session& session = *request.session;
  const int p = static_cast<int>(sums.producer_rank());
  auto leg_it = request.legs.find(p);
  if (session.side() != SessionSide::kConsumer || session.mode() != TransferMode::kPull ||
      from.role != proto::ROLE_PREFILL || from.rank != p || from.tp != request.producer_tp ||
      static_cast<int>(sums.consumer_rank()) != options_.rank || leg_it == request.legs.end() ||
      leg_it->second.remote != from.address) {
    ++counters_.refused;
    PD_LOG_WARN("kvtransfer {}.{}: refused block checksums of {} from rank {}/{}", options_.name,
                options_.rank, sums.request_id(), from.rank, from.tp);
    return;
  }
  Leg& leg = leg_it->second;
  if (leg.expected_checksums) {
    ++counters_.duplicates_ignored;
    return;
  }
  leg.expected_checksums.emplace(sums.checksums().begin(), sums.checksums().end());
}

// ---------------------------------------------------------------------------------------------
// Aborts, failures, peers

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
      proto::Envelope reply;
      reply.mutable_abort()->set_request_id(abort.request_id());
      reply.mutable_abort()->set_reason(absl::StrCat(kAbortAckPrefix, "request not active"));
      (void)send(from, reply);
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
  // A peer that accesses our blocks (push producer, pull consumer) sends Abort only once its
  // ops on them ended (step_abort), so that leg is quiet now; our own ops we track ourselves.
  const bool peer_touches_our_blocks = request.session->side() == SessionSide::kConsumer
                                           ? request.session->mode() == TransferMode::kPush
                                           : request.session->mode() == TransferMode::kPull;
  if (peer_touches_our_blocks) request.session->leg_quiet(from.rank);
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

Status KvRankEndpoint::send(Remote& remote, const proto::Envelope& message) {
  if (!remote.error.ok()) return remote.error;
  return control_->send(remote.control_id, message);
}

Status KvRankEndpoint::notify(Remote& remote, const proto::Envelope& message) {
  if (!remote.error.ok()) return remote.error;
  return seams_.notifier->notify(*control_, remote.control_id, message);
}

void KvRankEndpoint::send_abort(Request& request, int rank, Leg& leg, const std::string& reason) {
  if (leg.abort_sent) return;
  leg.abort_sent = true;
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
  proto::Envelope message;
  message.mutable_abort()->set_request_id(request.session->request_id());
  message.mutable_abort()->set_reason(reason);
  for (Remote* remote : targets) (void)send(*remote, message);
}

// ---------------------------------------------------------------------------------------------
// Progress

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

void KvRankEndpoint::step_push_producer(const std::string& id, Request& request) {
  Session& session = *request.session;
  if (session.state() != SessionState::kSealed) return;
  for (auto& [c, leg] : request.legs) {
    if (session.leg_is_done(c)) continue;
    std::string error;
    bool failed = false, pending = false;
    for (BatchId b : leg.batches) {
      const BatchState s = batch_state(b, &error);
      failed |= s == BatchState::kError;
      pending |= s == BatchState::kInProgress;
    }
    if (leg.flush) {
      const BatchState s = batch_state(*leg.flush, &error);
      failed |= s == BatchState::kError;
      pending |= s == BatchState::kInProgress;
    }
    if (failed) {
      fail(request, peer_fault(absl::UnavailableError(absl::StrCat("request ", id, ": writes to consumer rank ",
                                                        c, " failed: ", error))));
      return;
    }
    if (pending) continue;
    proto::Envelope message;
    proto::WriteDone& done = *message.mutable_write_done();
    done.set_request_id(id);
    done.set_producer_rank(options_.rank);
    done.set_consumer_rank(c);
    done.set_sealed_count(session.scheduled(c));
    if (request.first_token) done.set_first_token(*request.first_token);
    done.set_seal_to_send_s(std::chrono::duration<double>(options_.clock->now() - request.sealed_at).count());
    for (int b : request.producer_blocks) done.add_producer_blocks(b);
    done.set_skip_blocks(request.skip_blocks);
    if (options_.checksums) {
      for (uint64_t sum : checksums(sent_consumer_blocks(request), leg.plan, remotes_.at(leg.remote),
                                    ChecksumSide::kSource)) {
        done.add_block_checksums(sum);
      }
    }
    const Status sent = notify(remotes_.at(leg.remote), message);
    if (!sent.ok()) {
      fail(request, peer_fault(absl::UnavailableError(absl::StrCat("request ", id, ": write_done to consumer rank ",
                                                        c, ": ", std::string(sent.message())))));
      return;
    }
    session.leg_done(c, session.scheduled(c), session.scheduled(c));
  }
}

void KvRankEndpoint::step_pull_consumer(const std::string& id, Request& request) {
  Session& session = *request.session;
  if (!session.active()) return;
  for (auto& [p, leg] : request.legs) {
    if (session.leg_is_done(p)) continue;
    std::string error;
    bool failed = false, pending = false;
    for (BatchId b : leg.batches) {
      const BatchState s = batch_state(b, &error);
      failed |= s == BatchState::kError;
      pending |= s == BatchState::kInProgress;
    }
    if (failed) {
      fail(request, peer_fault(absl::UnavailableError(absl::StrCat("request ", id, ": reads from producer rank ",
                                                        p, " failed: ", error))));
      return;
    }
    if (pending) continue;
    if (options_.checksums) {
      // The producer's checksums come over the control channel, maybe after the gets ended.
      if (!leg.expected_checksums) continue;
      seams_.received->before_verify(arena(), leg.plan);
      if (!leg.expected_checksums->empty()) {
        const Status verified = verify_checksums(id, request, p, leg, *leg.expected_checksums);
        if (!verified.ok()) {
          fail(request, verified);
          return;
        }
      }
    }
    proto::Envelope message;
    proto::Release& release = *message.mutable_release();
    release.set_request_id(id);
    release.set_consumer_rank(options_.rank);
    release.set_consumer_tp(options_.tp);
    release.set_producer_rank(p);
    const Status sent = notify(remotes_.at(leg.remote), message);
    if (!sent.ok()) {
      PD_LOG_WARN("kvtransfer {}.{}: release of {} to producer rank {}: {}", options_.name,
                  options_.rank, id, p, sent.ToString());
    }
    session.leg_done(p, 0, 0);
  }
}

void KvRankEndpoint::step_abort(const std::string& id, Request& request) {
  Session& session = *request.session;
  const TimePoint now = options_.clock->now();
  const bool local_ops = (session.side() == SessionSide::kProducer) ==
                         (session.mode() == TransferMode::kPush);
  const std::string reason = std::string(session.error().message());
  for (auto& [rank, leg] : request.legs) {
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
      if (session.mode() == TransferMode::kPush && leg.posted > 0 && !leg.flush && remote &&
          remote->error.ok()) {
        StatusOr<BatchId> flush = transport_->flush(remote->transport_peer);
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
    if (session.side() == SessionSide::kProducer && session.mode() == TransferMode::kPush) {
      step_push_producer(id, request);
    } else if (session.side() == SessionSide::kConsumer && session.mode() == TransferMode::kPull) {
      step_pull_consumer(id, request);
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
    case ControlEvent::Kind::kMessage: {
      auto it = remote_by_control_.find(event.peer);
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
  // Our own ops' completions, peer messages and wake() all end the wait early.
  const Duration wait = timeout;
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
                                                const Remote& remote, ChecksumSide side) const {
  const engine::KvCacheLayout& consumer = options_.side == SessionSide::kConsumer ? layout_ : *remote.layout;
  return block_checksums(consumer, arena(), consumer_blocks, plan, side);
}

Status KvRankEndpoint::verify_checksums(const std::string& id, const Request& request, int producer_rank,
                                        const Leg& leg, const std::vector<uint64_t>& expected) const {
  const std::vector<uint64_t> mine =
      checksums(sent_consumer_blocks(request), leg.plan, remotes_.at(leg.remote), ChecksumSide::kDestination);
  return compare_block_checksums(mine, expected, id, producer_rank, options_.rank, request.producer_blocks,
                                 request.consumer_blocks, request.skip_blocks);
}

}  // namespace pdserve::kvtransfer
