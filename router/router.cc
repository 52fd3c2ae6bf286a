#include "router/router.h"

#include <random>
#include <thread>

#include "common/logging.h"
#include "proto/sampling_defaults.h"
#include "router/kv_routing.h"
#include "router/policy.h"
#include "router/request_state.h"

namespace pdserve::router {

Router::Router(const RouterOptions& options, ServedModel model, WorkerRegistry& registry, RouterMetrics& metrics,
               const Clock& clock, KvRouting* kv)
    : options_(options),
      model_(std::move(model)),
      registry_(registry),
      metrics_(metrics),
      clock_(clock),
      kv_(kv),
      admission_(options.max_running, options.max_waiting),
      id_prefix_([] {
        std::random_device rd;
        return absl::StrCat(absl::Hex(uint64_t(rd()) << 32 | rd(), absl::kZeroPad16));
      }()) {
  for (const engine::LayerKvSpec& l : model_.config.kv_cache_spec(16).layers)
    kv_bytes_per_token_ += uint64_t(l.num_kv_heads) * (l.head_dim + l.v_head_dim) * engine::dtype_size(l.dtype);
  watchdog_ = std::thread([this] { watchdog_loop(); });
}

Router::~Router() {
  {
    std::lock_guard lock(watchdog_mu_);
    stopping_ = true;
  }
  watchdog_cv_.notify_all();
  watchdog_.join();
  std::unique_lock lock(aborts_mu_);
  aborts_done_.wait(lock, [this] { return aborts_in_flight_ == 0; });
}

void Router::watchdog_loop() {
  std::unique_lock lock(watchdog_mu_);
  while (!watchdog_cv_.wait_for(lock, std::chrono::milliseconds(20), [this] { return stopping_; })) {
    std::vector<std::shared_ptr<Active>> active;
    {
      std::lock_guard l(active_mu_);
      for (auto& [id, a] : active_) active.push_back(a);
    }
    if (active.empty()) continue;
    const std::vector<WorkerRegistry::Watch> workers = registry_.watch();
    const TimePoint now = clock_.now();
    for (auto& a : active) {
      if (a->client_is_gone()) a->cancel(Active::kClientGone);
      else if (now >= a->deadline) a->cancel(Active::kDeadline);
      else
        watch_placement(*a, now, workers);
    }
  }
}

void Router::watch_placement(Active& a, TimePoint now, const std::vector<WorkerRegistry::Watch>& watched) {
  std::vector<int> workers;
  int streaming = -1;
  TimePoint last;
  Duration itl;
  uint64_t attempt;
  {
    std::lock_guard lock(a.mu);
    if (a.stalled_worker >= 0) return;
    attempt = a.attempt;
    workers = a.workers;
    streaming = a.streaming_worker;
    last = a.last_progress;
    itl = a.mean_itl;
  }
  // A placement made after the snapshot may name a worker registered after it: its turn comes
  // next tick.
  const auto watch_of = [&](int w) { return w < int(watched.size()) ? watched[w] : WorkerRegistry::Watch{}; };
  for (int w : workers)
    if (watch_of(w).failed) {
      a.stall(w, absl::StrCat("worker ", registry_.address(w), " is down"), attempt);
      return;
    }
  if (streaming < 0) return;  // Before the first token a prefill may queue for long: only a down worker ends it.
  // 50 tokens' time, or 50 of the worker's steps: an engine whose steps are slow (a large model
  // on CPU, an emulated GPU) is not a stalled one, also before the placement's second token.
  // Nor is one running a long step (a large prefill chunk after short decode steps), for 4
  // times that step's expected length — which bounds it, so a stuck step is still found.
  const WorkerRegistry::Watch worker = watch_of(streaming);
  const Duration limit =
      std::max({options_.stall_timeout, itl * 50, worker.step_time * 50, worker.step_in_progress * 4});
  if (now - last > limit)
    a.stall(streaming,
            absl::StrCat("no token from ", registry_.address(streaming), " for ", seconds(now - last), " s (the limit ",
                         seconds(limit), " s; mean inter-token time ", seconds(itl) * 1e3, " ms, worker step time ",
                         seconds(worker.step_time) * 1e3, " ms, step in progress ",
                         seconds(worker.step_in_progress) * 1e3, " ms)"),
            attempt);
}

int Router::preferred(const Flow& f, const std::vector<WorkerLoad>& loads, bool prefill) const {
  const PromptPlacement& p = f.affinity->prefer;
  return index_of(loads, prefill ? p.prefill_worker : p.decode_worker,
                  [this](int i) -> const std::string& { return registry_.address(i); });
}

Router::PrefillChoice Router::choose_prefill(const Flow& f) {
  PrefillChoice c;
  c.loads = registry_.loads(worker::ROLE_PREFILL);
  c.terms = cache_terms(f, c.loads);
  c.index = pick_prefill(c.loads, f.exclude_prefill, registry_.loads(worker::ROLE_DECODE), f.blocks_per_worker,
                         f.exclude_decode, preferred(f, c.loads, true), c.terms_or_null());
  if (c.index < 0) return c;
  registry_.note_chosen(c.index);
  c.load = load_of(c.loads, c.index);
  return c;
}

int Router::choose_decode(const Flow& f, const PrefillChoice& prefill) {
  std::vector<WorkerLoad> loads = registry_.loads(worker::ROLE_DECODE, prefill.index);
  const std::optional<CacheTerms> terms = cache_terms(f, loads);
  const int d = pick_decode(loads, f.blocks_per_worker, f.exclude_decode, &prefill.load, preferred(f, loads, false),
                            terms ? &*terms : nullptr);
  if (d >= 0) registry_.note_chosen(d, prefill.index);
  return d;
}

std::optional<CacheTerms> Router::cache_terms(const Flow& f, std::vector<WorkerLoad>& loads) const {
  if (!kv_ || options_.placement != Placement::kCache || !f.prompt_keys) return std::nullopt;
  std::vector<std::string> addresses;
  int block_size = 0;
  for (const WorkerLoad& l : loads) {
    addresses.push_back(registry_.address(l.index));
    if (block_size == 0) block_size = l.block_size;
  }
  const std::vector<int> cached = kv_->cached_blocks(addresses, *f.prompt_keys);
  for (size_t i = 0; i < loads.size(); ++i) loads[i].cached_blocks = cached[i];
  CacheTerms terms;
  terms.prompt_blocks = block_size > 0 ? int(f.placement_tokens.size()) / block_size : 0;
  terms.transfer_weight = options_.transfer_weight;
  return terms;
}

void Router::predict_cached(const Flow& f, int worker) {
  if (kv_ && options_.placement == Placement::kCache && f.prompt_keys) kv_->predict(registry_.address(worker), *f.prompt_keys);
}

std::optional<worker::PrefixSource> Router::prefix_source(const Flow& f, int prefill) const {
  if (!kv_ || !f.prompt_keys) return std::nullopt;
  const auto info = registry_.info(prefill);
  if (!info || !info->has_peer_tier()) return std::nullopt;
  std::vector<std::string> others;
  for (worker::Role role : {worker::ROLE_PREFILL, worker::ROLE_DECODE})
    for (const WorkerLoad& l : registry_.loads(role))
      if (l.up && l.index != prefill) others.push_back(registry_.address(l.index));
  const std::optional<KvRouting::HostHolder> holder = kv_->host_holder(others, *f.prompt_keys);
  if (!holder || holder->blocks <= kv_->held_blocks(registry_.address(prefill), *f.prompt_keys)) return std::nullopt;
  worker::PrefixSource source;
  source.set_address(holder->address);
  source.set_blocks(holder->blocks);
  return source;
}

std::string Router::new_request_id() { return absl::StrCat("req-", id_prefix_, "-", next_id_++); }

v1::ModelInfo Router::model_info() const {
  v1::ModelInfo m;
  m.set_name(model_.name);
  m.set_vocab_size(model_.config.vocab_size);
  m.set_max_context(model_.config.max_seq_len);
  m.set_bos_id(model_.config.bos_id);
  for (int e : model_.config.eos_ids) m.add_eos_ids(e);
  m.set_kv_mode(std::string(kv_mode_name(options_.kv_mode)));
  m.set_chat_format(engine::chat_format_name(model_.chat_template.format()));
  m.set_chat_format_reason(model_.chat_template.fallback_reason());
  *m.mutable_sampling_defaults() = sampling_defaults_proto(model_.config.generation_defaults);
  int ranks = 0;
  for (worker::Role role : {worker::ROLE_AGGREGATED, worker::ROLE_PREFILL, worker::ROLE_DECODE}) {
    for (const WorkerLoad& l : registry_.loads(role)) {
      if (!l.up) continue;
      ranks += l.tp;
      if (m.kv_block_size() == 0)
        if (const auto info = registry_.info(l.index)) m.set_kv_block_size(info->block_size());
    }
  }
  m.set_num_ranks(ranks);
  return m;
}

int Router::in_flight() const {
  std::lock_guard lock(active_mu_);
  return int(active_.size());
}

bool Router::ready() const {
  if (draining_) return false;
  auto any_up = [&](worker::Role role) {
    for (const WorkerLoad& l : registry_.loads(role))
      if (l.up) return true;
    return false;
  };
  if (options_.kv_mode == KvMode::kAggregated) return any_up(worker::ROLE_AGGREGATED);
  return any_up(worker::ROLE_PREFILL) && any_up(worker::ROLE_DECODE);
}

std::string Router::metrics_text() const {
  const std::vector<WorkerGauges> workers = registry_.gauges();
  std::string out = metrics_.render(admission_.running(), admission_.waiting(), workers);
  if (kv_) {
    std::vector<KvIndexWorkerGauge> index;
    for (const WorkerGauges& w : workers) index.push_back(kv_->gauge(w.worker));
    append_kv_index_metrics(out, kv_->stats(), index);
  }
  return out;
}

bool Router::abort(const std::string& request_id, const std::string& client) {
  std::shared_ptr<Active> a;
  {
    std::lock_guard lock(active_mu_);
    auto it = active_.find(client.empty() ? request_id : absl::StrCat(client, ":", request_id));
    if (it == active_.end()) return false;
    a = it->second;
  }
  a->cancel(Active::kAborted);
  return true;
}

void Router::abort_all() {
  std::vector<std::shared_ptr<Active>> all;
  {
    std::lock_guard lock(active_mu_);
    for (const auto& [id, a] : active_) all.push_back(a);
  }
  for (const auto& a : all) a->cancel(Active::kAborted);
}

void Router::abort_on_workers(const std::string& worker_request_id, const std::vector<int>& workers) {
  // Asynchronous: a stalled worker's answer (or its 2 s deadline) never holds up the request.
  struct Call {
    grpc::ClientContext ctx;
    worker::WorkerAbortRequest req;
    worker::WorkerAbortResponse resp;
  };
  for (int w : workers) {
    if (w < 0) continue;
    auto* call = new Call;
    call->ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
    call->req.set_request_id(worker_request_id);
    {
      std::lock_guard lock(aborts_mu_);
      ++aborts_in_flight_;
    }
    registry_.stub(w)->async()->Abort(&call->ctx, &call->req, &call->resp,
                                      [this, call, address = registry_.address(w)](grpc::Status s) {
                                        if (!s.ok())
                                          PD_LOG_DEBUG("Abort {} on {}: {}", call->req.request_id(), address,
                                                       s.error_message());
                                        delete call;  // Before the count: the destructor waits for it.
                                        std::lock_guard lock(aborts_mu_);
                                        if (--aborts_in_flight_ == 0) aborts_done_.notify_all();
                                      });
  }
}

void Router::fail_worker(Flow& f, int index, const Status& why, bool stalled) {
  // A stall (no token for the stall timeout, or the registry already saw it down) is evidence
  // enough; a failed call counts towards the registry's threshold.
  if (stalled) registry_.mark_down(index, why);
  else registry_.report_failure(index, why);
  (registry_.role(index) == worker::ROLE_PREFILL ? f.exclude_prefill : f.exclude_decode).push_back(index);
}

std::optional<Router::Attempt> Router::stalled_attempt(Flow& f) {
  std::string why;
  const int w = f.act->stalled(&why);
  if (w < 0 || f.act->stop != Active::kNone) return std::nullopt;
  Status s = absl::UnavailableError(why);
  fail_worker(f, w, s, /*stalled=*/true);
  return Attempt{s, true};
}

void Router::emit_output(Flow& f, const worker::WorkerEvent& ev) {
  v1::GenerateResponse r;
  r.set_request_id(f.id);
  r.mutable_token_ids()->CopyFrom(ev.token_ids());
  r.mutable_logprobs()->CopyFrom(ev.logprobs());
  r.set_text(ev.text());
  if (!f.sent_first) {
    for (int t : f.prompt) r.add_prompt_token_ids(t);
    r.mutable_prompt_logprobs()->Swap(&f.prompt_logprobs);
    f.sent_first = true;
    if (f.affinity->on_prompt_computed) f.affinity->on_prompt_computed({f.prefill_worker, f.decode_worker});
  }
  f.output.insert(f.output.end(), ev.token_ids().begin(), ev.token_ids().end());
  if (ev.token_ids_size() > 0 && f.first_token_s < 0) f.first_token_s = seconds(clock_.now() - f.arrival);
  if (!(*f.emit)(r)) f.act->cancel(Active::kClientGone);
}

void Router::forward(Flow& f, int worker, const worker::WorkerEvent& ev) {
  if (ev.token_ids_size() == 0 && ev.text().empty()) return;
  emit_output(f, ev);
  f.act->on_tokens(worker, ev.token_ids_size(), clock_.now());
}

worker::WorkerEvent Router::first_token_event(const Flow& f, const worker::PrefillResponse& prefill) const {
  worker::WorkerEvent ev;
  const int token = prefill.first_token();
  if (token < 0 || token >= model_.config.vocab_size) return ev;
  engine::StopChecker stop = stop_after_output(f);
  const int prev = f.output.empty() ? f.prompt.back() : f.output.back();
  const engine::StopStep step = stop.push(token, token_bytes(f, prev, token));
  if (!step.stop_token) {
    ev.add_token_ids(token);
    if (prefill.has_first_token_logprob()) *ev.add_logprobs() = prefill.first_token_logprob();
  }
  ev.set_text(step.delta);
  return ev;
}

Status Router::check_logprobs(const Flow& f, const std::string& from,
                              const google::protobuf::RepeatedPtrField<v1::TokenLogprob>& logprobs,
                              int tokens) const {
  // GenerateResponse.logprobs pairs with token_ids one to one: a worker that breaks the pairing
  // (an engine bug, or a worker that ignores the field) fails, rather than the client getting
  // log-probabilities of other tokens.
  const int want = f.sampling.has_logprobs() ? tokens : 0;
  if (logprobs.size() == want) return absl::OkStatus();
  return absl::InternalError(
      absl::StrCat(from, " sent ", logprobs.size(), " log-probabilities for ", tokens, " tokens (want ", want, ")"));
}

Status Router::check_prefill(const Flow& f, int p, const worker::PrefillResponse& r) const {
  const std::string from = absl::StrCat("Prefill on ", registry_.address(p));
  // A stop token (-1) is not output and has no log-probability.
  const bool want_first = f.sampling.has_logprobs() && r.first_token() >= 0;
  if (want_first != r.has_first_token_logprob())
    return absl::InternalError(absl::StrCat(from, (want_first ? " sent no" : " sent a"),
                                            " log-probability for its first token"));
  const v1::SamplingParams asked = f.placement_sampling();
  const int want_prompt = asked.has_prompt_logprobs() ? int(f.prompt.size()) - 1 : 0;
  if (r.prompt_logprobs_size() != want_prompt)
    return absl::InternalError(absl::StrCat(from, " sent ", r.prompt_logprobs_size(),
                                            " prompt log-probabilities (want ", want_prompt, ")"));
  return absl::OkStatus();
}

void Router::forward_first_token(Flow& f, const worker::PrefillResponse& prefill) {
  const worker::WorkerEvent ev = first_token_event(f, prefill);
  // Not progress of the placement's stream: the watchdog goes on watching every worker of the
  // placement until the decode worker streams.
  if (ev.token_ids_size() > 0 || !ev.text().empty()) emit_output(f, ev);
}

Status Router::read_stream(Flow& f, int decode_index, grpc::ClientContext& ctx, const worker::WorkerGenerateRequest& req) {
  auto reader = registry_.stub(decode_index)->Generate(&ctx, req);
  // An aggregated worker asked for them computes the prompt's log-probabilities (a decode
  // worker is never asked).
  const int want_prompt = req.sampling().has_prompt_logprobs() ? std::max(0, req.prompt_size() - 1) : 0;
  return read_events(f, decode_index, ctx, *reader, want_prompt);
}

Status Router::read_events(Flow& f, int decode_index, grpc::ClientContext& ctx,
                           grpc::ClientReaderInterface<worker::WorkerEvent>& reader, int want_prompt_logprobs) {
  const std::string from = absl::StrCat("Generate on ", registry_.address(decode_index));
  worker::WorkerEvent ev;
  Status bad;
  bool first = true;
  while (reader.Read(&ev)) {
    // After a broken event nothing more reaches the client: the call is cancelled and read to
    // its end so that it finishes cleanly (the request is then placed again).
    if (!bad.ok()) continue;
    bad = check_logprobs(f, from, ev.logprobs(), ev.token_ids_size());
    if (bad.ok() && first && ev.prompt_logprobs_size() != want_prompt_logprobs)
      bad = absl::InternalError(absl::StrCat(from, " sent ", ev.prompt_logprobs_size(),
                                             " prompt log-probabilities (want ", want_prompt_logprobs, ")"));
    first = false;
    if (!bad.ok()) {
      ctx.TryCancel();
      continue;
    }
    if (ev.prompt_logprobs_size() > 0 || ev.token_ids_size() > 0 || ev.finished())
      f.take_prompt_logprobs(ev.prompt_logprobs());
    if (ev.finished()) {
      f.final_event = ev;
      f.finished = true;
    } else {
      forward(f, decode_index, ev);
    }
  }
  Status s = from_grpc(reader.Finish(), absl::StrCat("Generate on ", registry_.address(decode_index)));
  if (!bad.ok()) {
    f.finished = false;
    return bad;
  }
  // A stream that delivered its final event is done, whatever its status says after.
  if (f.finished) return absl::OkStatus();
  if (s.ok()) s = absl::InternalError(absl::StrCat("Generate on ", registry_.address(decode_index), " ended without finishing"));
  return s;
}

Router::Attempt Router::pd_served(Flow& f, int p, int d, const worker::PrefillResponse& prefill) {
  registry_.report_success(p);
  registry_.report_success(d);
  f.prefill_s = prefill.prefill_s();
  f.cached_tokens = prefill.cached_tokens();
  f.kv_transfer_s = f.final_event.kv_transfer_s();
  f.decode_cached_tokens = f.final_event.decode_cached_tokens();
  f.transferred_blocks = f.final_event.transferred_blocks();
  // Whole blocks move (a prompt's last, partly filled one too): the payload of every layer.
  const auto info = registry_.info(d);
  f.transferred_bytes = uint64_t(f.transferred_blocks) * uint64_t(info ? info->block_size() : 0) * kv_bytes_per_token_;
  return {absl::OkStatus(), false};
}

Router::Attempt Router::no_pair(const Flow& f, const std::vector<WorkerLoad>& prefill) const {
  if (pick_prefill(prefill, f.exclude_prefill) < 0) return Attempt::unplaced(absl::UnavailableError("no prefill worker is up"));
  if (pick_decode(registry_.loads(worker::ROLE_DECODE), f.blocks_per_worker, f.exclude_decode) < 0)
    return Attempt::unplaced(absl::UnavailableError("no decode worker is up with room for this request"));
  return {absl::UnavailableError(
              "no up decode worker is KV-compatible with an up prefill worker (their --kv-compat labels or KV "
              "geometry differ)"),
          false};
}

engine::StopChecker Router::stop_after_output(const Flow& f) const {
  engine::SamplingParams p = engine_sampling(f.sampling);
  // The engine's cap: generation ends when the next token would need a position past the context.
  p.max_tokens = int(std::min<int64_t>(p.max_tokens, int64_t(model_.config.max_seq_len) + 1 - int64_t(f.prompt.size())));
  engine::StopChecker stop(p, model_.config.eos_ids);
  int prev = f.prompt.back();
  for (int t : f.output) {
    (void)stop.push(t, token_bytes(f, prev, t));
    prev = t;
  }
  return stop;
}

std::string Router::token_bytes(const Flow& f, int prev, int token) const {
  return model_.tokenizer->token_text(prev, token, !f.sampling.has_skip_special_tokens() || f.sampling.skip_special_tokens());
}

Status Router::run_placements(Flow& f) {
  const worker::Role role = options_.kv_mode == KvMode::kAggregated ? worker::ROLE_AGGREGATED : worker::ROLE_DECODE;
  Attempt a;
  const TimePoint wait_until = std::min(clock_.now() + options_.worker_wait, f.act->deadline);
  auto backoff = std::chrono::duration_cast<Duration>(std::chrono::milliseconds(20));
  while (true) {
    if (f.migrations > 0) {
      // The output so far may already end the request (the worker died after its last token but
      // before saying it finished): then there is nothing left to place.
      const engine::StopChecker stop = stop_after_output(f);
      if (stop.finished()) {
        f.final_event = worker::WorkerEvent();
        f.final_event.set_finished(true);
        f.final_event.set_finish_reason(std::string(engine::finish_reason_name(stop.finish_reason())));
        f.finished = true;
        return absl::OkStatus();
      }
      f.worker_id = absl::StrCat(f.act->id, "/m", f.migrations);
    }
    // The last placement's stall (if the watchdog ended it) must not cancel this one's calls.
    f.act->begin_attempt({}, clock_.now());
    f.placement_tokens = f.tokens();
    f.prompt_keys.emplace(f.placement_tokens, f.cache_salt);
    // Block size can differ per worker only if operators mix configurations; take the first known.
    f.blocks_per_worker = 0;
    for (const WorkerLoad& l : registry_.loads(role))
      if (auto info = registry_.info(l.index)) {
        f.blocks_per_worker = blocks_needed(int(f.placement_tokens.size()), f.placement_sampling().max_tokens(),
                                            model_.config.max_seq_len, info->block_size());
        break;
      }
    f.local_prefill = false;
    f.decode_cached_tokens = f.transferred_blocks = 0;
    f.transferred_bytes = 0;
    if (options_.kv_mode == KvMode::kAggregated) {
      a = run_aggregated(f);
    } else if (const int d = decode_local_worker(f); d >= 0) {
      a = run_decode_local(f, d);
    } else {
      a = options_.kv_mode == KvMode::kPush ? run_push(f) : run_pull(f);
    }
    if (a.no_worker && clock_.now() < wait_until) {
      // Wait for a worker to come (back) up; those that failed this request count again once
      // they are up.
      std::this_thread::sleep_for(backoff);
      backoff = std::min<Duration>(backoff * 2, std::chrono::milliseconds(500));
      std::erase_if(f.exclude_prefill, [&](int w) { return registry_.is_up(w); });
      std::erase_if(f.exclude_decode, [&](int w) { return registry_.is_up(w); });
      if (Status st = f.act->status(); !st.ok()) return st;
      continue;
    }
    if (a.status.ok() || !a.retryable) return a.status;
    if (f.migrations >= options_.max_migrations)
      return Status(a.status.code(), absl::StrCat("request ", f.id, " failed after ", f.migrations,
                                                  " migrations (the limit, --max-migrations): ", a.status.message()));
    ++f.migrations;
    metrics_.count_migration(!f.output.empty());
    PD_LOG_WARN("request {}: {}; migrating it ({} tokens streamed so far, migration {} of at most {})", f.id,
                std::string(a.status.message()), f.output.size(), f.migrations, options_.max_migrations);
  }
}

Status Router::generate(const v1::GenerateRequest& request, const std::function<bool()>& client_gone, const Emit& emit,
                        const std::string& client, const PromptAffinity& affinity) {
  const TimePoint arrival = clock_.now();
  // Every entry point comes here: the fields the client left unset take the model's defaults,
  // and the workers get explicit values.
  v1::GenerateRequest resolved = request;
  apply_sampling_defaults(sampling_defaults_proto(model_.config.generation_defaults), resolved.mutable_sampling());
  auto prompt = validate(resolved);
  if (!prompt.ok()) {
    metrics_.count_failure(absl::StatusCodeToString(prompt.status().code()));
    return prompt.status();
  }
  auto act = std::make_shared<Active>();
  const std::string client_id = request.request_id().empty() ? new_request_id() : request.request_id();
  act->id = client.empty() ? client_id : absl::StrCat(client, ":", client_id);
  act->timeout = options_.request_timeout;
  act->deadline = arrival + options_.request_timeout;
  act->client_gone = client_gone;
  {
    // Checked with the request's entry, so a drain that saw nothing in flight sees none later.
    std::lock_guard lock(active_mu_);
    if (draining_) {
      metrics_.count_failure(absl::StatusCodeToString(absl::StatusCode::kUnavailable));
      return absl::UnavailableError("the router is draining (shutting down): retry on another router");
    }
    if (!active_.emplace(act->id, act).second)
      return absl::AlreadyExistsError(absl::StrCat("request id '", client_id, "' is already running"));
  }
  struct Unregister {
    Router* r;
    Active* act;
    ~Unregister() {
      {
        std::lock_guard lock(r->active_mu_);
        r->active_.erase(act->id);
      }
      // The watchdog may still hold `act`; it must not probe the client after we return.
      act->end_probes();
    }
  } unregister{this, act.get()};
  // After the entry: an abort by the parent's id either found it or set the flag first.
  if (affinity.parent_aborted && affinity.parent_aborted()) act->cancel(Active::kAborted);

  Flow f;
  f.act = act.get();
  f.id = client_id;
  f.worker_id = act->id;
  f.prompt = std::move(*prompt);
  f.sampling = resolved.sampling();
  f.cache_salt = request.cache_salt();
  f.emit = &emit;
  f.affinity = &affinity;
  f.arrival = arrival;

  // An abort while queued still ends the stream with "abort", like one while placed.
  const Status admitted = admission_.acquire([&] { return act->status(); });
  if (!admitted.ok() && act->stop != Active::kAborted) {
    metrics_.count_failure(absl::StatusCodeToString(admitted.code()));
    return admitted;
  }
  AdmissionSlot slot(admitted.ok() ? &admission_ : nullptr);

  const Status placed = admitted.ok() ? run_placements(f) : admitted;

  const TimePoint end = clock_.now();
  const bool aborted = act->stop == Active::kAborted;
  if (!placed.ok() && !aborted) {
    metrics_.count_failure(absl::StatusCodeToString(placed.code()));
    return placed;
  }
  v1::GenerateResponse last;
  last.set_request_id(f.id);
  if (!aborted) {
    last.mutable_token_ids()->CopyFrom(f.final_event.token_ids());
    last.mutable_logprobs()->CopyFrom(f.final_event.logprobs());
    last.set_text(f.final_event.text());
    if (f.final_event.token_ids_size() > 0 && f.first_token_s < 0) f.first_token_s = seconds(end - arrival);
  }
  if (!f.sent_first) {
    for (int t : f.prompt) last.add_prompt_token_ids(t);
    last.mutable_prompt_logprobs()->Swap(&f.prompt_logprobs);
    // Its whole output came in the final message (a worker that coalesced its events): the
    // prompt is computed and cached all the same, so its siblings are still placed there.
    if (!aborted && !f.decode_worker.empty() && f.affinity->on_prompt_computed)
      f.affinity->on_prompt_computed({f.prefill_worker, f.decode_worker});
  }
  last.set_finished(true);
  const std::string reason = aborted ? "abort" : f.final_event.finish_reason();
  last.set_finish_reason(reason);
  v1::Timings* t = last.mutable_timings();
  t->set_queued_s(f.assigned ? f.queued_s : seconds(end - arrival));
  t->set_prefill_s(f.prefill_s);
  t->set_kv_transfer_s(f.kv_transfer_s);
  t->set_first_token_s(std::max(0.0, f.first_token_s));
  t->set_total_s(seconds(end - arrival));
  t->set_decode_cached_tokens(f.decode_cached_tokens);
  t->set_transferred_blocks(f.transferred_blocks);
  t->set_decode_local_prefill(f.local_prefill);
  last.set_prefill_worker(f.prefill_worker);
  last.set_decode_worker(f.decode_worker);
  last.set_migrations(f.migrations);
  last.set_cached_tokens(f.cached_tokens);
  emit(last);

  const int generated = int(f.output.size()) + (aborted ? 0 : f.final_event.token_ids_size());
  const double tpot = generated >= 2 ? (t->total_s() - t->first_token_s()) / (generated - 1) : -1;
  metrics_.observe_request(reason, f.first_token_s, tpot, t->total_s(), int(f.prompt.size()), generated);
  if (!aborted && options_.kv_mode != KvMode::kAggregated && !f.local_prefill && !f.decode_worker.empty())
    metrics_.observe_kv_transfer(f.prefill_worker, f.decode_worker, f.transferred_bytes, f.kv_transfer_s);
  return absl::OkStatus();
}

}  // namespace pdserve::router
