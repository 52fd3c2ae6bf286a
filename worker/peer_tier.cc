#include "worker/peer_tier.h"

#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/logging.h"

namespace pdserve::worker {
namespace {

// How often the reaper looks for leases past their end.
constexpr auto kReapEvery = std::chrono::milliseconds(50);
// A read's lease (source pins and holds, reader's pull) outlasts its timeout by this much.
constexpr auto kLeaseMargin = std::chrono::seconds(1);
// How long a stopping worker waits for its aborted reads to let go of their slots.
constexpr auto kStopDrain = std::chrono::seconds(1);

std::string random_prefix() {
  std::random_device rd;
  return absl::StrFormat("peer-%08x%08x-", rd(), rd());
}

int64_t millis(Duration d) { return std::chrono::duration_cast<std::chrono::milliseconds>(d).count(); }

// gRPC's deadline for `deadline` on `clock` (gRPC takes the system clock's time points).
std::chrono::system_clock::time_point grpc_deadline(const Clock& clock, TimePoint deadline) {
  return std::chrono::system_clock::now() +
         std::chrono::duration_cast<std::chrono::system_clock::duration>(deadline - clock.now());
}

}  // namespace

PeerTier::PeerTier(engine::Engine& engine, PeerTierOptions options)
    : engine_(engine), host_(*engine.host_tier()), options_(std::move(options)), id_prefix_(random_prefix()) {}

StatusOr<std::unique_ptr<PeerTier>> PeerTier::create(engine::Engine& engine, PeerTierOptions options) {
  if (engine.host_tier() == nullptr)
    return absl::FailedPreconditionError("the peer tier reads into and serves from the host KV tier: --kv-peer-tier "
                                         "needs --host-kv-bytes");
  if (!engine.prefix_caching())
    return absl::FailedPreconditionError("the peer tier needs the prefix cache (--prefix-caching)");
  std::unique_ptr<PeerTier> tier(new PeerTier(engine, std::move(options)));
  PeerTier* self = tier.get();
  KvRanksOptions kv = tier->options_.kv;
  kv.arena = KvArena::kHostTier;
  kv.port_base = 0;
  kv.side = kvtransfer::SessionSide::kProducer;
  // The serving ranks' holds pin nothing themselves (the lease does): their releases are news only.
  PD_ASSIGN_OR_RETURN(tier->serving_, KvRanks::create(engine, kv, [](int, const kvtransfer::KvTransferEvent&) {},
                                                      [](int, const std::string&, std::vector<int>) {}));
  kv.side = kvtransfer::SessionSide::kConsumer;
  PD_ASSIGN_OR_RETURN(
      tier->reading_,
      KvRanks::create(
          engine, kv, [self](int rank, const kvtransfer::KvTransferEvent& ev) { self->on_read_event(rank, ev); },
          [self](int rank, const std::string& id, std::vector<int>) { self->on_read_release(rank, id); }));
  tier->reaper_ = std::thread([self] { self->reap(); });
  return tier;
}

PeerTier::~PeerTier() {
  if (!serving_ || !reading_) return;  // create() failed before the endpoints were up: nothing held.
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
    for (auto& [id, read] : reads_) read.abandoned = true;
  }
  changed_.notify_all();
  if (reaper_.joinable()) reaper_.join();
  {
    std::lock_guard lock(mu_);
    for (auto& [id, read] : reads_) {
      const std::string rid = id;
      reading_->post_all([rid](int, kvtransfer::KvRankEndpoint& ep) { (void)ep.abort(rid, "worker stopping"); });
    }
  }
  reading_->stop(kStopDrain);
  serving_->stop(Duration(0));
  std::lock_guard lock(mu_);
  for (auto& [id, read] : reads_) (void)host_.release_lease(read.slots);  // Every rank stopped.
  for (auto& [id, lease] : leases_)
    if (!lease.expired) (void)host_.release_peer_lease(lease.pinned);
}

Duration PeerTier::read_lease() const { return options_.read_timeout + kLeaseMargin; }

Worker::Stub& PeerTier::stub(const std::string& address) {
  std::unique_ptr<Worker::Stub>& s = stubs_[address];
  if (!s) {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
    if (!options_.tls_server_name.empty()) args.SetSslTargetNameOverride(options_.tls_server_name);
    s = Worker::NewStub(grpc::CreateCustomChannel(address, options_.credentials, args));
  }
  return *s;
}

