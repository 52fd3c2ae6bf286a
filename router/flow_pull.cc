// Router::run_pull: one P/D placement where the decode side pulls the KV (pull, pull-host). Prefill
// on a prefill worker, which holds the prompt's KV (pull-host: a copy in its host tier) and returns
// the first token and where the KV is;
// the router streams that token at once, then Generate on a decode worker reads the KV it lacks
// (its own prefix cache holds the rest) and streams from the token after it.
#include "router/policy.h"
#include "router/request_state.h"

namespace pdserve::router {
Router::Attempt Router::run_pull(Flow& f) {
  const PrefillChoice prefill = choose_prefill(f);
  if (prefill.index < 0) return no_pair(f, prefill.loads);
  const int p = prefill.index;
  f.assign(clock_);
  worker::PrefillRequest preq;
  f.fill(preq);
  preq.set_kv_mode(std::string(kv_mode_name(options_.kv_mode)));  // pull or pull-host.
  if (auto source = prefix_source(f, p)) *preq.mutable_prefix_source() = *source;
  const int64_t queued = dispatched_prefill_tokens(preq.prompt_size(), prefill.load, prefill.terms_or_null());
  registry_.note_assigned(p, 0, queued);
  predict_cached(f, p);
  f.act->begin_attempt({p}, clock_.now());
  worker::PrefillResponse presp;
  {
    grpc::ClientContext pctx;
    pctx.set_deadline(grpc_deadline(clock_, f.act->deadline));
    f.act->add(&pctx);
    Status s =
        from_grpc(registry_.stub(p)->Prefill(&pctx, preq, &presp), absl::StrCat("Prefill on ", registry_.address(p)));
    registry_.note_prefill_done(p, queued);
    f.act->remove(&pctx);
    if (s.ok()) {
      s = check_prefill(f, p, presp);
      // The prefill worker holds the KV of an answer that cannot be used.
      if (!s.ok()) abort_on_workers(f.worker_id, {p});
    }
    if (!s.ok()) {
      if (Status st = f.act->status(); !st.ok()) {
        abort_on_workers(f.worker_id, {p});
        return {st, false};
      }
      if (auto stalled = stalled_attempt(f)) return *stalled;
      if (worker_failure(s)) {
        fail_worker(f, p, s);
        return {s, true};
      }
      return {s, false};
    }
  }
  f.prefill_worker = registry_.address(p);
  f.take_prompt_logprobs(presp.prompt_logprobs());
  if (!presp.finish_reason().empty()) {
    // The first token ended the request: there is nothing for a decode worker to do. Its text
    // goes through the same stop rules the workers apply, after the output the client has.
    abort_on_workers(f.worker_id, {p});
    f.final_event = first_token_event(f, presp);
    f.final_event.set_finished(true);
    f.final_event.set_finish_reason(presp.finish_reason());
    f.finished = true;
    f.prefill_s = presp.prefill_s();
    f.cached_tokens = presp.cached_tokens();
    return {absl::OkStatus(), false};
  }
  const int d = choose_decode(f, prefill);
  if (d < 0) {
    abort_on_workers(f.worker_id, {p});
    return Attempt::unplaced(absl::UnavailableError("no decode worker is up with room for this request"));
  }
  const AssignedTo decode_load(registry_, d, f.blocks_per_worker, 0);
  predict_cached(f, d);
  f.decode_worker = registry_.address(d);
  worker::WorkerGenerateRequest dreq;
  f.fill_decode(dreq);
  dreq.set_kv_mode("pull");
  dreq.set_kv_source(presp.kv_source());
  dreq.set_first_token(presp.first_token());
  // The client gets the first token now, not after the decode side read the KV.
  dreq.set_first_token_streamed(true);
  forward_first_token(f, presp);
  // The prefill worker holds the KV until the decode side has read it: both matter until the
  // first token streams.
  f.act->begin_attempt({p, d}, clock_.now());
  grpc::ClientContext dctx;
  dctx.set_deadline(grpc_deadline(clock_, f.act->deadline));
  f.act->add(&dctx);
  Status ds = read_stream(f, d, dctx, dreq);
  f.act->remove(&dctx);
  if (ds.ok()) return pd_served(f, p, d, presp);
  if (Status st = f.act->status(); !st.ok()) {
    abort_on_workers(f.worker_id, {d, p});
    return {st, false};
  }
  Attempt a{ds, false};
  if (auto stalled = stalled_attempt(f)) {
    a = *stalled;
  } else if (blames_peer(dctx)) {
    // The decode side could not read the held KV: the prefill worker (or its data path) failed.
    fail_worker(f, p, ds);
    a.retryable = true;
  } else if (worker_failure(ds)) {
    fail_worker(f, d, ds);
    a.retryable = true;
  }
  abort_on_workers(f.worker_id, {d, p});
  return a;
}

}  // namespace pdserve::router
