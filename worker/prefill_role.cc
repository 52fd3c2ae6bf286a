#include "worker/prefill_role.h"

#include <chrono>

#include "common/logging.h"
#include "worker/sampling_params.h"

namespace pdserve::worker {

using kvtransfer::KvTransferEvent;

struct PrefillRole::Job {
  bool push = true;
  KvGroup consumer;                // push: the decode worker's ranks.
  std::vector<int> target_blocks;  // push: the decode worker's reserved blocks.
  int prompt_len = 0;
  bool request_ends_at_first_token = false;  // max_tokens 1, or the prompt fills the context.

  bool prefilled = false;
  Status error;
  std::optional<int> first_token;  // Unset when the first token is a stop token.
  engine::FinishReason reason = engine::FinishReason::kNone;
  std::vector<int> kv_blocks;      // The prompt's blocks, held for the transfer.
  bool transfer_started = false;
  std::vector<char> posted, released, outcome_known;  // Per rank.
  bool aborting = false;
  bool rpc_done = false;
  TimePoint start, prefilled_at, transferred_at;

  bool all(const std::vector<char>& v) const {
    for (char c : v)
      if (!c) return false;
    return true;
  }
};

StatusOr<std::unique_ptr<PrefillRole>> PrefillRole::create(engine::Engine& engine,
                                                           const KvRanksOptions& options) {
  std::unique_ptr<PrefillRole> role(new PrefillRole(engine, options.clock, options.default_lease));
  KvRanksOptions o = options;
  o.side = kvtransfer::SessionSide::kProducer;
  PrefillRole* self = role.get();
  PD_ASSIGN_OR_RETURN(role->kv_, KvRanks::create(
      engine, o, [self](int rank, const KvTransferEvent& ev) { self->on_kv_event(rank, ev); },
      [self](int rank, const std::string& id, std::vector<int>) { self->on_kv_release(rank, id); }));
  return role;
}

PrefillRole::PrefillRole(engine::Engine& engine, const Clock* clock, Duration lease)
    : engine_(engine), clock_(clock), lease_(lease) {}

PrefillRole::~PrefillRole() { shutdown(Duration(0)); }

StatusOr<PrefillResponse> PrefillRole::prefill(const PrefillRequest& request,
                                               const std::function<bool()>& cancelled) {
  const std::string& id = request.request_id();
  if (id.empty()) return absl::InvalidArgumentError("empty request id");
  const bool push = request.kv_mode() == "push";
  if (!push && request.kv_mode() != "pull")
    return absl::InvalidArgumentError(absl::StrCat("kv_mode must be push or pull, not '", request.kv_mode(), "'"));
  PD_ASSIGN_OR_RETURN(engine::SamplingParams params, to_engine_params(request.sampling()));
  const int prompt_len = request.prompt_size();
  const int block_size = engine_.kv_layout(0).block_size();
  const int prompt_blocks = (prompt_len + block_size - 1) / block_size;
  Job job;
  job.push = push;
  job.prompt_len = prompt_len;
  job.request_ends_at_first_token = params.max_tokens == 1 || prompt_len >= engine_.config().max_seq_len;
  job.start = clock_->now();
  if (push) {
    PD_ASSIGN_OR_RETURN(job.consumer, parse_kv_group(request.kv_target(), "kv_target"));
    if (job.consumer.compat_hash() != kv_->compat_hash())
      return absl::FailedPreconditionError("kv_target's KV geometry differs from this worker's (compat hash)");
    if (request.target_blocks_size() < prompt_blocks)
      return absl::InvalidArgumentError(absl::StrCat("the prompt fills ", prompt_blocks, " blocks, ",
                                                     request.target_blocks_size(), " target blocks given"));
    job.target_blocks.assign(request.target_blocks().begin(), request.target_blocks().begin() + prompt_blocks);
  }
  const int tp = kv_->tp();
  job.posted.assign(tp, 0);
  job.released.assign(tp, 0);
  job.outcome_known.assign(tp, 0);
  {
    std::lock_guard lock(mu_);
    if (jobs_.count(id)) return absl::AlreadyExistsError(absl::StrCat("request ", id, " is already here"));
    jobs_.emplace(id, std::move(job));
  }
  engine::GenerationRequest greq{id, {request.prompt().begin(), request.prompt().end()}, params};
  greq.handoff.prefill_only = true;
  Status submitted = loop_->submit(std::move(greq), [this, id](const engine::TokenEvent& ev) { on_token(id, ev); });
  std::unique_lock lock(mu_);
  if (!submitted.ok()) {
    jobs_.erase(id);
    return submitted;
  }
  Job& j = jobs_.at(id);
  // Push: until every rank's writes are remotely complete (or failed). Pull: until every rank
  // holds the blocks.
  auto done = [&] {
    if (!j.error.ok() && (!j.transfer_started || j.all(j.posted))) return true;
    if (!j.prefilled) return false;
    if (!j.transfer_started) return true;
    return push ? j.all(j.outcome_known) : j.all(j.posted);
  };
  while (!done()) {
    if (cancelled()) {
      const bool in_engine = abort_locked(id, j);
      j.rpc_done = true;
      maybe_finish(id);
      lock.unlock();
      if (in_engine) loop_->abort(id);
      return absl::CancelledError(absl::StrCat("request ", id, " cancelled"));
    }
    changed_.wait_for(lock, std::chrono::milliseconds(20));
  }
  PrefillResponse response;
  Status error = j.error;
  if (error.ok()) {
    response.set_first_token(j.first_token.value_or(-1));
    response.set_prefill_s(std::chrono::duration<double>(j.prefilled_at - j.start).count());
    if (push) response.set_kv_transfer_s(std::chrono::duration<double>(j.transferred_at - j.prefilled_at).count());
    if (j.reason == engine::FinishReason::kStop) response.set_finish_reason("stop");
    if (j.reason == engine::FinishReason::kLength && j.request_ends_at_first_token) response.set_finish_reason("length");
    if (!push && j.transfer_started) {
      KvGroup source = kv_->group();
      for (int b : j.kv_blocks) source.add_blocks(b);
      response.set_kv_source(source.SerializeAsString());
    }
  }
  j.rpc_done = true;
  maybe_finish(id);
  if (!error.ok()) return error;
  return response;
}

void PrefillRole::on_token(const std::string& id, const engine::TokenEvent& ev) {
  std::lock_guard lock(mu_);
  auto it = jobs_.find(id);
  if (it == jobs_.end()) return;
  Job& job = it->second;
  if (ev.token >= 0) job.first_token = ev.token;
  if (!ev.finished) return;
  job.prefilled = true;
  job.prefilled_at = clock_->now();
  job.reason = ev.reason;
  if (!ev.error.ok()) {
    job.error = ev.error;
  } else if (ev.reason == engine::FinishReason::kAbort) {
    job.error = absl::AbortedError(absl::StrCat("request ", id, " aborted"));
  } else if (ev.blocks.empty()) {
    job.error = absl::InternalError("the engine handed over no blocks");
  }
  if (job.error.ok()) {
    const int block_size = engine_.kv_layout(0).block_size();
    const size_t prompt_blocks = (job.prompt_len + block_size - 1) / block_size;
    job.kv_blocks.assign(ev.blocks.begin(), ev.blocks.begin() + std::min(prompt_blocks, ev.blocks.size()));
    const std::vector<int> extra(ev.blocks.begin() + job.kv_blocks.size(), ev.blocks.end());
    if (!extra.empty()) (void)engine_.release_blocks(extra);
    const bool finished_here = ev.reason == engine::FinishReason::kStop || job.request_ends_at_first_token;
    if (job.aborting || (!job.push && finished_here)) {
      // Nobody will read these blocks (a pull request that already ended needs no decode).
      (void)engine_.release_blocks(job.kv_blocks);
      job.kv_blocks.clear();
    } else {
      start_transfer(id, job);
    }
  }
  changed_.notify_all();
  maybe_finish(id);
}

void PrefillRole::start_transfer(const std::string& id, Job& job) {
  job.transfer_started = true;
  const int num_layers = engine_.kv_layout(0).num_layers();
  if (job.push) {
    kvtransfer::PushRequest push;
    push.request_id = id;
    push.consumer_tp = job.consumer.tp();
    push.consumer_endpoints.assign(job.consumer.rank_endpoints().begin(), job.consumer.rank_endpoints().end());
    push.producer_blocks = job.kv_blocks;
    push.consumer_blocks = job.target_blocks;
    push.lease = lease_;
    // Every rank's WRITE_DONE carries the first token, so each consumer rank has it whichever
    // producer ranks its fan-in holds. Unset: the first token was a stop token.
    const std::optional<int32_t> first = job.first_token;
    kv_->post_all([this, push, first, num_layers](int rank, kvtransfer::KvRankEndpoint& ep) {
      Status s = ep.begin_push(push);
      for (int l = 0; s.ok() && l < num_layers; ++l) s = ep.layer_ready(push.request_id, l);
      if (s.ok()) s = ep.seal(push.request_id, first);
      if (!s.ok()) {
        // An endpoint that never registered the request (NotFound) leaves the blocks with us.
        const bool registered = ep.abort(push.request_id, s.ToString()).code() != absl::StatusCode::kNotFound;
        on_command_failed(rank, push.request_id, s, registered);
        return;
      }
      std::lock_guard lock(mu_);
      if (auto it = jobs_.find(push.request_id); it != jobs_.end()) it->second.posted[rank] = 1;
      changed_.notify_all();
    });
  } else {
    kvtransfer::HoldRequest hold;
    hold.request_id = id;
    hold.producer_blocks = job.kv_blocks;
    hold.lease = lease_;
    kv_->post_all([this, hold](int rank, kvtransfer::KvRankEndpoint& ep) {
      Status s = ep.hold(hold);
      if (!s.ok()) {
        const bool registered = ep.abort(hold.request_id, s.ToString()).code() != absl::StatusCode::kNotFound;
        on_command_failed(rank, hold.request_id, s, registered);
        return;
      }
      std::lock_guard lock(mu_);
      if (auto it = jobs_.find(hold.request_id); it != jobs_.end()) it->second.posted[rank] = 1;
      changed_.notify_all();
    });
  }
}

void PrefillRole::on_command_failed(int rank, const std::string& id, const Status& error, bool registered) {
  PD_LOG_WARN("prefill {}: kvtransfer rank {}: {}", id, rank, error.ToString());
  std::lock_guard lock(mu_);
  auto it = jobs_.find(id);
  if (it == jobs_.end()) return;
  Job& job = it->second;
  if (job.error.ok()) job.error = error;
  job.posted[rank] = 1;
  if (!registered) {
    job.released[rank] = 1;
    job.outcome_known[rank] = 1;
  }
  // The other ranks' consumers would otherwise wait for their lease. (Prefilled: nothing is
  // left in the engine.)
  (void)abort_locked(id, job);
  changed_.notify_all();
  maybe_finish(id);
}

void PrefillRole::on_kv_event(int rank, const KvTransferEvent& ev) {
  std::lock_guard lock(mu_);
  auto it = jobs_.find(ev.request_id);
  if (it == jobs_.end()) return;
  Job& job = it->second;
  job.outcome_known[rank] = 1;
  job.released[rank] = 1;  // Complete and failed events come once the rank's blocks are back.
  if (ev.kind == KvTransferEvent::Kind::kFailed) {
    if (job.error.ok()) job.error = ev.error;
    (void)abort_locked(ev.request_id, job);  // Prefilled: nothing is left in the engine.
  }
  if (job.all(job.outcome_known)) job.transferred_at = clock_->now();
  changed_.notify_all();
  maybe_finish(ev.request_id);
}

void PrefillRole::on_kv_release(int rank, const std::string& id) {
  std::lock_guard lock(mu_);
  auto it = jobs_.find(id);
  if (it == jobs_.end()) return;
  it->second.released[rank] = 1;
  changed_.notify_all();
  maybe_finish(id);
}

void PrefillRole::maybe_finish(const std::string& id) {
  auto it = jobs_.find(id);
  if (it == jobs_.end()) return;
  Job& job = it->second;
  const bool prefill_over = job.prefilled;
  const bool blocks_back = !job.transfer_started || job.all(job.released);
  if (job.transfer_started && blocks_back && !job.kv_blocks.empty()) {
    if (Status s = engine_.release_blocks(job.kv_blocks); !s.ok())
      PD_LOG_ERROR("prefill {}: releasing blocks: {}", id, s.ToString());
    job.kv_blocks.clear();
  }
  if (prefill_over && blocks_back && job.rpc_done) jobs_.erase(it);
}

bool PrefillRole::abort_locked(const std::string& id, Job& job) {
  if (job.aborting) return false;
  job.aborting = true;
  if (!job.prefilled) return true;
  if (job.transfer_started)
    kv_->post_all([id](int, kvtransfer::KvRankEndpoint& ep) { (void)ep.abort(id, "aborted by the router"); });
  return false;
}

bool PrefillRole::abort(const std::string& id) {
  std::unique_lock lock(mu_);
  auto it = jobs_.find(id);
  if (it == jobs_.end()) return false;
  const bool in_engine = abort_locked(id, it->second);
  lock.unlock();
  if (in_engine) loop_->abort(id);
  return true;
}

void PrefillRole::shutdown(Duration drain) {
  std::vector<std::string> in_engine;
  {
    std::lock_guard lock(mu_);
    for (auto& [id, job] : jobs_)
      if (abort_locked(id, job)) in_engine.push_back(id);
  }
  for (const std::string& id : in_engine) loop_->abort(id);
  if (kv_) kv_->stop(drain);
}

}  // namespace pdserve::worker