StatusOr<PeerLeaseResponse> PeerTier::lease(const PeerLeaseRequest& request) {
  if (request.lease_id().empty()) return absl::InvalidArgumentError("PeerLease needs a lease_id");
  if (request.reader_tp() <= 0) return absl::InvalidArgumentError("PeerLease needs the reader's TP (reader_tp)");
  if (request.max_blocks() < 0 || request.lease_ms() < 0)
    return absl::InvalidArgumentError("PeerLease: max_blocks and lease_ms must be >= 0");
  const std::vector<int> prompt(request.prompt().begin(), request.prompt().end());
  const int b = engine_.kv_layout(0).block_size();
  const int full = int(prompt.size()) / b;
  const int limit = request.max_blocks() > 0 ? std::min(request.max_blocks(), full) : full;
  const engine::Engine::PromptKeys k = engine_.prompt_keys(prompt, request.cache_salt(), limit);
  const Duration length = request.lease_ms() > 0 ? Duration(std::chrono::milliseconds(request.lease_ms()))
                                                 : options_.lease;
  {
    // The id is taken at once (a lease still being granted holds it), so that two calls with one
    // id cannot both pin and hold.
    std::lock_guard lock(mu_);
    if (leases_.count(request.lease_id()) || !granting_.insert(request.lease_id()).second)
      return absl::AlreadyExistsError(absl::StrCat("lease ", request.lease_id(), " exists"));
  }
  struct Granting {
    PeerTier* self;
    const std::string& id;
    ~Granting() {
      std::lock_guard lock(self->mu_);
      self->granting_.erase(id);
    }
  } granting{this, request.lease_id()};
  engine::HostKvTier::PeerLease pinned = host_.lease_prefix(k.keys, k.ns_root, prompt, limit);
  PeerLeaseResponse reply;
  if (pinned.slots.empty()) return reply;
  // Every serving rank holds the slots for the reader's ranks before the answer goes out.
  struct Posted {
    std::mutex mu;
    std::condition_variable cv;
    int done = 0;
    Status error;
  };
  auto posted = std::make_shared<Posted>();
  kvtransfer::HoldRequest hold;
  hold.request_id = request.lease_id();
  hold.producer_blocks = pinned.slots;
  hold.consumer_tp = request.reader_tp();
  hold.lease = length;
  serving_->post_all([hold, posted](int, kvtransfer::KvRankEndpoint& ep) {
    Status s = ep.hold(hold);
    std::lock_guard lock(posted->mu);
    if (!s.ok() && posted->error.ok()) posted->error = s;
    ++posted->done;
    posted->cv.notify_all();
  });
  {
    std::unique_lock lock(posted->mu);
    posted->cv.wait(lock, [&] { return posted->done == serving_->tp(); });
  }
  if (!posted->error.ok()) {
    const std::string id = request.lease_id();
    serving_->post_all([id](int, kvtransfer::KvRankEndpoint& ep) { (void)ep.abort(id, "lease refused"); });
    (void)host_.release_peer_lease(pinned);
    return posted->error;
  }
  reply.set_blocks(int(pinned.slots.size()));
  for (int s : pinned.slots) reply.add_slots(s);
  reply.set_kv_source(serving_->group().SerializeAsString());
  std::lock_guard lock(mu_);
  ++stats_.leases;
  stats_.leased_blocks += pinned.slots.size();
  leases_.emplace(request.lease_id(), Lease{std::move(pinned), options_.kv.clock->now() + length});
  return reply;
}

PeerReleaseResponse PeerTier::release(const PeerReleaseRequest& request) {
  PeerReleaseResponse reply;
  std::unique_lock lock(mu_);
  auto it = leases_.find(request.lease_id());
  if (it == leases_.end()) return reply;  // Unknown, or forgotten long after it ran out: not intact.
  Lease lease = std::move(it->second);
  leases_.erase(it);
  lock.unlock();
  StatusOr<bool> intact = host_.release_peer_lease(lease.pinned, /*unpin=*/!lease.expired);
  if (!intact.ok()) PD_LOG_WARN("peer tier: lease {}: {}", request.lease_id(), intact.status().ToString());
  reply.set_intact(intact.ok() && *intact);
  // A reader that failed leaves the holds open until their lease: closed now. (After a good
  // read its RELEASEs close them; this call may overtake them, so they are left alone.)
  if (!request.read_ok()) {
    const std::string id = request.lease_id();
    serving_->post_all([id](int, kvtransfer::KvRankEndpoint& ep) { (void)ep.abort(id, "the reader gave up"); });
  }
  return reply;
}

