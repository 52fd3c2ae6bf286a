#include "worker/worker_service.h"
#include "worker/block_release.h"

#include "engine/backend.h"

#include <chrono>
#include <memory>

#include "common/logging.h"
#include "engine/backend.h"
#include "engine/tokenizer/chat_template.h"
#include "proto/sampling_defaults.h"
#include "kvtransfer/fault.h"
#include "proto/grpc_status.h"
#include "worker/sampling_params.h"
#include "worker/token_logprobs.h"
#include "worker/token_stream.h"

namespace pdserve::worker {
namespace {

using pdserve::to_grpc;

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// As to_grpc, and when the failure is the KV peer's (kvtransfer/fault.h), says so in the
// trailing metadata, so the router marks down that peer rather than this worker.
grpc::Status to_grpc(grpc::ServerContext* context, const Status& s) {
  if (context != nullptr && kvtransfer::is_peer_fault(s))
    context->AddTrailingMetadata(std::string(kvtransfer::kFaultMetadataKey), std::string(kvtransfer::kPeerFault));
  return pdserve::to_grpc(s);
}

grpc::Status draining_error() {
  return grpc::Status(grpc::StatusCode::UNAVAILABLE, "the worker is draining (shutting down): it takes no new work");
}

}  // namespace

class WorkerService::InFlight {
 public:
  explicit InFlight(std::atomic<int>& n) : n_(n) { ++n_; }
  ~InFlight() { --n_; }

