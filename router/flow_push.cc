// Router::run_push: one P/D placement where the prefill side pushes the KV. Reserve on a
// decode worker (blocks for the whole request, bound to the chosen prefill worker's group, the
// leading ones from its own prefix cache), then Prefill towards those blocks, skipping the
// cached ones, while the decode worker's Generate stream is already open: the decode side
// starts the moment the KV is sealed. The prefill reply comes at the first
// token, which the router streams at once; the decode stream goes on from the token after it.
#include <future>
#include <thread>

#include "router/policy.h"
#include "router/request_state.h"

namespace pdserve::router {
namespace {

// Back-off between Reserve calls on full decode workers: their requests free blocks as they
// end, so the wait doubles from 2 ms to at most 50 ms rather than spinning.
constexpr auto kReserveBackoffMin = std::chrono::milliseconds(2);
constexpr auto kReserveBackoffMax = std::chrono::milliseconds(50);

}  // namespace

Router::Attempt Router::run_push(Flow& f) {
  // The prefill worker is chosen first: the decode side binds the transfer to its producer
  // group (TP and endpoints) at Reserve time, before any write can arrive.
  const PrefillChoice prefill = choose_prefill(f);
  if (prefill.index < 0) return no_pair(f, prefill.loads);
  const int p = prefill.index;
  const std::optional<worker::WorkerInfo> producer = registry_.info(p);
  const std::vector<int>& tokens = f.placement_tokens;
  const v1::SamplingParams sampling = f.placement_sampling();
  // Reserve on a decode worker; a full one is retried after a back-off.
  int d = -1;
  worker::ReserveResponse reserved;
  auto backoff = std::chrono::duration_cast<Duration>(kReserveBackoffMin);
  while (true) {
    if (Status s = f.act->status(); !s.ok()) return {s, false};
    d = choose_decode(f, prefill);
    if (d < 0) return Attempt::unplaced(absl::UnavailableError("no decode worker is up with room for this request"));
    grpc::ClientContext ctx;
    ctx.set_deadline(std::min(grpc_deadline(clock_, f.act->deadline),
                              std::chrono::system_clock::now() + options_.worker_rpc_timeout));
    f.act->add(&ctx);
    worker::ReserveRequest req;
    req.set_request_id(f.worker_id);
    req.set_num_tokens(
        int(std::min<int64_t>(int64_t(tokens.size()) + sampling.max_tokens(), model_.config.max_seq_len)));
    req.set_prompt_len(int(tokens.size()));
    // The decode worker starts the reservation from its own prefix cache for these tokens.
    for (int t : tokens) req.add_prompt(t);
    req.set_cache_salt(f.cache_salt);
    req.set_producer_tp(producer ? producer->tp() : 1);
    if (producer) req.set_kv_producer(producer->kv_endpoint());
    Status s =
        from_grpc(registry_.stub(d)->Reserve(&ctx, req, &reserved), absl::StrCat("Reserve on ", registry_.address(d)));
    f.act->remove(&ctx);
    if (s.ok()) break;
    if (Status st = f.act->status(); !st.ok()) return {st, false};
    if (absl::IsResourceExhausted(s)) {
      std::this_thread::sleep_for(backoff);
      backoff = std::min<Duration>(backoff * 2, kReserveBackoffMax);
      continue;
    }
    if (blames_peer(ctx)) {
      // The decode worker could not reach this prefill worker's KV endpoint (it died, say).
      fail_worker(f, p, s);
      return {s, true};
    }
    // A Reserve unanswered within the worker RPC timeout is the decode worker's failure, like
    // one that died — unless the request's own deadline was the one that ran out.
    if (worker_failure(s) || (absl::IsDeadlineExceeded(s) && clock_.now() < f.act->deadline)) {
      fail_worker(f, d, s);
      return {s, true};
    }
    return {s, false};
  }
  const AssignedTo decode_load(registry_, d, f.blocks_per_worker, 0);
  f.assign(clock_);
  const int64_t queued = dispatched_prefill_tokens(int(tokens.size()), prefill.load, prefill.terms_or_null());
  registry_.note_assigned(p, 0, queued);
  const std::optional<worker::PrefixSource> source = prefix_source(f, p);
  predict_cached(f, p);
  predict_cached(f, d);
  f.prefill_worker = registry_.address(p);
  f.decode_worker = registry_.address(d);

  worker::PrefillRequest preq;
  f.fill(preq);
  preq.set_kv_mode("push");
  if (source) *preq.mutable_prefix_source() = *source;
  preq.set_kv_target(reserved.kv_target());
  preq.mutable_target_blocks()->CopyFrom(reserved.block_ids());
  preq.set_skip_blocks(reserved.cached_prefix_blocks());  // Only the blocks the decode side lacks move.

  worker::WorkerGenerateRequest dreq;
  f.fill_decode(dreq);
  dreq.set_kv_mode("push");
  dreq.mutable_reserved_blocks()->CopyFrom(reserved.block_ids());
  // The router streams the first token from the prefill reply, which comes as soon as it is
  // sampled, while the KV is still on its way to the decode side.
  dreq.set_first_token_streamed(true);

  f.act->begin_attempt({p, d}, clock_.now());
  grpc::ClientContext dctx;
  dctx.set_deadline(grpc_deadline(clock_, f.act->deadline));
  f.act->add(&dctx);
  worker::PrefillResponse presp;
  Status prefill_status;
  grpc::ClientContext pctx;
  pctx.set_deadline(grpc_deadline(clock_, f.act->deadline));
  f.act->add(&pctx);
  // gRPC's callback API: the call leaves at once, with no thread of our own per request.
  std::promise<void> prefill_done;
  registry_.stub(p)->async()->Prefill(&pctx, &preq, &presp, [&](const grpc::Status& s) {
    prefill_status = from_grpc(s, absl::StrCat("Prefill on ", registry_.address(p)));
    if (!prefill_status.ok()) dctx.TryCancel();  // The decode side would wait for KV that never comes.
    prefill_done.set_value();
  });
  // The decode stream opens beside the prefill, so the decode side starts the moment the KV is
  // sealed; it is read only after the prefill reply, whose first token comes before its events.
  auto decode_stream = registry_.stub(d)->Generate(&dctx, dreq);
  prefill_done.get_future().wait();
  registry_.note_prefill_done(p, queued);
  if (prefill_status.ok()) {
    prefill_status = check_prefill(f, p, presp);
    if (!prefill_status.ok()) dctx.TryCancel();
  }
  Status ds;
  if (prefill_status.ok()) {
    f.take_prompt_logprobs(presp.prompt_logprobs());
    forward_first_token(f, presp);
    ds = read_events(f, d, dctx, *decode_stream);
  } else {
    // Without the first token the decode stream cannot be shown: it was cancelled.
    for (worker::WorkerEvent unread; decode_stream->Read(&unread);) {
    }
    ds = from_grpc(decode_stream->Finish(), absl::StrCat("Generate on ", registry_.address(d)));
    if (ds.ok()) ds = absl::CancelledError("the prefill failed");
  }
  f.act->remove(&pctx);
  f.act->remove(&dctx);

  if (ds.ok()) return pd_served(f, p, d, presp);
  if (Status st = f.act->status(); !st.ok()) {
    abort_on_workers(f.worker_id, {d, p});
    return {st, false};
  }
  Attempt a{ds, false};
  // Both sides fail when one dies; the survivor says its peer was at fault. The prefill RPC ended
  // before the decode stream's cancellation could be mistaken for its cause, so judge it first.
  const bool prefill_blames_decode = !prefill_status.ok() && blames_peer(pctx);
  const bool prefill_at_fault = !prefill_status.ok() && worker_failure(prefill_status) && !prefill_blames_decode;
  const bool decode_at_fault = prefill_blames_decode || (!prefill_at_fault && worker_failure(ds) && !blames_peer(dctx));
  const bool decode_blames_prefill = !prefill_at_fault && blames_peer(dctx);
  if (auto stalled = stalled_attempt(f)) {
    a = *stalled;
  } else if (prefill_at_fault || decode_blames_prefill) {
    a = {prefill_status.ok() ? ds : prefill_status, true};
    fail_worker(f, p, a.status);
  } else if (decode_at_fault) {
    a = {absl::IsCancelled(ds) ? prefill_status : ds, true};
    fail_worker(f, d, a.status);
  } else if (!prefill_status.ok()) {
    a = {prefill_status, false};
    f.exclude_prefill.push_back(p);
  }
  abort_on_workers(f.worker_id, {d, p});
  return a;
}

}  // namespace pdserve::router
