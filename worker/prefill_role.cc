#include "worker/prefill_role.h"
#include "worker/block_release.h"
#include "worker/rank_progress.h"

#include <chrono>

#include "common/logging.h"
#include "worker/sampling_params.h"
#include "worker/token_logprobs.h"

namespace pdserve::worker {

using kvtransfer::KvTransferEvent;

struct PrefillRole::Job {
  bool push = true;
  bool via_host = false;           // pull-host: the decode side reads a host-tier copy.
  // pull-host: the prompt and its cache namespace, whose full blocks the host tier may hold already.
  std::vector<int> prompt;
  std::string cache_salt;
  KvGroup consumer;                // push: the decode worker's ranks.
  std::vector<int> target_blocks;  // push: the decode worker's reserved blocks.
  int skip_blocks = 0;             // push: prompt blocks the decode side holds already (not sent).
  int prompt_len = 0;
  bool request_ends_at_first_token = false;  // max_tokens 1, or the prompt fills the context.

  bool prefilled = false;
  Status error;
  std::optional<int> first_token;  // Unset when the first token is a stop token.
  bool want_logprobs = false;      // sampling.logprobs set: the first token's goes back.
  std::optional<engine::TokenLogprob> first_logprob;
  std::vector<engine::TokenLogprob> prompt_logprobs;  // sampling.prompt_logprobs set.
  int cached_tokens = 0;           // Of the prompt, from the prefix cache.
  engine::FinishReason reason = engine::FinishReason::kNone;
  std::vector<int> kv_blocks;      // The prompt's blocks, held for the transfer.
  // pull-host: the host-tier slots holding the prompt's copy (the device blocks went back at
  // once); empty when the host tier had no room and the decode side reads kv_blocks instead.
  std::vector<int> host_slots;
  // What the hold announced (kv_source): the blocks or slots, and whether they are host slots.
  std::vector<int> held_blocks;
  bool held_in_host = false;
  // Push starts at admission (begin_push), posts each layer from the engine's layer hook as
  // soon as the layer is written, and seals when the prefill finishes; pull starts then.
  bool transfer_started = false;
  std::vector<std::vector<char>> layer_posted;  // Push: [rank][layer].
  RankProgress ranks;
  bool aborting = false;
  bool rpc_done = false;
  TimePoint start, prefilled_at;
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
  engine.set_layer_hook([self](int rank, int layer, const std::vector<std::string>& completed) {
    if (!completed.empty()) self->on_layer(rank, layer, completed);
  });
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
  const bool via_host = request.kv_mode() == "pull-host";
  if (!push && !via_host && request.kv_mode() != "pull")
    return absl::InvalidArgumentError(
        absl::StrCat("kv_mode must be push, pull or pull-host, not '", request.kv_mode(), "'"));
  if (via_host && engine_.host_kv_blocks() == 0)
    return absl::FailedPreconditionError(
        "kv_mode pull-host needs a host KV tier on the prefill worker (--host-kv-bytes)");
  PD_ASSIGN_OR_RETURN(engine::SamplingParams params, to_engine_params(request.sampling(), request.resumed_tokens()));
  const int prompt_len = request.prompt_size();
  const int block_size = engine_.kv_layout(0).block_size();
  const int prompt_blocks = (prompt_len + block_size - 1) / block_size;
  Job job;
  job.push = push;
  job.via_host = via_host;
  if (via_host) {
    job.prompt.assign(request.prompt().begin(), request.prompt().end());
    job.cache_salt = request.cache_salt();
  }
  job.prompt_len = prompt_len;
  job.request_ends_at_first_token = params.max_tokens == 1 || prompt_len >= engine_.config().max_seq_len;
  job.want_logprobs = params.logprobs >= 0;
  job.start = clock_->now();
  if (push) {
    PD_ASSIGN_OR_RETURN(job.consumer, parse_kv_group(request.kv_target(), "kv_target"));
    if (job.consumer.compat_hash() != kv_->compat_hash())
      return absl::FailedPreconditionError("kv_target's KV geometry differs from this worker's (compat hash)");
    if (request.target_blocks_size() < prompt_blocks)
      return absl::InvalidArgumentError(absl::StrCat("the prompt fills ", prompt_blocks, " blocks, ",
                                                     request.target_blocks_size(), " target blocks given"));
    job.target_blocks.assign(request.target_blocks().begin(), request.target_blocks().begin() + prompt_blocks);
    if (request.skip_blocks() < 0 || request.skip_blocks() > prompt_blocks)
      return absl::InvalidArgumentError(absl::StrCat("skip_blocks ", request.skip_blocks(), " outside [0, ",
                                                     prompt_blocks, "] (the prompt's blocks)"));
    job.skip_blocks = request.skip_blocks();
  }
  const int tp = kv_->tp();
  if (push) job.layer_posted.assign(tp, std::vector<char>(engine_.kv_layout(0).num_layers(), 0));
  job.ranks = RankProgress(tp);
  {
    std::lock_guard lock(mu_);
    if (jobs_.count(id)) return absl::AlreadyExistsError(absl::StrCat("request ", id, " is already here"));
    jobs_.emplace(id, std::move(job));
  }
  engine::GenerationRequest greq{id, {request.prompt().begin(), request.prompt().end()}, params};
  greq.handoff.prefill_only = true;
  greq.resumed_tokens = request.resumed_tokens();
  greq.cache_salt = request.cache_salt();
  if (push) {
    greq.handoff.on_admitted = [this, id](const std::vector<int>& blocks) { on_admitted(id, blocks); };
  }
  Status submitted = loop_->submit(std::move(greq), [this, id](const engine::TokenEvent& ev) { on_token(id, ev); });
  std::unique_lock lock(mu_);
  if (!submitted.ok()) {
    jobs_.erase(id);
    return submitted;
  }
  Job& j = jobs_.at(id);
  // Push: until the first token is sampled (the router streams it at once; the transfer goes
  // on, and its outcome reaches the decode side). Pull: until every rank holds the blocks.
  auto done = [&] {
    if (!j.error.ok() && (!j.transfer_started || j.ranks.all(RankProgress::kPosted))) return true;
    if (!j.prefilled) return false;
    if (!j.transfer_started || push) return true;
    return j.ranks.all(RankProgress::kPosted);
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
  if (error.ok() && j.want_logprobs && j.first_token && !j.first_logprob)
    error = absl::InternalError(absl::StrCat("the engine gave no log-probability for the first token of ", id));
  if (error.ok()) {
    response.set_first_token(j.first_token.value_or(-1));
    if (j.first_token && j.first_logprob) *response.mutable_first_token_logprob() = to_wire(*j.first_logprob);
    append_wire(j.prompt_logprobs, response.mutable_prompt_logprobs());
    response.set_prefill_s(std::chrono::duration<double>(j.prefilled_at - j.start).count());
    response.set_cached_tokens(j.cached_tokens);
    if (j.reason == engine::FinishReason::kStop) response.set_finish_reason("stop");
    if (j.reason == engine::FinishReason::kLength && j.request_ends_at_first_token) response.set_finish_reason("length");
    if (!push && j.transfer_started) {
      KvGroup source = kv_->group();
      for (int b : j.held_blocks) (j.held_in_host ? source.add_host_blocks(b) : source.add_blocks(b));
      response.set_kv_source(source.SerializeAsString());
    }
  }
  j.rpc_done = true;
  maybe_finish(id);
  if (!error.ok()) return error;
  return response;
}

void PrefillRole::on_admitted(const std::string& id, const std::vector<int>& blocks) {
  std::lock_guard lock(mu_);
  auto it = jobs_.find(id);
  if (it == jobs_.end()) return;
  Job& job = it->second;
  if (job.aborting) return;  // The blocks come back with the finishing event.
  job.kv_blocks.assign(blocks.begin(), blocks.begin() + std::min(blocks.size(), prompt_blocks(job)));
  begin_push(id, job);
}

size_t PrefillRole::prompt_blocks(const Job& job) const {
  const int block_size = engine_.kv_layout(0).block_size();
  return size_t(job.prompt_len + block_size - 1) / block_size;
}

void PrefillRole::on_token(const std::string& id, const engine::TokenEvent& ev) {
  std::lock_guard lock(mu_);
  auto it = jobs_.find(id);
  if (it == jobs_.end()) return;
  Job& job = it->second;
  if (ev.token >= 0) {
    job.first_token = ev.token;
    job.first_logprob = ev.logprob;
  }
  if (!ev.prompt_logprobs.empty()) job.prompt_logprobs = ev.prompt_logprobs;
  job.cached_tokens = ev.cached_tokens;
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
  // The blocks past the prompt's (room for a first token this engine never feeds) go back now.
  if (!job.transfer_started) {
    job.kv_blocks.assign(ev.blocks.begin(), ev.blocks.begin() + std::min(prompt_blocks(job), ev.blocks.size()));
  }
  const std::vector<int> extra(ev.blocks.begin() + std::min(job.kv_blocks.size(), ev.blocks.size()),
                               ev.blocks.end());
  if (!extra.empty()) release_blocks(engine_, extra, absl::StrCat("prefill ", id, ": blocks past the prompt"));
  const bool finished_here = ev.reason == engine::FinishReason::kStop || job.request_ends_at_first_token;
  if (job.error.ok() && !job.aborting && job.push && !job.transfer_started) {
    job.error = absl::InternalError("the push did not start at admission");
  }
  if (job.error.ok() && !job.aborting && job.push) {
    // The layer hook reports every layer of the step that completes a prompt, after the layer
    // is written (and staged): a layer it missed is a bug, and sending it now could send bytes
    // nobody staged, so the request fails instead.
    for (int rank = 0; rank < kv_->tp() && job.error.ok(); ++rank)
      for (int l = 0; l < int(job.layer_posted[rank].size()); ++l)
        if (!job.layer_posted[rank][l]) {
          job.error = absl::InternalError(absl::StrCat("layer ", l, " of rank ", rank, " was never reported written"));
          break;
        }
  }
  if (!job.error.ok() || job.aborting) {
    // A started transfer gives its blocks back through the endpoints' abort; otherwise nobody
    // reads them.
    if (job.transfer_started) {
      (void)abort_locked(id, job);
    } else if (!job.kv_blocks.empty()) {
      release_blocks(engine_, job.kv_blocks, absl::StrCat("prefill ", id, ": failed before its transfer"));
      job.kv_blocks.clear();
    }
  } else if (job.push) {
    seal_push(id, job);
  } else if (finished_here) {
    // A pull request that already ended needs no decode: nobody will read these blocks.
    release_blocks(engine_, job.kv_blocks, absl::StrCat("prefill ", id, ": ended at its first token"));
    job.kv_blocks.clear();
  } else if (Status copied = job.via_host ? copy_to_host(id, job) : absl::OkStatus(); !copied.ok()) {
    job.error = copied;
    release_blocks(engine_, job.kv_blocks, absl::StrCat("prefill ", id, ": its host-tier copy failed"));
    job.kv_blocks.clear();
  } else {
    start_hold(id, job);
  }
  changed_.notify_all();
  maybe_finish(id);
}

void PrefillRole::note_held(const Job& job) {
  const double held = std::chrono::duration<double>(clock_->now() - job.prefilled_at).count();
  const int64_t us = int64_t(std::max(0.0, held) * 1e6) * int64_t(job.kv_blocks.size());
  held_block_us_.fetch_add(us, std::memory_order_relaxed);
}

Status PrefillRole::copy_to_host(const std::string& id, Job& job) {
  StatusOr<std::vector<int>> slots = engine_.lease_host_copy(job.prompt, job.cache_salt, job.kv_blocks);
  if (slots.status().code() == absl::StatusCode::kResourceExhausted) {
    // Every host slot is leased or being read: this request is read from the device instead.
    ++host_copy_fallbacks_;
    PD_LOG_WARN("prefill {}: pull-host: {}; the decode side reads the device blocks", id, slots.status().ToString());
    return absl::OkStatus();
  }
  if (!slots.ok()) return slots.status();  // A failed copy: the request fails, nothing is read.
  ++host_copies_;
  note_held(job);
  release_blocks(engine_, job.kv_blocks, absl::StrCat("prefill ", id, ": copied to the host tier"));
  job.kv_blocks.clear();
  job.host_slots = std::move(*slots);
  return absl::OkStatus();
}

void PrefillRole::begin_push(const std::string& id, Job& job) {
  job.transfer_started = true;
  kvtransfer::PushRequest push;
  push.request_id = id;
  push.consumer_tp = job.consumer.tp();
  push.consumer_endpoints.assign(job.consumer.rank_endpoints().begin(), job.consumer.rank_endpoints().end());
  push.consumer_incarnations.assign(job.consumer.rank_incarnations().begin(), job.consumer.rank_incarnations().end());
  push.producer_blocks = job.kv_blocks;
  push.consumer_blocks = job.target_blocks;
  push.lease = lease_;
  push.skip_blocks = job.skip_blocks;
  kv_->post_all([this, push](int rank, kvtransfer::KvRankEndpoint& ep) {
    if (Status s = ep.begin_push(push); !s.ok()) command_failed(rank, ep, push.request_id, s);
  });
}

void PrefillRole::post_layer(int rank, const std::string& id, Job& job, int layer) {
  if (job.layer_posted[rank][layer]) return;
  job.layer_posted[rank][layer] = 1;
  kv_->post(rank, [this, rank, id, layer](kvtransfer::KvRankEndpoint& ep) {
    if (!transfer_live(id)) return;
    if (Status s = ep.layer_ready(id, layer); !s.ok()) command_failed(rank, ep, id, s);
  });
}

void PrefillRole::on_layer(int rank, int layer, const std::vector<std::string>& completed) {
  std::unique_lock lock(mu_);
  std::vector<std::pair<std::string, std::vector<int>>> pushes;
  for (const std::string& id : completed) {
    auto it = jobs_.find(id);
    if (it == jobs_.end()) continue;
    Job& job = it->second;
    // Only the sent blocks go through the host mirror.
    if (job.push && job.transfer_started && !job.aborting) {
      const size_t skip = std::min<size_t>(size_t(job.skip_blocks), job.kv_blocks.size());
      pushes.emplace_back(id, std::vector<int>(job.kv_blocks.begin() + int64_t(skip), job.kv_blocks.end()));
    }
  }
  if (KvStaging* staging = kv_->staging(rank); staging != nullptr && !pushes.empty()) {
    // The layer goes to the host mirror before any put reads it. The blocks stay ours until
    // every rank gave them back, which an abort cannot complete before this hook returns.
    lock.unlock();
    std::vector<Status> staged;
    for (const auto& [id, blocks] : pushes) staged.push_back(staging->to_host(blocks, layer));
    lock.lock();
    for (size_t i = 0; i < pushes.size(); ++i) {
      if (staged[i].ok()) continue;
      auto it = jobs_.find(pushes[i].first);
      if (it != jobs_.end() && it->second.error.ok()) it->second.error = staged[i];
    }
  }
  for (const auto& [id, blocks] : pushes) {
    auto it = jobs_.find(id);
    if (it == jobs_.end()) continue;
    Job& job = it->second;
    if (job.error.ok() && !job.aborting) post_layer(rank, id, job, layer);
  }
}

void PrefillRole::seal_push(const std::string& id, Job& job) {
  // Every rank's WRITE_DONE carries the first token, so each consumer rank has it whichever
  // producer ranks its fan-in holds. Unset: the first token was a stop token.
  const std::optional<int32_t> first = job.first_token;
  for (int rank = 0; rank < kv_->tp(); ++rank) {
    kv_->post(rank, [this, rank, id, first](kvtransfer::KvRankEndpoint& ep) {
      if (!transfer_live(id)) return;
      if (Status s = ep.seal(id, first); !s.ok()) {
        command_failed(rank, ep, id, s);
        return;
      }
      std::lock_guard lock(mu_);
      if (auto it = jobs_.find(id); it != jobs_.end()) it->second.ranks.mark(rank, RankProgress::kPosted);
      changed_.notify_all();
    });
  }
}

void PrefillRole::start_hold(const std::string& id, Job& job) {
  job.transfer_started = true;
  kvtransfer::HoldRequest hold;
  hold.request_id = id;
  job.held_in_host = !job.host_slots.empty();
  job.held_blocks = job.held_in_host ? job.host_slots : job.kv_blocks;
  hold.producer_blocks = job.held_blocks;
  hold.region = job.held_in_host ? kvtransfer::KvRegion::kHost : kvtransfer::KvRegion::kDevice;
  hold.lease = lease_;
  kv_->post_all([this, hold](int rank, kvtransfer::KvRankEndpoint& ep) {
    // The prefill's steps have finished on every rank (a forward pass ends synchronized), so its
    // KV is complete on the device: the consumers may read the mirror once it holds it. A
    // host-tier copy is host memory already.
    KvStaging* staging = kv_->staging(rank);
    if (staging != nullptr && hold.region == kvtransfer::KvRegion::kDevice) {
      if (Status s = staging->to_host(hold.producer_blocks); !s.ok()) {
        on_command_failed(rank, hold.request_id, s, /*registered=*/false);
        return;
      }
    }
    if (Status s = ep.hold(hold); !s.ok()) {
      command_failed(rank, ep, hold.request_id, s);
      return;
    }
    std::lock_guard lock(mu_);
    if (auto it = jobs_.find(hold.request_id); it != jobs_.end()) it->second.ranks.mark(rank, RankProgress::kPosted);
    changed_.notify_all();
  });
}

bool PrefillRole::transfer_live(const std::string& id) {
  std::lock_guard lock(mu_);
  auto it = jobs_.find(id);
  return it != jobs_.end() && !it->second.aborting;
}

void PrefillRole::command_failed(int rank, kvtransfer::KvRankEndpoint& ep, const std::string& id,
                                 const Status& error) {
  // An endpoint that never registered the request (NotFound) leaves the blocks with us.
  const bool registered = ep.abort(id, error.ToString()).code() != absl::StatusCode::kNotFound;
  on_command_failed(rank, id, error, registered);
}

void PrefillRole::on_command_failed(int rank, const std::string& id, const Status& error, bool registered) {
  PD_LOG_WARN("prefill {}: kvtransfer rank {}: {}", id, rank, error.ToString());
  std::unique_lock lock(mu_);
  auto it = jobs_.find(id);
  if (it == jobs_.end()) return;
  Job& job = it->second;
  if (job.error.ok()) job.error = error;
  job.ranks.mark(rank, RankProgress::kPosted);
  if (!registered) job.ranks.mark(rank, RankProgress::kReleased);
  // The other ranks' consumers would otherwise wait for their lease; a push that began at
  // admission may still be prefilling.
  const bool in_engine = abort_locked(id, job);
  changed_.notify_all();
  maybe_finish(id);
  lock.unlock();
  if (in_engine) loop_->abort(id);
}

void PrefillRole::on_kv_event(int rank, const KvTransferEvent& ev) {
  std::unique_lock lock(mu_);
  auto it = jobs_.find(ev.request_id);
  if (it == jobs_.end()) return;
  Job& job = it->second;
  // Complete and failed events come once the rank's blocks are back.
  job.ranks.mark(rank, RankProgress::kReleased);
  job.ranks.mark(rank, RankProgress::kPosted);
  bool in_engine = false;
  if (ev.kind == KvTransferEvent::Kind::kFailed) {
    if (job.error.ok()) job.error = ev.error;
    in_engine = abort_locked(ev.request_id, job);  // A push may fail while still prefilling.
  }
  changed_.notify_all();
  maybe_finish(ev.request_id);
  lock.unlock();
  if (in_engine) loop_->abort(ev.request_id);
}

void PrefillRole::on_kv_release(int rank, const std::string& id) {
  std::lock_guard lock(mu_);
  auto it = jobs_.find(id);
  if (it == jobs_.end()) return;
  it->second.ranks.mark(rank, RankProgress::kReleased);
  changed_.notify_all();
  maybe_finish(id);
}

void PrefillRole::maybe_finish(const std::string& id) {
  auto it = jobs_.find(id);
  if (it == jobs_.end()) return;
  Job& job = it->second;
  const bool prefill_over = job.prefilled;
  const bool blocks_back = !job.transfer_started || job.ranks.all_released();
  // Only once the engine handed the blocks back too: a transfer aborted mid-prefill releases its
  // ranks while the engine still computes into these blocks, and freeing them then let another
  // request take them (and the finishing event's release of the rest freed them twice: chaos
  // with injected transfer faults logged it as a block-accounting bug).
  if (job.transfer_started && blocks_back && prefill_over && !job.kv_blocks.empty()) {
    note_held(job);
    if (Status s = engine_.release_blocks(job.kv_blocks); !s.ok())
      PD_LOG_ERROR("prefill {}: releasing blocks: {}", id, s.ToString());
    job.kv_blocks.clear();
  }
  if (job.transfer_started && blocks_back && !job.host_slots.empty()) {
    if (Status s = engine_.release_host_lease(job.host_slots); !s.ok())
      PD_LOG_ERROR("prefill {}: releasing host-tier slots: {}", id, s.ToString());
    job.host_slots.clear();
  }
  if (prefill_over && blocks_back && job.rpc_done) jobs_.erase(it);
}

bool PrefillRole::abort_locked(const std::string& id, Job& job) {
  if (job.aborting) return false;
  job.aborting = true;
  if (job.transfer_started) {
    kv_->post_all([this, id](int rank, kvtransfer::KvRankEndpoint& ep) {
      (void)ep.abort(id, "aborted");
      std::lock_guard lock(mu_);
      if (auto it = jobs_.find(id); it != jobs_.end()) it->second.ranks.mark(rank, RankProgress::kPosted);
      changed_.notify_all();
    });
  }
  return !job.prefilled;
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

size_t PrefillRole::open_jobs() const {
  std::lock_guard lock(mu_);
  return jobs_.size();
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