 private:
  std::atomic<int>& n_;
};

WorkerService::WorkerService(Role role, std::string worker_id, engine::EngineLoop& loop, PrefillRole* prefill,
                             DecodeRole* decode, std::string kv_compat)
    : role_(role),
      kv_compat_(std::move(kv_compat)),
      worker_id_(std::move(worker_id)),
      loop_(loop),
      prefill_(prefill),
      decode_(decode) {}

grpc::Status WorkerService::Info(grpc::ServerContext*, const InfoRequest* request, WorkerInfo* reply) {
  const engine::Engine& e = loop_.engine();
  const engine::EngineLoopStats st = loop_.stats();
  {
    std::lock_guard lock(id_mu_);
    reply->set_worker_id(worker_id_);
    reply->set_kv_events_endpoint(kv_events_endpoint_);
    reply->set_kv_replay_endpoint(kv_replay_endpoint_);
  }
  reply->set_role(role_);
  reply->set_tp(e.tp());
  v1::ModelInfo* m = reply->mutable_model();
  m->set_name(e.model().name);
  m->set_vocab_size(e.config().vocab_size);
  m->set_max_context(e.config().max_seq_len);
  m->set_bos_id(e.config().bos_id);
  for (int id : e.config().eos_ids) m->add_eos_ids(id);
  if (role_ == ROLE_AGGREGATED) m->set_kv_mode("aggregated");
  m->set_chat_format(engine::chat_format_name(e.model().chat_template.format()));
  m->set_chat_format_reason(e.model().chat_template.fallback_reason());
  *m->mutable_sampling_defaults() = sampling_defaults_proto(e.config().generation_defaults);
  reply->set_num_blocks(st.engine.num_blocks);
  reply->set_free_blocks(st.engine.free_blocks);
  reply->set_block_size(st.engine.block_size);
  reply->set_running(st.engine.running);
  reply->set_waiting(st.engine.waiting);
  reply->set_queued_prefill_tokens(st.queued_prefill_tokens);
  reply->set_steps_total(st.engine.steps);
  reply->set_step_seconds_total(st.engine.step_seconds);
  reply->set_step_tokens_total(st.engine.prefill_tokens + st.engine.decode_tokens);
  reply->set_step_tokens_in_progress(st.engine.step_tokens_in_progress);
  reply->set_max_running(e.max_running());
  reply->set_max_batch_tokens(e.max_batch_tokens());
  reply->set_kv_key_root(std::string(e.kv_key_root().bytes.begin(), e.kv_key_root().bytes.end()));
  reply->set_prefix_caching(e.prefix_caching());
  reply->set_preemptions_total(st.engine.preemptions);
  if (st.engine.host_blocks > 0) {
    KvTierStats* host = reply->mutable_host_tier();
    host->set_blocks(st.engine.host_blocks);
    host->set_cached_blocks(st.engine.host_cached_blocks);
    host->set_free_blocks(st.engine.host_free_blocks);
    host->set_hit_tokens_total(st.engine.host_hit_tokens);
    host->set_stored_blocks_total(st.engine.host_stored_blocks);
    host->set_loaded_blocks_total(st.engine.host_loaded_blocks);
  }
  if (const uint64_t c = uint64_t(st.engine.disk_chunk_blocks); c > 0) {
    // Capacity in blocks is the byte cap's business (files have a fixed size per geometry):
    // `blocks` stays 0, `bytes` says how much is used.
    KvTierStats* disk = reply->mutable_disk_tier();
    disk->set_cached_blocks(int32_t(st.engine.disk_files * c));
    disk->set_hit_tokens_total(st.engine.disk_hit_tokens);
    disk->set_stored_blocks_total(st.engine.disk_stored_chunks * c);
    disk->set_loaded_blocks_total(st.engine.disk_loaded_chunks * c);
    disk->set_bytes(st.engine.disk_bytes);
    disk->set_dropped_blocks_total(st.engine.disk_dropped_chunks * c);
    disk->set_evicted_blocks_total(st.engine.disk_evicted_files * c);
    disk->set_corrupt_files_total(st.engine.disk_corrupt_files);
    disk->set_load_seconds_total(st.engine.disk_load_s);
    disk->set_load_timeouts_total(st.engine.disk_load_timeouts);
    disk->set_pending_loads_total(st.engine.disk_pending_loads);
  }
  if (peer_) {
    const PeerTierStats p = peer_->stats();
    KvTierStats* peer = reply->mutable_peer_tier();
    peer->set_loaded_blocks_total(p.read_blocks);
    peer->set_bytes(p.read_bytes);
    peer->set_load_seconds_total(p.read_seconds);
    peer->set_load_timeouts_total(p.timed_out_reads);
    peer->set_failed_loads_total(p.failed_reads);
    peer->set_stale_loads_total(p.stale_reads);
    peer->set_leases_total(p.leases);
    peer->set_leased_blocks_total(p.leased_blocks);
  }
  if (request->include_cached_keys()) {
    for (const engine::BlockKey& k : e.cached_keys())
      reply->add_cached_keys(std::string(k.bytes.begin(), k.bytes.end()));
  }
  if (request->include_steps()) {
    for (const engine::StepSample& s : e.steps_after(request->steps_after())) {
      StepSample* out = reply->add_steps();
      out->set_seq(s.seq);
      out->set_prefill_tokens(s.prefill_tokens);
      out->set_prefill_seqs(s.prefill_seqs);
      out->set_decode_seqs(s.decode_seqs);
      out->set_kv_tokens(s.kv_tokens);
      out->set_wall_s(s.wall_s);
    }
  }
  const KvRanks* kv = prefill_ ? &prefill_->kv() : decode_ ? &decode_->kv() : nullptr;
  if (prefill_) {
    reply->set_host_copies_total(prefill_->host_copies());
    reply->set_host_copy_fallbacks_total(prefill_->host_copy_fallbacks());
    reply->set_transfer_held_block_seconds_total(prefill_->held_block_seconds());
  }
  reply->set_backend(e.backend(0).name());
  reply->set_kv_compat(kv_compat_);
  if (kv) {
    reply->set_compat_hash(kv->compat_hash());
    reply->set_kv_endpoint(kv->group().SerializeAsString());
    reply->set_kv_memory(kv->memory_path());
    reply->set_kv_staged_to_host_bytes(kv->staged_bytes_to_host());
    reply->set_kv_staged_to_device_bytes(kv->staged_bytes_to_device());
    const kvtransfer::KvEndpointCounters c = kv->counters();
    reply->set_kv_transfer_requests(c.requests_done);
    reply->set_kv_transfer_bytes(c.bytes);
    reply->set_kv_transfer_failures(c.failures);
    reply->set_kv_transfer_leases_expired(c.leases_expired);
    reply->set_kv_transfer_refused(c.refused);
    reply->set_kv_transfer_seconds(std::chrono::duration<double>(c.latency_total).count());
  }
  return grpc::Status::OK;
}

grpc::Status WorkerService::Reserve(grpc::ServerContext* context, const ReserveRequest* request,
                                    ReserveResponse* reply) {
  if (!decode_) return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "Reserve is served by decode workers");
  InFlight counted(in_flight_);
  if (draining_) return draining_error();
  StatusOr<ReserveResponse> r = decode_->reserve(*request);
  // With the fault metadata: an unreachable producer is the producer's failure, not ours.
  if (!r.ok()) return to_grpc(context, r.status());
  *reply = std::move(*r);
  return grpc::Status::OK;
}

