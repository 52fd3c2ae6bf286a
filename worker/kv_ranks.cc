#include "worker/kv_ranks.h"

#include <atomic>
#include <future>
#include <optional>

#include "absl/strings/str_cat.h"
#include "common/host_port.h"
#include "common/logging.h"
#include "kvtransfer/control/compat.h"

namespace pdserve::worker {
namespace {

// The longest a rank thread blocks in progress(): commands posted, peers' messages and finished
// transfers end the wait at once, so this only paces leases and heartbeats.
constexpr auto kProgressWait = std::chrono::milliseconds(5);

}  // namespace

class KvRanks::Rank {
 public:
  Rank(int rank, KvEventFn on_event, std::string advertise_host)
      : rank_(rank), on_event_(std::move(on_event)), advertise_host_(std::move(advertise_host)) {}
  ~Rank() {
    request_stop(Duration(0));
    join();
  }

  // Creates the endpoint on the rank's own thread (its sockets live there) and waits for it.
  Status start(kvtransfer::KvEndpointOptions options) {
    clock_ = options.clock;
    std::promise<Status> started;
    std::future<Status> result = started.get_future();
    thread_ = std::thread([this, options = std::move(options), &started]() mutable {
      run(std::move(options), started);
    });
    Status s = result.get();
    if (!s.ok()) thread_.join();
    return s;
  }

  void post(KvCommand command) {
    {
      std::lock_guard lock(mu_);
      queue_.push_back(std::move(command));
    }
    endpoint_->wake();
  }

  void request_stop(Duration drain) {
    {
      std::lock_guard lock(mu_);
      if (!stopping_) drain_ = drain;
      stopping_ = true;
    }
    if (endpoint_) endpoint_->wake();
  }
  void join() {
    if (thread_.joinable()) thread_.join();
  }

  const std::string& endpoint() const { return control_endpoint_; }
  uint64_t incarnation() const { return incarnation_; }
  void* arena() const { return arena_; }
  uint64_t failures() const { return failures_.load(); }
  kvtransfer::KvEndpointCounters counters() const {
    std::lock_guard lock(counters_mu_);
    return counters_;
  }

 private:
  void run(kvtransfer::KvEndpointOptions options, std::promise<Status>& started) {
    auto created = kvtransfer::KvRankEndpoint::create(std::move(options));
    if (!created.ok()) {
      started.set_value(created.status());
      return;
    }
    // Outlives the thread: a staging mirror the transport allocated stays until KvRanks, which
    // unpins it first, lets go of this rank.
    endpoint_ = std::move(*created);
    kvtransfer::KvRankEndpoint* endpoint = endpoint_.get();
    control_endpoint_ = advertised_endpoint(endpoint->control_endpoint(), advertise_host_);
    arena_ = endpoint->arena();
    incarnation_ = endpoint->incarnation();
    PD_LOG_INFO("kvtransfer rank {}: {}", rank_, endpoint->describe());
    started.set_value(absl::OkStatus());
    std::optional<TimePoint> drain_until;
    while (true) {
      std::vector<KvCommand> commands;
      bool stopping;
      {
        std::lock_guard lock(mu_);
        commands.swap(queue_);
        stopping = stopping_;
      }
      for (KvCommand& c : commands) c(*endpoint);
      if (stopping) {
        if (!drain_until) drain_until = clock_->now() + drain_;
        if (endpoint->open_requests() == 0 || clock_->now() >= *drain_until) break;
      }
      // The one place the thread blocks: post() wakes it like a peer's message would.
      for (const kvtransfer::KvTransferEvent& ev : endpoint->progress(kProgressWait)) {
        if (ev.kind == kvtransfer::KvTransferEvent::Kind::kFailed && !absl::IsCancelled(ev.error)) ++failures_;
        on_event_(rank_, ev);
      }
      std::lock_guard lock(counters_mu_);
      counters_ = endpoint->counters();  // The endpoint's own are this thread's alone.
    }
    if (endpoint->open_requests() > 0)
      PD_LOG_WARN("kvtransfer rank {}: {} requests still open at shutdown", rank_, endpoint->open_requests());
  }