int PeerTier::read(const std::string& request_id, const std::vector<int>& prompt, const std::string& cache_salt,
                   const PrefixSource& source) {
  const TimePoint start = options_.kv.clock->now();
  const TimePoint deadline = start + options_.read_timeout;
  const int b = engine_.kv_layout(0).block_size();
  if (prompt.empty()) return 0;
  // The last prompt token is always computed, so the block holding it is never read.
  const int limit = std::min<int>(source.blocks(), int(prompt.size() - 1) / b);
  const engine::Engine::PromptKeys k = engine_.prompt_keys(prompt, cache_salt, limit);
  // The reader's own leading blocks stay pinned until the read is adopted after them: the slots
  // reserved for the read must not evict them (adopt needs the chain before what it caches).
  struct Pinned {
    engine::HostKvTier& host;
    engine::HostKvTier::PeerLease lease;
    ~Pinned() { (void)host.release_peer_lease(lease); }
  } mine{host_, host_.lease_prefix(k.keys, k.ns_root, prompt, limit)};
  const int own = int(mine.lease.slots.size());
  const int device = engine_.cached_prefix_tokens(prompt, cache_salt) / b;
  if (limit <= std::max(own, device)) return own;
  std::string id;
  {
    std::lock_guard lock(mu_);
    ++stats_.reads;
    id = absl::StrCat(id_prefix_, ++next_read_);
  }
  auto failed = [&](const char* why, const Status& s) {
    PD_LOG_WARN("peer tier: {}: reading {} blocks from {}: {}: {}", request_id, limit - own, source.address(), why,
                s.ToString());
    std::lock_guard lock(mu_);
    ++(absl::IsDeadlineExceeded(s) ? stats_.timed_out_reads : stats_.failed_reads);
    return own;
  };
  auto call_release = [&](bool read_ok) -> bool {
    grpc::ClientContext ctx;
    // The release goes out even past the read's deadline: the source unpins now, not at the lease.
    ctx.set_deadline(
        grpc_deadline(*options_.kv.clock, std::max(deadline, options_.kv.clock->now() + std::chrono::milliseconds(200))));
    PeerReleaseRequest rq;
    rq.set_lease_id(id);
    rq.set_read_ok(read_ok);
    PeerReleaseResponse rs;
    Worker::Stub* s;
    {
      std::lock_guard lock(mu_);
      s = &stub(source.address());
    }
    const grpc::Status st = s->PeerRelease(&ctx, rq, &rs);
    return st.ok() && rs.intact();
  };

  PeerLeaseResponse leased;
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(grpc_deadline(*options_.kv.clock, deadline));
    PeerLeaseRequest rq;
    rq.set_lease_id(id);
    rq.mutable_prompt()->Add(prompt.begin(), prompt.end());
    rq.set_cache_salt(cache_salt);
    rq.set_max_blocks(limit);
    rq.set_reader_tp(reading_->tp());
    rq.set_lease_ms(millis(read_lease()));
    Worker::Stub* s;
    {
      std::lock_guard lock(mu_);
      s = &stub(source.address());
    }
    const grpc::Status st = s->PeerLease(&ctx, rq, &leased);
    if (!st.ok()) {
      // The source may have granted it all the same (an answer lost or late): let it go now
      // rather than at the lease's end (an unknown id is answered "not intact", nothing else).
      if (st.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED || st.error_code() == grpc::StatusCode::UNAVAILABLE ||
          st.error_code() == grpc::StatusCode::CANCELLED)
        (void)call_release(false);
      return failed("lease", absl::UnavailableError(st.error_message()));
    }
  }
  const int n = std::min(leased.blocks(), limit);
  if (n <= own || leased.slots_size() != leased.blocks()) {
    if (leased.blocks() > 0) (void)call_release(false);
    return failed("lease", absl::NotFoundError(absl::StrCat("the source leased ", leased.blocks(), " blocks")));
  }
  StatusOr<KvGroup> group = parse_kv_group(leased.kv_source(), "PeerLeaseResponse.kv_source");
  StatusOr<std::vector<int>> slots = group.ok() ? host_.reserve(n - own) : StatusOr<std::vector<int>>(group.status());
  if (!slots.ok()) {
    (void)call_release(false);
    return failed("slots", slots.status());
  }
  kvtransfer::PullRequest pull;
  pull.request_id = id;
  pull.producer_tp = group->tp();
  pull.producer_endpoints.assign(group->rank_endpoints().begin(), group->rank_endpoints().end());
  pull.producer_incarnations.assign(group->rank_incarnations().begin(), group->rank_incarnations().end());
  pull.producer_blocks.assign(leased.slots().begin() + own, leased.slots().begin() + n);
  pull.consumer_blocks = *slots;
  pull.lease = read_lease();
  std::unique_lock lock(mu_);
  Read& r = reads_[id];
  r.ranks = RankProgress(reading_->tp());
  r.slots = *slots;
  lock.unlock();
  reading_->post_all([this, id, pull](int rank, kvtransfer::KvRankEndpoint& ep) {
    Status s = ep.pull(pull);
    // An endpoint that never registered the read (NotFound) leaves the slots with us.
    const bool registered = s.ok() || ep.abort(id, s.ToString()).code() != absl::StatusCode::kNotFound;
    std::lock_guard lock(mu_);
    auto it = reads_.find(id);
    if (it == reads_.end()) return;
    it->second.ranks.mark(rank, RankProgress::kPosted);
    if (!registered) it->second.ranks.mark(rank, RankProgress::kReleased);
    if (!s.ok() && it->second.error.ok()) it->second.error = s;
    changed_.notify_all();
  });
  lock.lock();
  bool timed_out = false;
  while (true) {
    Read& cur = reads_.at(id);
    if (!cur.error.ok() || cur.ranks.all(RankProgress::kReady)) break;
    if (options_.kv.clock->now() >= deadline) {
      timed_out = true;
      break;
    }
    changed_.wait_for(lock, std::chrono::milliseconds(5));
  }
  Read& done = reads_.at(id);
  const bool ready = done.error.ok() && done.ranks.all(RankProgress::kReady);
  const Status error =
      timed_out ? absl::DeadlineExceededError("the read outlasted --kv-peer-read-timeout-ms") : done.error;
  const uint64_t bytes = done.bytes;
  if (!ready) {
    done.abandoned = true;
    reading_->post_all([id](int, kvtransfer::KvRankEndpoint& ep) { (void)ep.abort(id, "peer read given up"); });
    maybe_forget_read(id);
  }
  lock.unlock();
  // Released either way: the source unpins now rather than at the lease's end.
  const bool intact = call_release(ready);
  if (!ready) return failed(timed_out ? "timeout" : "transfer", error);
  lock.lock();
  reads_.erase(id);  // Every rank is ready: the slots are ours.
  lock.unlock();
  if (!intact) {
    (void)host_.release_lease(*slots);
    PD_LOG_WARN("peer tier: {}: a block read from {} was dropped there meanwhile; computing it", request_id,
                source.address());
    std::lock_guard g(mu_);
    ++stats_.stale_reads;
    return own;
  }
  StatusOr<int> held = host_.adopt(k.keys, k.ns_root, prompt, own, *slots);
  if (!held.ok()) return failed("adopt", held.status());
  if (*held < n)  // A collision in this worker's index: the chain could not go on.
    PD_LOG_WARN("peer tier: {}: {} of {} blocks read from {} could be cached", request_id, *held - own, n - own,
                source.address());
  std::lock_guard g(mu_);
  stats_.read_blocks += uint64_t(std::max(*held - own, 0));
  stats_.read_bytes += bytes;
  stats_.read_seconds += std::chrono::duration<double>(options_.kv.clock->now() - start).count();
  return *held;
}

