#include "worker/decode_role.h"

#include <algorithm>
#include <chrono>
#include <thread>

#include "common/logging.h"
#include "kvtransfer/fault.h"
#include "worker/block_release.h"
#include "worker/rank_progress.h"

namespace pdserve::worker {

using kvtransfer::KvTransferEvent;

struct DecodeRole::Job {
  bool push = true;
  std::vector<int> blocks;  // Every block reserved for the request (prompt + generation).
  std::vector<int> kv_blocks;  // The prompt's share of them, which the transfer fills.
  // kv_blocks[0, skip) came from the prefix cache (retained): the transfer skips them.
  int skip = 0;
  std::string cache_salt;
  RankProgress ranks;
  std::optional<int> first_token;
  Duration push_tail{0};  // Push: the longest producer rank's seal-to-WRITE_DONE time.
  Status error;
  bool waiting = false;  // A Generate waits on it.
  bool handed = false;   // Decoding: the engine owns the blocks.
  bool freed = false;
  TimePoint start, deadline;

  // No rank can still be written into by a producer: each is ready or gave its blocks back.
  bool quiet() const { return ranks.all_of_any(RankProgress::kReady | RankProgress::kReleased); }
  // The blocks the transfer writes: kv_blocks[skip, n).
  std::vector<int> sent_blocks() const { return {kv_blocks.begin() + skip, kv_blocks.end()}; }
};

StatusOr<std::unique_ptr<DecodeRole>> DecodeRole::create(engine::Engine& engine, const KvRanksOptions& options) {
  std::unique_ptr<DecodeRole> role(new DecodeRole(engine, options.clock, options.default_lease));
  KvRanksOptions o = options;
  o.side = kvtransfer::SessionSide::kConsumer;
  DecodeRole* self = role.get();
  PD_ASSIGN_OR_RETURN(role->kv_, KvRanks::create(
      engine, o, [self](int rank, const KvTransferEvent& ev) { self->on_kv_event(rank, ev); },
      [self](int rank, const std::string& id, std::vector<int>) { self->on_kv_release(rank, id); }));
  role->sweeper_ = std::thread([self] { self->sweep(); });
  return role;
}

DecodeRole::DecodeRole(engine::Engine& engine, const Clock* clock, Duration lease)
    : engine_(engine), clock_(clock), lease_(lease) {}

DecodeRole::~DecodeRole() { shutdown(Duration(0)); }

namespace {
int blocks_for(int tokens, int block_size) { return (tokens + block_size - 1) / block_size; }

// Whether a request of `num_tokens` tokens (prompt and output) could ever run here: alone, it
// must fit the whole pool, or it would preempt itself for ever.
Status fits(const engine::Engine& engine, int num_tokens) {
  const int need = blocks_for(num_tokens, engine.kv_layout(0).block_size());
  const int have = engine.stats().num_blocks;
  if (need > have)
    return absl::ResourceExhaustedError(
        absl::StrCat("a request of ", num_tokens, " tokens needs ", need, " KV blocks; the cache has ", have, " in all"));
  return absl::OkStatus();
}
}  // namespace

StatusOr<ReserveResponse> DecodeRole::reserve(const ReserveRequest& request) {
  const std::string& id = request.request_id();
  if (id.empty()) return absl::InvalidArgumentError("empty request id");
  if (request.producer_tp() <= 0) return absl::InvalidArgumentError("Reserve needs producer_tp");
  if (request.prompt_len() <= 0 || request.num_tokens() < request.prompt_len())
    return absl::InvalidArgumentError(absl::StrCat("Reserve needs 0 < prompt_len <= num_tokens (got ",
                                                   request.prompt_len(), ", ", request.num_tokens(), ")"));
  if (request.prompt_size() > 0 && request.prompt_size() != request.prompt_len())
    return absl::InvalidArgumentError(absl::StrCat("Reserve's prompt has ", request.prompt_size(),
                                                   " tokens, its prompt_len says ", request.prompt_len()));
  std::vector<std::string> producer_endpoints;
  std::vector<uint64_t> producer_incarnations;
  if (!request.kv_producer().empty()) {
    PD_ASSIGN_OR_RETURN(KvGroup producer, parse_kv_group(request.kv_producer(), "kv_producer"));
    if (producer.tp() != request.producer_tp())
      return absl::InvalidArgumentError("kv_producer's TP differs from producer_tp");
    if (producer.compat_hash() != kv_->compat_hash())
      return absl::FailedPreconditionError("the producer's KV geometry differs from this worker's (compat hash)");
    producer_endpoints.assign(producer.rank_endpoints().begin(), producer.rank_endpoints().end());
    producer_incarnations.assign(producer.rank_incarnations().begin(), producer.rank_incarnations().end());
  }
  const int block_size = engine_.kv_layout(0).block_size();
  const int num_tokens = std::min(request.num_tokens(), engine_.config().max_seq_len);
  if (request.prompt_len() > num_tokens)
    return absl::InvalidArgumentError("the prompt is longer than the model's context");
  PD_RETURN_IF_ERROR(fits(engine_, num_tokens));
  // Only the prompt's blocks: the engine gives the request the blocks of its output as it
  // decodes (preempting the latest admitted request when the pool is short).
  PD_ASSIGN_OR_RETURN(engine::Engine::Reservation reservation,
                      engine_.reserve_cached_blocks({request.prompt().begin(), request.prompt().end()},
                                                    request.cache_salt(), request.prompt_len()));
  const std::vector<int> blocks = std::move(reservation.blocks);
  Job job;
  job.push = true;
  job.blocks = blocks;
  job.kv_blocks.assign(blocks.begin(), blocks.begin() + blocks_for(request.prompt_len(), block_size));
  job.skip = reservation.cached_blocks;
  job.cache_salt = request.cache_salt();
  job.ranks = RankProgress(kv_->tp());
  job.start = clock_->now();
  job.deadline = job.start + lease_;
  kvtransfer::ExpectPushRequest expect;
  expect.request_id = id;
  expect.producer_tp = request.producer_tp();
  expect.consumer_blocks = job.kv_blocks;
  expect.producer_endpoints = producer_endpoints;
  expect.producer_incarnations = producer_incarnations;
  expect.lease = lease_;
  expect.skip_blocks = job.skip;
  std::unique_lock lock(mu_);
  if (jobs_.count(id)) {
    release_blocks(engine_, blocks, absl::StrCat("decode ", id, ": duplicate reservation"));
    return absl::AlreadyExistsError(absl::StrCat("request ", id, " is already here"));
  }
  Job& j = jobs_.emplace(id, std::move(job)).first->second;
  post_transfer(id, [expect](int, kvtransfer::KvRankEndpoint& ep) { return ep.expect_push(expect); });
  // Registered on every rank before the producer learns the block ids, so that no WRITE_DONE
  // can arrive for a request a rank does not know yet.
  j.waiting = true;
  changed_.wait(lock, [&] { return j.ranks.all(RankProgress::kPosted); });
  j.waiting = false;
  Status error = j.error;
  maybe_free(id);
  if (!error.ok()) return error;
  ReserveResponse response;
  for (int b : blocks) response.add_block_ids(b);
  response.set_kv_target(kv_->group().SerializeAsString());
  response.set_cached_prefix_blocks(reservation.cached_blocks);
  return response;
}

StatusOr<PreparedDecode> DecodeRole::prepare(const WorkerGenerateRequest& request, engine::SamplingParams params,
                                             const std::function<bool()>& cancelled) {
  const std::string& id = request.request_id();
  const int prompt_len = request.prompt_size();
  if (prompt_len == 0) return absl::InvalidArgumentError("empty prompt");
  const int need = blocks_for(prompt_len, engine_.kv_layout(0).block_size());
  PD_RETURN_IF_ERROR(fits(engine_, std::min(prompt_len + params.max_tokens, engine_.config().max_seq_len)));
  std::unique_lock lock(mu_);
  if (request.kv_mode() == "push") {
    auto it = jobs_.find(id);
    if (it == jobs_.end())
      return absl::NotFoundError(absl::StrCat("no reservation for request ", id, " (never made, aborted or expired)"));
    Job& job = it->second;
    if (!job.push || job.waiting || job.handed)
      return absl::FailedPreconditionError(absl::StrCat("request ", id, " is not a reservation waiting for Generate"));
    if (request.reserved_blocks_size() > 0 &&
        !std::equal(request.reserved_blocks().begin(), request.reserved_blocks().end(), job.blocks.begin(), job.blocks.end()))
      return absl::InvalidArgumentError("reserved_blocks differ from what Reserve returned");
    if (int(job.blocks.size()) < need) {
      fail_locked(id, job, absl::InvalidArgumentError(absl::StrCat("request needs ", need, " blocks, ",
                                                                   job.blocks.size(), " reserved")));
      Status error = job.error;
      maybe_free(id);
      return error;
    }
  } else {
    lock.unlock();
    PD_ASSIGN_OR_RETURN(KvGroup source, parse_kv_group(request.kv_source(), "kv_source"));
    if (source.compat_hash() != kv_->compat_hash())
      return absl::FailedPreconditionError("the producer's KV geometry differs from this worker's (compat hash)");
    if (!request.has_first_token()) return absl::InvalidArgumentError("pull mode needs first_token");
    const int block_size = engine_.kv_layout(0).block_size();
    // pull-host names the producer's host-tier slots instead of its blocks (never both).
    const bool host = source.host_blocks_size() > 0;
    if (host && source.blocks_size() > 0)
      return absl::InvalidArgumentError("kv_source names both device blocks and host-tier slots");
    const int source_blocks = host ? source.host_blocks_size() : source.blocks_size();
    if (source_blocks != blocks_for(prompt_len, block_size))
      return absl::InvalidArgumentError(absl::StrCat("kv_source holds ", source_blocks, " blocks; a prompt of ",
                                                     prompt_len, " tokens fills ", blocks_for(prompt_len, block_size)));
    PD_ASSIGN_OR_RETURN(engine::Engine::Reservation reservation,
                        reserve_for_pull(request, prompt_len, cancelled));
    const std::vector<int> blocks = std::move(reservation.blocks);
    Job job;
    job.push = false;
    job.blocks = blocks;
    job.kv_blocks.assign(blocks.begin(), blocks.begin() + source_blocks);
    job.skip = reservation.cached_blocks;
    job.cache_salt = request.cache_salt();
    job.ranks = RankProgress(kv_->tp());
    job.first_token = request.first_token();
    job.start = clock_->now();
    job.deadline = job.start + lease_;
    kvtransfer::PullRequest pull;
    pull.request_id = id;
    pull.producer_tp = source.tp();
    pull.producer_endpoints.assign(source.rank_endpoints().begin(), source.rank_endpoints().end());
    pull.producer_incarnations.assign(source.rank_incarnations().begin(), source.rank_incarnations().end());
    pull.producer_blocks.assign(host ? source.host_blocks().begin() : source.blocks().begin(),
                                host ? source.host_blocks().end() : source.blocks().end());
    pull.consumer_blocks = job.kv_blocks;
    pull.lease = lease_;
    pull.skip_blocks = job.skip;
    pull.region = host ? kvtransfer::KvRegion::kHost : kvtransfer::KvRegion::kDevice;
    lock.lock();
    if (jobs_.count(id)) {
      release_blocks(engine_, blocks, absl::StrCat("decode ", id, ": duplicate pull"));
      return absl::AlreadyExistsError(absl::StrCat("request ", id, " is already here"));
    }
    jobs_.emplace(id, std::move(job));
    post_transfer(id, [pull](int, kvtransfer::KvRankEndpoint& ep) { return ep.pull(pull); });
  }
  PD_ASSIGN_OR_RETURN(PreparedDecode prepared, wait_ready(id, lock, cancelled));
  prepared.request.prompt.assign(request.prompt().begin(), request.prompt().end());
  prepared.request.params = params;
  prepared.request.resumed_tokens = request.resumed_tokens();
  prepared.request.cache_salt = request.cache_salt();
  prepared.request.handoff.first_token_streamed = request.first_token_streamed();
  return prepared;
}

StatusOr<engine::Engine::Reservation> DecodeRole::reserve_for_pull(const WorkerGenerateRequest& request, int prompt_len,
                                                                   const std::function<bool()>& cancelled) {
  // The pool may be short now (decoding sequences grow on demand): the prompt's blocks come
  // back as sequences finish, and the producer holds the KV under its lease meanwhile, so wait
  // for them up to half of it rather than fail a request that fits the pool (fits() said so).
  // Push waits in the router instead, around Reserve.
  const TimePoint give_up = clock_->now() + lease_ / 2;
  Duration backoff = std::chrono::milliseconds(1);
  for (;;) {
    auto reserved = engine_.reserve_cached_blocks({request.prompt().begin(), request.prompt().end()},
                                                  request.cache_salt(), prompt_len);
    if (reserved.ok() || !absl::IsResourceExhausted(reserved.status()) || clock_->now() >= give_up) return reserved;
    if (cancelled()) return absl::CancelledError(absl::StrCat("request ", request.request_id(), " cancelled"));
    std::this_thread::sleep_for(backoff);
    backoff = std::min<Duration>(backoff * 2, std::chrono::milliseconds(50));
  }
}

StatusOr<PreparedDecode> DecodeRole::wait_ready(const std::string& id, std::unique_lock<std::mutex>& lock,
                                                const std::function<bool()>& cancelled) {
  Job& job = jobs_.at(id);
  job.waiting = true;
  while (job.error.ok() && !job.ranks.all(RankProgress::kReady)) {
    if (cancelled()) {
      fail_locked(id, job, absl::CancelledError(absl::StrCat("request ", id, " cancelled")));
    } else if (clock_->now() >= job.deadline) {
      // Push: the producer never said its writes were done (stalled, or its word lost): its
      // fault, so the router places the request again (kvtransfer/fault.h).
      Status late = absl::DeadlineExceededError(absl::StrCat("request ", id, ": KV not ready within the lease"));
      fail_locked(id, job, job.push ? kvtransfer::peer_fault(std::move(late)) : std::move(late));
    } else {
      changed_.wait_for(lock, std::chrono::milliseconds(20));
    }
  }
  job.waiting = false;
  if (!job.error.ok()) {
    Status error = job.error;
    maybe_free(id);
    return error;
  }
  PreparedDecode prepared;
  // Push: what the prefill's compute did not hide (the reservation waited for the prefill too).
  prepared.kv_transfer_s = std::chrono::duration<double>(job.push ? job.push_tail : clock_->now() - job.start).count();
  prepared.request.id = id;
  prepared.request.cache_salt = job.cache_salt;  // Its prompt blocks are cached in that namespace.
  prepared.cached_tokens = job.skip * engine_.kv_layout(0).block_size();
  prepared.transferred_blocks = int(job.kv_blocks.size()) - job.skip;
  if (!job.first_token) {
    // WRITE_DONE without a first token: the prefill side's first token ended the request.
    prepared.finished_by_prefill = true;
    release_blocks(engine_, job.blocks, absl::StrCat("decode ", id, ": ended by the prefill side"));
  } else {
    prepared.request.handoff.preloaded_blocks = job.blocks;
    prepared.request.handoff.first_token = *job.first_token;
  }
  job.handed = true;
  maybe_free(id);
  return prepared;
}

void DecodeRole::post_transfer(const std::string& id,
                               const std::function<Status(int, kvtransfer::KvRankEndpoint&)>& command) {
  kv_->post_all([this, id, command](int rank, kvtransfer::KvRankEndpoint& ep) {
    Status s = command(rank, ep);
    // An endpoint that never registered the request (NotFound) leaves the blocks with us.
    const bool registered = s.ok() || ep.abort(id, s.ToString()).code() != absl::StatusCode::kNotFound;
    if (!s.ok()) PD_LOG_WARN("decode {}: kvtransfer rank {}: {}", id, rank, s.ToString());
    std::lock_guard lock(mu_);
    auto it = jobs_.find(id);
    if (it == jobs_.end()) return;
    Job& job = it->second;
    job.ranks.mark(rank, RankProgress::kPosted);
    if (!registered) job.ranks.mark(rank, RankProgress::kReleased);
    if (!s.ok()) fail_locked(id, job, s);
    changed_.notify_all();
    maybe_free(id);
  });
}

void DecodeRole::on_kv_event(int rank, const KvTransferEvent& ev) {
  std::unique_lock lock(mu_);
  auto it = jobs_.find(ev.request_id);
  if (it == jobs_.end()) return;
  KvStaging* staging = kv_->staging(rank);
  if (ev.kind == KvTransferEvent::Kind::kReady && staging != nullptr) {
    // The rank's share is complete in the host mirror: on to the device before the engine may
    // decode from it. The blocks stay reserved for this request meanwhile (a failure or abort
    // frees them only once every rank reported, and this rank has not yet). Only the sent
    // blocks: the mirror's copy of a prefix-cache hit is stale, the device's is the KV.
    const std::vector<int> blocks = it->second.sent_blocks();
    lock.unlock();
    Status staged = staging->to_device(blocks);
    lock.lock();
    it = jobs_.find(ev.request_id);
    if (it == jobs_.end()) return;
    if (!staged.ok()) {
      it->second.ranks.mark(rank, RankProgress::kReleased);  // The rank finished with its blocks; they are ours again.
      fail_locked(ev.request_id, it->second, staged);
      changed_.notify_all();
      maybe_free(ev.request_id);
      return;
    }
  }
  Job& job = it->second;
  if (ev.kind == KvTransferEvent::Kind::kReady) {
    job.ranks.mark(rank, RankProgress::kReady);
    if (job.push && ev.first_token) job.first_token = *ev.first_token;
    job.push_tail = std::max(job.push_tail, ev.push_tail);
  } else {
    job.ranks.mark(rank, RankProgress::kReleased);  // A failed event comes once the rank's blocks are back.
    fail_locked(ev.request_id, job, ev.error);
  }
  changed_.notify_all();
  maybe_free(ev.request_id);
}

void DecodeRole::on_kv_release(int rank, const std::string& id) {
  std::lock_guard lock(mu_);
  auto it = jobs_.find(id);
  if (it == jobs_.end()) return;
  it->second.ranks.mark(rank, RankProgress::kReleased);
  changed_.notify_all();
  maybe_free(id);
}

void DecodeRole::fail_locked(const std::string& id, Job& job, const Status& why) {
  if (!job.error.ok() || job.handed) return;
  job.error = why;
  // The other ranks stop too; each gives its blocks back once no producer can touch them.
  kv_->post_all([id, reason = why.ToString()](int, kvtransfer::KvRankEndpoint& ep) { (void)ep.abort(id, reason); });
  changed_.notify_all();
}

void DecodeRole::maybe_free(const std::string& id) {
  auto it = jobs_.find(id);
  if (it == jobs_.end()) return;
  Job& job = it->second;
  if (!job.handed && !job.freed && !job.error.ok() && job.quiet()) {
    release_blocks(engine_, job.blocks, absl::StrCat("decode ", id, ": failed transfer"));
    job.freed = true;
  }
  if ((job.handed || job.freed) && !job.waiting) jobs_.erase(it);
}

bool DecodeRole::abort(const std::string& id) {
  std::lock_guard lock(mu_);
  auto it = jobs_.find(id);
  if (it == jobs_.end() || it->second.handed) return false;
  fail_locked(id, it->second, absl::AbortedError(absl::StrCat("request ", id, " aborted by the router")));
  maybe_free(id);
  return true;
}

void DecodeRole::sweep() {
  std::unique_lock lock(mu_);
  while (!stopping_) {
    changed_.wait_for(lock, std::chrono::milliseconds(50));
    const TimePoint now = clock_->now();
    std::vector<std::string> expired;
    for (auto& [id, job] : jobs_)
      if (!job.waiting && !job.handed && job.error.ok() && now >= job.deadline) expired.push_back(id);
    for (const std::string& id : expired) {
      fail_locked(id, jobs_.at(id), absl::DeadlineExceededError(absl::StrCat("reservation of ", id, " expired")));
      maybe_free(id);
    }
  }
}

size_t DecodeRole::open_jobs() const {
  std::lock_guard lock(mu_);
  return jobs_.size();
}

void DecodeRole::shutdown(Duration drain) {
  {
    std::lock_guard lock(mu_);
    if (stopping_) return;
    stopping_ = true;
    for (auto& [id, job] : jobs_) fail_locked(id, job, absl::UnavailableError("the worker is shutting down"));
    changed_.notify_all();
  }
  if (sweeper_.joinable()) sweeper_.join();
  if (kv_) kv_->stop(drain);
}

}  // namespace pdserve::worker