grpc::Status WorkerService::Prefill(grpc::ServerContext* context, const PrefillRequest* request,
                                    PrefillResponse* reply) {
  if (!prefill_) return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "Prefill is served by prefill workers");
  InFlight counted(in_flight_);
  if (draining_) return draining_error();
  if (request->has_prefix_source()) {
    if (!peer_)
      return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                          "a PrefixSource names a peer to read from, but this worker has no peer tier (--kv-peer-tier)");
    // What the source holds beyond this worker's caches lands in the host tier, where the
    // prefill's admission finds it; a failed read is computed instead.
    peer_->read(request->request_id(), {request->prompt().begin(), request->prompt().end()}, request->cache_salt(),
                request->prefix_source());
  }
  StatusOr<PrefillResponse> r = prefill_->prefill(*request, [context] { return context->IsCancelled(); });
  if (!r.ok()) return to_grpc(context, r.status());
  *reply = std::move(*r);
  return grpc::Status::OK;
}

grpc::Status WorkerService::PeerLease(grpc::ServerContext* context, const PeerLeaseRequest* request,
                                      PeerLeaseResponse* reply) {
  if (!peer_) return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "this worker has no peer tier (--kv-peer-tier)");
  StatusOr<PeerLeaseResponse> r = peer_->lease(*request);
  if (!r.ok()) return to_grpc(context, r.status());
  *reply = std::move(*r);
  return grpc::Status::OK;
}

grpc::Status WorkerService::PeerRelease(grpc::ServerContext*, const PeerReleaseRequest* request,
                                        PeerReleaseResponse* reply) {
  if (!peer_) return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "this worker has no peer tier (--kv-peer-tier)");
  *reply = peer_->release(*request);
  return grpc::Status::OK;
}

grpc::Status WorkerService::Generate(grpc::ServerContext* context, const WorkerGenerateRequest* request,
                                     grpc::ServerWriter<WorkerEvent>* writer) {
  if (request->request_id().empty()) return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "empty request id");
  InFlight counted(in_flight_);
  // A push Generate claims blocks reserved before the drain began: refusing it would strand them.
  if (draining_ && request->kv_mode() != "push") return draining_error();
  StatusOr<engine::SamplingParams> params = to_engine_params(request->sampling(), request->resumed_tokens());
  if (!params.ok()) return to_grpc(params.status());
  const std::string& mode = request->kv_mode();
  // The whole request on this worker's engine: prefilled from its own prefix cache, then decoded.
  const auto prefill_here = [&] {
    engine::GenerationRequest r{request->request_id(), {request->prompt().begin(), request->prompt().end()}, *params};
    r.resumed_tokens = request->resumed_tokens();
    r.cache_salt = request->cache_salt();
    return stream(context, std::move(r), nullptr, writer);
  };
  if (role_ == ROLE_AGGREGATED) {
    if (!mode.empty())
      return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "an aggregated worker takes no kv_mode");
    return prefill_here();
  }
  if (!decode_) return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "Generate is served by decode workers");
  // Decode-local prefill: the router found the prompt's uncached part short enough for this side.
  if (mode == "local") return prefill_here();
  if (mode != "push" && mode != "pull")
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "a decode worker needs kv_mode push, pull or local");
  // The prompt's log-probabilities come from the prefill pass, which ran on the prefill side
  // (PrefillResponse.prompt_logprobs); so does the first token's, so this side can give the
  // logprobs only of the tokens it samples itself, after a first token the router streamed.
  if (params->prompt_logprobs >= 0)
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "sampling.prompt_logprobs: the prefill worker computes them (PrefillResponse), not the decode one");
  if (params->logprobs >= 0 && !request->first_token_streamed())
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "sampling.logprobs needs first_token_streamed: the first token's log-probability is the "
                        "prefill worker's (PrefillResponse.first_token_logprob)");
  StatusOr<PreparedDecode> prepared = decode_->prepare(*request, *params, [context] { return context->IsCancelled(); });
  if (!prepared.ok()) return to_grpc(context, prepared.status());
  if (prepared->finished_by_prefill) {
    WorkerEvent ev;
    ev.set_finished(true);
    ev.set_finish_reason("stop");
    ev.set_kv_transfer_s(prepared->kv_transfer_s);
    ev.set_decode_cached_tokens(prepared->cached_tokens);
    ev.set_transferred_blocks(prepared->transferred_blocks);
    writer->Write(ev);
    return grpc::Status::OK;
  }
  return stream(context, std::move(prepared->request), &*prepared, writer);
}