void PeerTier::on_read_event(int rank, const kvtransfer::KvTransferEvent& ev) {
  std::lock_guard lock(mu_);
  auto it = reads_.find(ev.request_id);
  if (it == reads_.end()) return;
  Read& r = it->second;
  if (ev.kind == kvtransfer::KvTransferEvent::Kind::kReady) {
    r.ranks.mark(rank, RankProgress::kReady);
    r.bytes += ev.bytes;
  } else {
    r.ranks.mark(rank, RankProgress::kReleased);  // A failed event comes once the rank's slots are back.
    if (r.error.ok()) r.error = ev.error;
  }
  changed_.notify_all();
  maybe_forget_read(ev.request_id);
}

void PeerTier::on_read_release(int rank, const std::string& id) {
  std::lock_guard lock(mu_);
  auto it = reads_.find(id);
  if (it == reads_.end()) return;
  it->second.ranks.mark(rank, RankProgress::kReleased);
  changed_.notify_all();
  maybe_forget_read(id);
}

void PeerTier::maybe_forget_read(const std::string& id) {
  auto it = reads_.find(id);
  if (it == reads_.end() || !it->second.abandoned || !it->second.quiet()) return;
  if (Status s = host_.release_lease(it->second.slots); !s.ok())
    PD_LOG_WARN("peer tier: read {}: {}", id, s.ToString());
  reads_.erase(it);
}

void PeerTier::reap() {
  std::unique_lock lock(mu_);
  while (!stopping_) {
    changed_.wait_for(lock, kReapEvery);
    const TimePoint now = options_.kv.clock->now();
    for (auto it = leases_.begin(); it != leases_.end();) {
      Lease& l = it->second;
      if (!l.expired && now >= l.end) {
        // The reader is past its own lease too: unpinned, its stamps kept for a late release.
        (void)host_.release_peer_lease(l.pinned);
        l.expired = true;
        ++stats_.expired_leases;
      }
      if (l.expired && now >= l.end + options_.lease) {
        it = leases_.erase(it);
      } else {
        ++it;
      }
    }
  }
}

PeerTierStats PeerTier::stats() const {
  std::lock_guard lock(mu_);
  return stats_;
}

}  // namespace pdserve::worker
