// Router::run_aggregated and Router::run_decode_local: one placement on one worker that
// prefills and decodes the request itself (a migrated request: prompt + the output so far,
// resumed) — an aggregated worker, or a decode worker of a P/D cluster when the prompt's part
// its cache lacks is short (decode-local prefill: no prefill worker, no transfer).
#include "router/policy.h"
#include "router/request_state.h"

namespace pdserve::router {

Router::Attempt Router::run_aggregated(Flow& f) {
  // The decode side's cost: an aggregated worker's cached prefix is what it need not compute.
  auto loads = registry_.loads(worker::ROLE_AGGREGATED);
  const std::optional<CacheTerms> terms = cache_terms(f, loads);
  const int w = pick_decode(loads, f.blocks_per_worker, f.exclude_decode, nullptr, preferred(f, loads, false),
                            terms ? &*terms : nullptr);
  if (w < 0) return Attempt::unplaced(absl::UnavailableError("no aggregated worker is up with room for this request"));
  return run_on_one(f, w);
}

int Router::decode_local_worker(const Flow& f) const {
  if (options_.local_prefill_tokens <= 0) return -1;
  std::vector<WorkerLoad> loads = registry_.loads(worker::ROLE_DECODE);
  const std::optional<CacheTerms> terms = cache_terms(f, loads);
  const int d = pick_decode(loads, f.blocks_per_worker, f.exclude_decode, nullptr, preferred(f, loads, false),
                            terms ? &*terms : nullptr);
  if (d < 0) return -1;
  const WorkerLoad l = load_of(loads, d);
  const int64_t uncached = int64_t(f.placement_tokens.size()) - int64_t(l.cached_blocks) * l.block_size;
  return uncached <= options_.local_prefill_tokens ? d : -1;
}

Router::Attempt Router::run_decode_local(Flow& f, int d) {
  f.local_prefill = true;
  metrics_.count_decode_local_prefill();
  return run_on_one(f, d);
}

Router::Attempt Router::run_on_one(Flow& f, int w) {
  f.assign(clock_);
  worker::WorkerGenerateRequest req;
  f.fill(req);
  if (f.local_prefill) req.set_kv_mode("local");
  registry_.note_chosen(w);
  const AssignedTo load(registry_, w, f.blocks_per_worker, int64_t(req.prompt_size()));
  predict_cached(f, w);
  f.decode_worker = f.prefill_worker = registry_.address(w);
  f.act->begin_attempt({w}, clock_.now());
  grpc::ClientContext ctx;
  ctx.set_deadline(grpc_deadline(clock_, f.act->deadline));
  f.act->add(&ctx);
  Status s = read_stream(f, w, ctx, req);
  f.act->remove(&ctx);
  if (s.ok()) {
    registry_.report_success(w);
    f.prefill_s = f.final_event.prefill_s();
    f.cached_tokens = f.final_event.cached_tokens();
    return {absl::OkStatus(), false};
  }
  if (Status st = f.act->status(); !st.ok()) {
    abort_on_workers(f.worker_id, {w});
    return {st, false};
  }
  if (auto stalled = stalled_attempt(f)) return *stalled;
  if (worker_failure(s)) {
    fail_worker(f, w, s);
    return {s, true};
  }
  abort_on_workers(f.worker_id, {w});
  return {s, false};
}

}  // namespace pdserve::router