grpc::Status WorkerService::stream(grpc::ServerContext* context, engine::GenerationRequest request,
                                   const PreparedDecode* kv, grpc::ServerWriter<WorkerEvent>* writer) {
  const std::string id = request.id;
  const std::vector<int> preloaded = request.handoff.preloaded_blocks;
  const bool aggregated = preloaded.empty();
  const bool want_logprobs = request.params.logprobs >= 0;
  auto events = std::make_shared<TokenStream>();
  const auto start = std::chrono::steady_clock::now();
  Status submitted = loop_.submit(std::move(request), [events](const engine::TokenEvent& ev) { events->push(ev); });
  if (!submitted.ok()) {
    // The engine never took the preloaded blocks: they are still ours to free.
    if (!preloaded.empty()) release_blocks(loop_.engine(), preloaded, "decode " + id + ": refused by the engine loop");
    return to_grpc(submitted);
  }
  double first_token_s = -1;
  while (true) {
    std::vector<engine::TokenEvent> batch = events->pop(std::chrono::milliseconds(50));
    if (context->IsCancelled()) {
      loop_.abort(id);
      return grpc::Status(grpc::StatusCode::CANCELLED, "client cancelled");
    }
    if (batch.empty()) continue;
    WorkerEvent out;
    const engine::TokenEvent* last = nullptr;
    for (const engine::TokenEvent& ev : batch) {
      if (ev.token >= 0) {
        out.add_token_ids(ev.token);
        // WorkerEvent.logprobs pairs with token_ids one to one; a token without one would
        // shift every later pair, so the request fails instead.
        if (want_logprobs) {
          if (!ev.logprob) {
            loop_.abort(id);
            return grpc::Status(grpc::StatusCode::INTERNAL,
                                absl::StrCat("the engine gave no log-probability for token ", ev.token));
          }
          *out.add_logprobs() = to_wire(*ev.logprob);
        }
      }
      if (!ev.prompt_logprobs.empty()) append_wire(ev.prompt_logprobs, out.mutable_prompt_logprobs());
      out.mutable_text()->append(ev.text);
      if (ev.finished) last = &ev;
    }
    if (first_token_s < 0 && (out.token_ids_size() > 0 || last)) first_token_s = seconds_since(start);
    if (last) {
      if (!last->error.ok()) return to_grpc(last->error);
      out.set_finished(true);
      out.set_finish_reason(std::string(engine::finish_reason_name(last->reason)));
      if (aggregated) {
        out.set_prefill_s(first_token_s);
        out.set_cached_tokens(last->cached_tokens);
      }
      if (kv) {
        out.set_kv_transfer_s(kv->kv_transfer_s);
        out.set_decode_cached_tokens(kv->cached_tokens);
        out.set_transferred_blocks(kv->transferred_blocks);
      }
      out.set_first_token_s(first_token_s);
    }
    if (!writer->Write(out)) {
      if (!last) loop_.abort(id);
      return grpc::Status(grpc::StatusCode::CANCELLED, "the stream closed");
    }
    if (last) return grpc::Status::OK;
  }
}

grpc::Status WorkerService::Abort(grpc::ServerContext*, const WorkerAbortRequest* request, WorkerAbortResponse* reply) {
  const std::string& id = request->request_id();
  bool found = (prefill_ && prefill_->abort(id)) || (decode_ && decode_->abort(id));
  if (!found && loop_.active(id)) {
    loop_.abort(id);
    found = true;
  }
  reply->set_found(found);
  return grpc::Status::OK;
}

}  // namespace pdserve::worker