  const int rank_;
  KvEventFn on_event_;
  const std::string advertise_host_;
  std::atomic<uint64_t> failures_{0};
  mutable std::mutex counters_mu_;
  kvtransfer::KvEndpointCounters counters_;  // A copy of the endpoint's, after each round.
  const Clock* clock_ = nullptr;
  // Made by the rank's thread before start() returns; other threads only call its wake().
  std::unique_ptr<kvtransfer::KvRankEndpoint> endpoint_;
  std::string control_endpoint_;
  void* arena_ = nullptr;  // The registered arena (the engine's, or a transport-made mirror).
  uint64_t incarnation_ = 0;
  std::mutex mu_;  // Guards queue_, stopping_ and drain_.
  std::vector<KvCommand> queue_;
  bool stopping_ = false;
  Duration drain_{0};
  std::thread thread_;
};

namespace {

// The transport's name for a GPU backend's memory; nullopt for host memory or memory the
// transport has no name for.
std::optional<kvtransfer::MemoryKind> device_memory_kind(const engine::Backend& backend) {
  switch (backend.memory_kind()) {
    case engine::MemoryKind::kCuda:
      return kvtransfer::MemoryKind::kCuda;
    case engine::MemoryKind::kRocm:
      return kvtransfer::MemoryKind::kRocm;
    case engine::MemoryKind::kHost:
    case engine::MemoryKind::kOpaque:
      return std::nullopt;
  }
  return std::nullopt;
}

}  // namespace

std::string advertised_endpoint(const std::string& bound, const std::string& host) {
  if (host.empty()) return bound;
  const size_t scheme = bound.find("://");
  const size_t colon = bound.rfind(':');
  if (scheme == std::string::npos || colon == std::string::npos || colon <= scheme + 2) return bound;
  return absl::StrCat(bound.substr(0, scheme + 3), bracket_host(host), bound.substr(colon));
}

StatusOr<std::unique_ptr<KvRanks>> KvRanks::create(const engine::Engine& engine,
                                                   const KvRanksOptions& options,
                                                   const KvEventFn& on_event, const KvReleaseFn& on_release) {
  std::unique_ptr<KvRanks> ranks(new KvRanks());
  const engine::KvCacheSpec& spec = engine.kv_layout(0).spec();
  ranks->compat_hash_ = kvtransfer::compat_hash(options.model_id, spec);
  for (int r = 0; r < engine.tp(); ++r) {
    kvtransfer::KvEndpointOptions o;
    o.spec = spec;
    o.model_id = options.model_id;
    o.side = options.side;
    o.tp = engine.tp();
    o.rank = r;
    const bool host_tier = options.arena == KvArena::kHostTier;
    if (host_tier && engine.host_kv_blocks() == 0)
      return absl::FailedPreconditionError("no host KV tier (--host-kv-bytes) to register");
    o.num_blocks = host_tier ? engine.host_kv_blocks() : engine.kv_layout(r).num_blocks();
    o.clock = options.clock;
    o.default_lease = options.default_lease;
    o.peer_timeout = options.peer_timeout;
    o.heartbeat_interval = options.heartbeat_interval;
    o.curve_secret_key = options.curve_secret_key;
    o.test_faults = options.test_faults;
    if (!host_tier && options.side == kvtransfer::SessionSide::kProducer && engine.host_kv_blocks() > 0) {
      // pull-host: decode workers read prompts the prefill worker copied to its host tier.
      o.host_arena = engine.host_kv_arena(r);
      o.host_num_blocks = engine.host_kv_blocks();
    }
    o.on_release = [on_release, r](const std::string& id, std::vector<int> blocks) {
      on_release(r, id, std::move(blocks));
    };
    o.name = options.side == kvtransfer::SessionSide::kProducer ? (host_tier ? "peer-serve" : "prefill")
                                                                : (host_tier ? "peer-read" : "decode");
    o.bind_endpoint = absl::StrCat("tcp://", bracket_host(options.bind_host), ":",
                                   options.port_base > 0 ? std::to_string(options.port_base + r) : std::string("*"));
    const std::string advertise = options.advertise_host.empty() ? options.bind_host : options.advertise_host;
    const engine::Backend& backend = engine.backend(r);
    auto rank = std::make_unique<Rank>(r, on_event, advertise);
    if (host_tier) {
      // Host memory (pinned for a GPU backend), registered as it is.
      o.arena = engine.host_kv_arena(r);
      PD_RETURN_IF_ERROR(rank->start(std::move(o)));
      ranks->ranks_.push_back(std::move(rank));
      continue;
    }
    // A GPU arena is registered as device memory where the UCX build can; otherwise (or when
    // forced) the transport gets a host mirror that the worker stages through.
    std::string path = backend.host_memory() && options.memory == KvMemory::kAuto ? "host" : "staged";
    if (const auto kind = device_memory_kind(backend); kind && options.memory == KvMemory::kAuto) {
      kvtransfer::KvEndpointOptions direct = o;
      direct.arena = engine.kv_arena(r);
      direct.arena_memory = *kind;
      direct.arena_device = r;
      const Status started = rank->start(std::move(direct));
      if (started.ok()) {
        path = "device";
      } else if (started.code() != absl::StatusCode::kUnimplemented) {
        return started;
      } else {
        PD_LOG_INFO("kvtransfer rank {}: {}; staging through host memory", r, std::string(started.message()));
        rank = std::make_unique<Rank>(r, on_event, advertise);
      }
    }
    if (path == "host") {
      o.arena = engine.kv_arena(r);
      PD_RETURN_IF_ERROR(rank->start(std::move(o)));
    } else if (path == "staged") {
      o.allocate_arena = true;
      PD_RETURN_IF_ERROR(rank->start(std::move(o)));
      PD_ASSIGN_OR_RETURN(auto staging, KvStaging::create(engine.kv_layout(r), engine.kv_arena(r),
                                                                      rank->arena(), &engine.backend(r)));
      ranks->staged_.push_back(std::move(staging));
    }
    ranks->memory_path_ = path;
    ranks->ranks_.push_back(std::move(rank));
  }
  if (options.arena == KvArena::kHostTier) return ranks;
  PD_LOG_INFO("kvtransfer: {} backend, KV moves through {}", engine.backend(0).name(),
              ranks->memory_path_ == "host"     ? "the engine's arena"
              : ranks->memory_path_ == "device" ? "the engine's arena, registered as device memory"
                                                : "a pinned host mirror of each rank's arena (staged)");
  return ranks;
}

KvRanks::~KvRanks() { stop(Duration(0)); }

KvGroup KvRanks::group() const {
  KvGroup g;
  g.set_tp(tp());
  for (const auto& r : ranks_) {
    g.add_rank_endpoints(r->endpoint());
    g.add_rank_incarnations(r->incarnation());
  }
  g.set_compat_hash(compat_hash_);
  return g;
}

void KvRanks::post_all(const std::function<void(int, kvtransfer::KvRankEndpoint&)>& command) {
  for (int r = 0; r < tp(); ++r)
    ranks_[r]->post([command, r](kvtransfer::KvRankEndpoint& ep) { command(r, ep); });
}

void KvRanks::post(int rank, KvCommand command) { ranks_[rank]->post(std::move(command)); }

KvStaging* KvRanks::staging(int rank) const {
  return staged_.empty() ? nullptr : staged_[rank].get();
}

uint64_t KvRanks::transfer_failures() const {
  uint64_t n = 0;
  for (const auto& r : ranks_) n += r->failures();
  return n;
}

kvtransfer::KvEndpointCounters KvRanks::counters() const {
  kvtransfer::KvEndpointCounters sum;
  for (const auto& r : ranks_) sum.merge_rank(r->counters());
  return sum;
}

uint64_t KvRanks::staged_bytes_to_host() const {
  uint64_t n = 0;
  for (const auto& s : staged_) n += s->bytes_to_host();
  return n;
}

uint64_t KvRanks::staged_bytes_to_device() const {
  uint64_t n = 0;
  for (const auto& s : staged_) n += s->bytes_to_device();
  return n;
}

void KvRanks::stop(Duration drain) {
  for (auto& r : ranks_) r->request_stop(drain);
  for (auto& r : ranks_) r->join();
}

StatusOr<KvGroup> parse_kv_group(const std::string& bytes, const std::string& what) {
  KvGroup g;
  if (bytes.empty()) return absl::InvalidArgumentError(absl::StrCat(what, " is empty"));
  if (!g.ParseFromString(bytes)) return absl::InvalidArgumentError(absl::StrCat(what, " is malformed"));
  if (g.tp() <= 0 || g.rank_endpoints_size() != g.tp())
    return absl::InvalidArgumentError(absl::StrCat(what, ": TP ", g.tp(), " with ", g.rank_endpoints_size(),
                                                   " rank endpoints"));
  for (const std::string& e : g.rank_endpoints())
    if (e.empty()) return absl::InvalidArgumentError(absl::StrCat(what, ": empty rank endpoint"));
  if (g.rank_incarnations_size() != 0 && g.rank_incarnations_size() != g.tp())
    return absl::InvalidArgumentError(absl::StrCat(what, ": TP ", g.tp(), " with ", g.rank_incarnations_size(),
                                                   " rank incarnations"));
  return g;
}

}  // namespace pdserve::worker
