#include "router/router.h"

#include "kvtransfer/fault.h"

#include <grpcpp/grpcpp.h>

#include <random>

#include "common/logging.h"
#include "engine/sampling/sampler.h"
#include "engine/sampling/stop_checker.h"
#include "router/policy.h"

namespace pdserve::router {
namespace {

// Limits on client-controlled request fields (Router::validate).
constexpr int kMaxStopStrings = 16;
constexpr size_t kMaxStopStringBytes = 256;
constexpr int kMaxStopTokenIds = 256;
// No token of a real vocabulary spans more bytes, so a longer text cannot fit the context.
constexpr size_t kMaxBytesPerToken = 256;

// The load of worker `index` in `loads` (which holds it).
WorkerLoad load_of(const std::vector<WorkerLoad>& loads, int index) {
  for (const WorkerLoad& l : loads)
    if (l.index == index) return l;
  return {};
}

double seconds(Duration d) { return std::chrono::duration<double>(d).count(); }

std::chrono::system_clock::time_point grpc_deadline(const Clock& clock, TimePoint deadline) {
  return std::chrono::system_clock::now() +
         std::chrono::duration_cast<std::chrono::system_clock::duration>(deadline - clock.now());
}

// Whether the worker answered that its failure was its KV peer's (kvtransfer/fault.h): then the
// peer, not this worker, is the one to mark down.
bool blames_peer(grpc::ClientContext& ctx) {
  const auto& md = ctx.GetServerTrailingMetadata();
  const auto it = md.find(std::string(kvtransfer::kFaultMetadataKey));
  return it != md.end() && std::string_view(it->second.data(), it->second.size()) == kvtransfer::kPeerFault;
}

bool worker_failure(const Status& s) {
  // Errors that say the worker (or the way to it) failed, not the request.
  return absl::IsUnavailable(s) || absl::IsInternal(s) || absl::IsUnknown(s) || absl::IsAborted(s) ||
         absl::IsDataLoss(s);
}

engine::SamplingParams to_engine(const v1::SamplingParams& s) {
  engine::SamplingParams p;
  p.temperature = s.temperature();
  p.top_k = s.top_k();
  p.top_p = s.has_top_p() ? s.top_p() : 1.0f;
  p.seed = s.has_seed() ? s.seed() : -1;
  p.max_tokens = s.max_tokens();
  p.stop_token_ids.assign(s.stop_token_ids().begin(), s.stop_token_ids().end());
  p.stop_strings.assign(s.stop().begin(), s.stop().end());
  p.ignore_eos = s.ignore_eos();
  return p;
}

}  // namespace

grpc::Status to_grpc(const Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

Status from_grpc(const grpc::Status& s, const std::string& what) {
  if (s.ok()) return absl::OkStatus();
  return Status(static_cast<absl::StatusCode>(s.error_code()), absl::StrCat(what, ": ", s.error_message()));
}

// A request in flight: what the watchdog and Abort need to stop it.
struct Router::Active {
  enum Stop { kNone = 0, kClientGone, kAborted, kDeadline };
  std::string id;
  TimePoint deadline;
  Duration timeout;
  std::function<bool()> client_gone;
  std::atomic<int> stop{kNone};
  // client_gone reads the front end's per-call state (the gRPC ServerContext, the HTTP sink),
  // which dies when generate() returns: the watchdog asks it only under probe_mu, and
  // generate() sets probes_ended under the same lock before it returns.
  std::mutex probe_mu;
  bool probes_ended = false;
  std::mutex mu;
  std::vector<grpc::ClientContext*> contexts;  // Worker calls to cancel when stopped.

  // Whether the client went away; false once generate() is returning.
  bool client_is_gone() {
    std::lock_guard lock(probe_mu);
    return !probes_ended && client_gone && client_gone();
  }
  void end_probes() {
    std::lock_guard lock(probe_mu);
    probes_ended = true;
  }
  void cancel(Stop why) {
    int expected = kNone;
    if (!stop.compare_exchange_strong(expected, why)) return;
    std::lock_guard lock(mu);
    for (grpc::ClientContext* c : contexts) c->TryCancel();
  }
  void add(grpc::ClientContext* c) {
    std::lock_guard lock(mu);
    contexts.push_back(c);
    if (stop != kNone) c->TryCancel();
  }
  void remove(grpc::ClientContext* c) {
    std::lock_guard lock(mu);
    std::erase(contexts, c);
  }
  Status status() const {
    switch (stop.load()) {
      case kClientGone: return absl::CancelledError("the client cancelled the request");
      case kAborted: return absl::CancelledError("aborted");
      case kDeadline:
        return absl::DeadlineExceededError(absl::StrCat("request timed out after ", seconds(timeout), " s"));
      default: return absl::OkStatus();
    }
  }
};

// One request's progress across attempts.
struct Router::Flow {
  Active* act = nullptr;
  std::string id;         // The client's request id.
  std::string worker_id;  // The id the workers see (differs per retry, so no stale state collides).
  std::vector<int> prompt;
  v1::SamplingParams sampling;
  int blocks_per_worker = 0;
  const Emit* emit = nullptr;
  TimePoint arrival;
  bool assigned = false;
  bool emitted_tokens = false;
  bool sent_first = false;
  int generated = 0;
  double first_token_s = -1;
  worker::WorkerEvent final_event;
  bool finished = false;
  double prefill_s = 0, kv_transfer_s = 0;
  std::string prefill_worker, decode_worker;
  double queued_s = 0;

  void assign(const Clock& clock) {
    if (!assigned) queued_s = seconds(clock.now() - arrival);
    assigned = true;
  }
};

// How one placement attempt ended.
struct Router::Attempt {
  Status status;
  bool retryable = false;  // A worker failed before the client saw a token: place it again.
};

Router::Router(const RouterOptions& options, ServedModel model, WorkerRegistry& registry, RouterMetrics& metrics,
               const Clock& clock)
    : options_(options),
      model_(std::move(model)),
      registry_(registry),
      metrics_(metrics),
      clock_(clock),
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
}

void Router::watchdog_loop() {
  std::unique_lock lock(watchdog_mu_);
  while (!watchdog_cv_.wait_for(lock, std::chrono::milliseconds(20), [this] { return stopping_; })) {
    std::vector<std::shared_ptr<Active>> active;
    {
      std::lock_guard l(active_mu_);
      for (auto& [id, a] : active_) active.push_back(a);
    }
    const TimePoint now = clock_.now();
    for (auto& a : active) {
      if (a->client_is_gone()) a->cancel(Active::kClientGone);
      else if (now >= a->deadline) a->cancel(Active::kDeadline);
    }
  }
}

std::string Router::new_request_id() { return absl::StrCat("req-", id_prefix_, "-", next_id_++); }

v1::ModelInfo Router::model_info() const {
  v1::ModelInfo m;
  m.set_name(model_.name);
  m.set_vocab_size(model_.config.vocab_size);
  m.set_max_context(model_.config.max_seq_len);
  m.set_bos_id(model_.config.bos_id);
  for (int e : model_.config.eos_ids) m.add_eos_ids(e);
  m.set_kv_mode(options_.kv_mode);
  m.set_chat_format(engine::chat_format_name(model_.chat_format));
  int ranks = 0;
  for (worker::Role role : {worker::ROLE_AGGREGATED, worker::ROLE_PREFILL, worker::ROLE_DECODE}) {
    for (const WorkerLoad& l : registry_.loads(role)) ranks += l.up ? l.tp : 0;
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
  if (options_.kv_mode == "aggregated") return any_up(worker::ROLE_AGGREGATED);
  return any_up(worker::ROLE_PREFILL) && any_up(worker::ROLE_DECODE);
}

std::string Router::metrics_text() const {
  return metrics_.render(admission_.running(), admission_.waiting(), registry_.gauges());
}

StatusOr<std::vector<int>> Router::validate(const v1::GenerateRequest& r) const {
  if (!r.model().empty() && r.model() != model_.name &&
      std::find(model_.aliases.begin(), model_.aliases.end(), r.model()) == model_.aliases.end())
    return absl::NotFoundError(absl::StrCat("model '", r.model(), "' is not served here; this router serves '",
                                            model_.name, "'"));
  if (r.request_id().size() > 256) return absl::InvalidArgumentError("request_id is longer than 256 bytes");
  const v1::SamplingParams& s = r.sampling();
  // Limits on what a client controls, checked before any work: stop rules are checked on every
  // token, and tokenizing is paid for the whole text.
  if (s.stop_size() > kMaxStopStrings)
    return absl::InvalidArgumentError(absl::StrCat("sampling.stop: at most ", kMaxStopStrings, " stop strings (got ",
                                                   s.stop_size(), ")"));
  for (const std::string& stop : s.stop())
    if (stop.size() > kMaxStopStringBytes)
      return absl::InvalidArgumentError(absl::StrCat("sampling.stop: a stop string is longer than ", kMaxStopStringBytes,
                                                     " bytes"));
  if (s.stop_token_ids_size() > kMaxStopTokenIds)
    return absl::InvalidArgumentError(absl::StrCat("sampling.stop_token_ids: at most ", kMaxStopTokenIds, " ids (got ",
                                                   s.stop_token_ids_size(), ")"));
  const size_t max_prompt_bytes = size_t(model_.config.max_seq_len) * kMaxBytesPerToken;
  if (r.prompt_case() == v1::GenerateRequest::kText && r.text().size() > max_prompt_bytes)
    return absl::InvalidArgumentError(absl::StrCat("prompt text of ", r.text().size(), " bytes cannot fit the context of ",
                                                   model_.config.max_seq_len, " tokens (at most ", max_prompt_bytes,
                                                   " bytes)"));
  if (r.prompt_case() == v1::GenerateRequest::kTokenIds && r.token_ids().ids_size() > model_.config.max_seq_len)
    return absl::InvalidArgumentError(absl::StrCat("prompt of ", r.token_ids().ids_size(),
                                                   " tokens is longer than the model's context of ",
                                                   model_.config.max_seq_len, " tokens"));
  if (s.max_tokens() <= 0)
    return absl::InvalidArgumentError(absl::StrCat("sampling.max_tokens must be > 0 (got ", s.max_tokens(), ")"));
  const engine::SamplingParams p = to_engine(s);
  if (Status st = p.validate(); !st.ok()) return absl::InvalidArgumentError(absl::StrCat("sampling: ", st.message()));
  const int vocab = model_.config.vocab_size;
  for (int t : p.stop_token_ids)
    if (t >= vocab)
      return absl::InvalidArgumentError(absl::StrCat("sampling.stop_token_ids: ", t, " is outside the vocabulary [0, ", vocab, ")"));

  std::vector<int> prompt;
  switch (r.prompt_case()) {
    case v1::GenerateRequest::kText: {
      auto enc = model_.tokenizer->encode(r.text(), /*add_bos=*/true);
      if (!enc.ok()) return absl::InvalidArgumentError(absl::StrCat("prompt text: ", enc.status().message()));
      prompt = std::move(*enc);
      if (prompt.empty()) return absl::InvalidArgumentError("the prompt encodes to no tokens (the model has no BOS)");
      break;
    }
    case v1::GenerateRequest::kTokenIds:
      prompt.assign(r.token_ids().ids().begin(), r.token_ids().ids().end());
      if (prompt.empty()) return absl::InvalidArgumentError("prompt token_ids is empty");
      for (int t : prompt)
        if (t < 0 || t >= vocab)
          return absl::InvalidArgumentError(absl::StrCat("prompt token id ", t, " is outside the vocabulary [0, ", vocab, ")"));
      break;
    default:
      return absl::InvalidArgumentError("no prompt: set text or token_ids");
  }
  if (int64_t(prompt.size()) > model_.config.max_seq_len)
    return absl::InvalidArgumentError(absl::StrCat("prompt of ", prompt.size(), " tokens is longer than the model's context of ",
                                                   model_.config.max_seq_len, " tokens"));
  return prompt;
}

bool Router::abort(const std::string& request_id) {
  std::shared_ptr<Active> a;
  {
    std::lock_guard lock(active_mu_);
    auto it = active_.find(request_id);
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
  for (int w : workers) {
    if (w < 0) continue;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
    worker::WorkerAbortRequest req;
    req.set_request_id(worker_request_id);
    worker::WorkerAbortResponse resp;
    grpc::Status s = registry_.stub(w)->Abort(&ctx, req, &resp);
    if (!s.ok()) PD_LOG_DEBUG("Abort {} on {}: {}", worker_request_id, registry_.address(w), s.error_message());
  }
}

void Router::forward(Flow& f, const worker::WorkerEvent& ev) {
  if (ev.token_ids_size() == 0 && ev.text().empty()) return;
  v1::GenerateResponse r;
  r.set_request_id(f.id);
  r.mutable_token_ids()->CopyFrom(ev.token_ids());
  r.set_text(ev.text());
  if (!f.sent_first) {
    for (int t : f.prompt) r.add_prompt_token_ids(t);
    f.sent_first = true;
  }
  f.generated += ev.token_ids_size();
  if (ev.token_ids_size() > 0 && f.first_token_s < 0) f.first_token_s = seconds(clock_.now() - f.arrival);
  f.emitted_tokens = true;
  if (!(*f.emit)(r)) f.act->cancel(Active::kClientGone);
}

Status Router::read_stream(Flow& f, int decode_index, grpc::ClientContext& ctx, const worker::WorkerGenerateRequest& req) {
  auto reader = registry_.stub(decode_index)->Generate(&ctx, req);
  worker::WorkerEvent ev;
  while (reader->Read(&ev)) {
    if (ev.finished()) {
      f.final_event = ev;
      f.finished = true;
    } else {
      forward(f, ev);
    }
  }
  Status s = from_grpc(reader->Finish(), absl::StrCat("Generate on ", registry_.address(decode_index)));
  if (s.ok() && !f.finished) s = absl::InternalError(absl::StrCat("Generate on ", registry_.address(decode_index), " ended without finishing"));
  return s;
}

// Why no prefill worker was chosen for a P/D request: none up, no decode worker up with room,
// or none of the up decode workers may take KV from an up prefill worker.
Status Router::no_pair(const std::vector<WorkerLoad>& prefill, const std::vector<int>& exclude_prefill,
                       const std::vector<int>& exclude_decode, int blocks_needed) const {
  if (pick_prefill(prefill, exclude_prefill) < 0) return absl::UnavailableError("no prefill worker is up");
  if (pick_decode(registry_.loads(worker::ROLE_DECODE), blocks_needed, exclude_decode) < 0)
    return absl::UnavailableError("no decode worker is up with room for this request");
  return absl::UnavailableError(
      "no up decode worker is KV-compatible with an up prefill worker (their --kv-compat labels or KV geometry "
      "differ)");
}

Router::Attempt Router::run_aggregated(Flow& f, std::vector<int>& exclude) {
  const auto loads = registry_.loads(worker::ROLE_AGGREGATED);
  const int w = pick_decode(loads, f.blocks_per_worker, exclude);
  if (w < 0) return {absl::UnavailableError("no aggregated worker is up with room for this request"), false};
  f.assign(clock_);
  registry_.note_assigned(w, f.blocks_per_worker, int64_t(f.prompt.size()));
  f.decode_worker = f.prefill_worker = registry_.address(w);
  worker::WorkerGenerateRequest req;
  req.set_request_id(f.worker_id);
  for (int t : f.prompt) req.add_prompt(t);
  *req.mutable_sampling() = f.sampling;
  grpc::ClientContext ctx;
  ctx.set_deadline(grpc_deadline(clock_, f.act->deadline));
  f.act->add(&ctx);
  Status s = read_stream(f, w, ctx, req);
  f.act->remove(&ctx);
  if (s.ok()) {
    f.prefill_s = f.final_event.prefill_s();
    return {absl::OkStatus(), false};
  }
  if (f.act->stop == Active::kNone && worker_failure(s)) {
    registry_.mark_down(w, s);
    exclude.push_back(w);
    return {s, !f.emitted_tokens};
  }
  abort_on_workers(f.worker_id, {w});
  if (Status st = f.act->status(); !st.ok()) return {st, false};
  return {s, false};
}

Router::Attempt Router::run_push(Flow& f, std::vector<int>& exclude_prefill, std::vector<int>& exclude_decode) {
  // The prefill worker is chosen first: the decode side binds the transfer to its producer
  // group (TP and endpoints) at Reserve time, before any write can arrive.
  const std::vector<WorkerLoad> prefill_loads = registry_.loads(worker::ROLE_PREFILL);
  const int p = pick_prefill(prefill_loads, exclude_prefill, registry_.loads(worker::ROLE_DECODE), f.blocks_per_worker,
                             exclude_decode);
  if (p < 0) return {no_pair(prefill_loads, exclude_prefill, exclude_decode, f.blocks_per_worker), false};
  const WorkerLoad producer_load = load_of(prefill_loads, p);
  const std::optional<worker::WorkerInfo> producer = registry_.info(p);
  // Reserve on a decode worker; a full one is retried (its requests free blocks as they end).
  int d = -1;
  worker::ReserveResponse reserved;
  while (true) {
    if (Status s = f.act->status(); !s.ok()) return {s, false};
    d = pick_decode(registry_.loads(worker::ROLE_DECODE), f.blocks_per_worker, exclude_decode, &producer_load);
    if (d < 0) return {absl::UnavailableError("no decode worker is up with room for this request"), false};
    grpc::ClientContext ctx;
    ctx.set_deadline(std::min(grpc_deadline(clock_, f.act->deadline),
                              std::chrono::system_clock::now() + options_.worker_rpc_timeout));
    f.act->add(&ctx);
    worker::ReserveRequest req;
    req.set_request_id(f.worker_id);
    req.set_num_tokens(int(std::min<int64_t>(int64_t(f.prompt.size()) + f.sampling.max_tokens(), model_.config.max_seq_len)));
    req.set_prompt_len(int(f.prompt.size()));
    req.set_producer_tp(producer ? producer->tp() : 1);
    if (producer) req.set_kv_producer(producer->kv_endpoint());
    Status s = from_grpc(registry_.stub(d)->Reserve(&ctx, req, &reserved), absl::StrCat("Reserve on ", registry_.address(d)));
    f.act->remove(&ctx);
    if (s.ok()) break;
    if (Status st = f.act->status(); !st.ok()) return {st, false};
    if (absl::IsResourceExhausted(s)) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      continue;
    }
    if (worker_failure(s)) {
      registry_.mark_down(d, s);
      exclude_decode.push_back(d);
      return {s, true};
    }
    return {s, false};
  }
  registry_.note_assigned(d, f.blocks_per_worker, 0);
  f.assign(clock_);
  registry_.note_assigned(p, 0, int64_t(f.prompt.size()));
  f.prefill_worker = registry_.address(p);
  f.decode_worker = registry_.address(d);

  worker::PrefillRequest preq;
  preq.set_request_id(f.worker_id);
  for (int t : f.prompt) preq.add_prompt(t);
  *preq.mutable_sampling() = f.sampling;
  preq.set_kv_mode("push");
  preq.set_kv_target(reserved.kv_target());
  preq.mutable_target_blocks()->CopyFrom(reserved.block_ids());

  worker::WorkerGenerateRequest dreq;
  dreq.set_request_id(f.worker_id);
  for (int t : f.prompt) dreq.add_prompt(t);
  *dreq.mutable_sampling() = f.sampling;
  dreq.set_kv_mode("push");
  dreq.mutable_reserved_blocks()->CopyFrom(reserved.block_ids());

  grpc::ClientContext dctx;
  dctx.set_deadline(grpc_deadline(clock_, f.act->deadline));
  f.act->add(&dctx);
  // The prefill runs beside the decode stream: the decode side starts as soon as the KV is
  // sealed, without waiting for the prefill reply to travel back through the router.
  worker::PrefillResponse presp;
  Status prefill_status;
  grpc::ClientContext pctx;
  pctx.set_deadline(grpc_deadline(clock_, f.act->deadline));
  f.act->add(&pctx);
  std::thread prefill([&] {
    prefill_status = from_grpc(registry_.stub(p)->Prefill(&pctx, preq, &presp), absl::StrCat("Prefill on ", registry_.address(p)));
    if (!prefill_status.ok()) dctx.TryCancel();  // The decode side would wait for KV that never comes.
  });
  Status ds = read_stream(f, d, dctx, dreq);
  if (!ds.ok()) pctx.TryCancel();  // Nobody is left to receive the KV.
  prefill.join();
  f.act->remove(&pctx);
  f.act->remove(&dctx);

  if (ds.ok()) {
    f.prefill_s = prefill_status.ok() ? presp.prefill_s() : f.final_event.prefill_s();
    f.kv_transfer_s = prefill_status.ok() && presp.kv_transfer_s() > 0 ? presp.kv_transfer_s() : f.final_event.kv_transfer_s();
    return {absl::OkStatus(), false};
  }
  abort_on_workers(f.worker_id, {d, p});
  if (Status st = f.act->status(); !st.ok()) return {st, false};
  // Both sides fail when one dies; the survivor says its peer was at fault. The prefill RPC ended
  // before the decode stream's cancellation could be mistaken for its cause, so judge it first.
  const bool prefill_blames_decode = !prefill_status.ok() && blames_peer(pctx);
  const bool prefill_at_fault = !prefill_status.ok() && worker_failure(prefill_status) && !prefill_blames_decode;
  const bool decode_at_fault =
      prefill_blames_decode || (!prefill_at_fault && !ds.ok() && worker_failure(ds) && !blames_peer(dctx));
  const bool decode_blames_prefill = !prefill_at_fault && !ds.ok() && blames_peer(dctx);
  if (prefill_at_fault || decode_blames_prefill) {
    registry_.mark_down(p, prefill_status.ok() ? ds : prefill_status);
    exclude_prefill.push_back(p);
    return {prefill_status.ok() ? ds : prefill_status, !f.emitted_tokens};
  }
  if (decode_at_fault) {
    const Status why = ds.ok() || absl::IsCancelled(ds) ? prefill_status : ds;
    registry_.mark_down(d, why);
    exclude_decode.push_back(d);
    return {why, !f.emitted_tokens};
  }
  if (!prefill_status.ok()) {
    exclude_prefill.push_back(p);
    return {prefill_status, false};
  }
  return {ds, false};
}

Router::Attempt Router::run_pull(Flow& f, std::vector<int>& exclude_prefill, std::vector<int>& exclude_decode) {
  const std::vector<WorkerLoad> prefill_loads = registry_.loads(worker::ROLE_PREFILL);
  const int p = pick_prefill(prefill_loads, exclude_prefill, registry_.loads(worker::ROLE_DECODE), f.blocks_per_worker,
                             exclude_decode);
  if (p < 0) return {no_pair(prefill_loads, exclude_prefill, exclude_decode, f.blocks_per_worker), false};
  const WorkerLoad producer_load = load_of(prefill_loads, p);
  f.assign(clock_);
  registry_.note_assigned(p, 0, int64_t(f.prompt.size()));
  worker::PrefillRequest preq;
  preq.set_request_id(f.worker_id);
  for (int t : f.prompt) preq.add_prompt(t);
  *preq.mutable_sampling() = f.sampling;
  preq.set_kv_mode("pull");
  worker::PrefillResponse presp;
  {
    grpc::ClientContext pctx;
    pctx.set_deadline(grpc_deadline(clock_, f.act->deadline));
    f.act->add(&pctx);
    Status s = from_grpc(registry_.stub(p)->Prefill(&pctx, preq, &presp), absl::StrCat("Prefill on ", registry_.address(p)));
    f.act->remove(&pctx);
    if (!s.ok()) {
      if (Status st = f.act->status(); !st.ok()) {
        abort_on_workers(f.worker_id, {p});
        return {st, false};
      }
      if (worker_failure(s)) {
        registry_.mark_down(p, s);
        exclude_prefill.push_back(p);
        return {s, true};
      }
      return {s, false};
    }
  }
  f.prefill_worker = registry_.address(p);
  if (!presp.finish_reason().empty()) {
    // The first token ended the request: there is nothing for a decode worker to do. Its text
    // goes through the same stop rules the workers apply.
    abort_on_workers(f.worker_id, {p});
    worker::WorkerEvent& ev = f.final_event;
    ev.set_finished(true);
    ev.set_finish_reason(presp.finish_reason());
    const int token = presp.first_token();
    if (token >= 0 && token < model_.config.vocab_size) {
      engine::StopChecker stop(to_engine(f.sampling), model_.config.eos_ids);
      const engine::StopStep step = stop.push(token, model_.tokenizer->decode_token(f.prompt.back(), token));
      if (!step.stop_token) {
        ev.add_token_ids(token);
        ev.set_text(step.delta);
      }
    }
    f.finished = true;
    f.prefill_s = presp.prefill_s();
    return {absl::OkStatus(), false};
  }
  const int d = pick_decode(registry_.loads(worker::ROLE_DECODE), f.blocks_per_worker, exclude_decode, &producer_load);
  if (d < 0) {
    abort_on_workers(f.worker_id, {p});
    return {absl::UnavailableError("no decode worker is up with room for this request"), false};
  }
  registry_.note_assigned(d, f.blocks_per_worker, 0);
  f.decode_worker = registry_.address(d);
  worker::WorkerGenerateRequest dreq;
  dreq.set_request_id(f.worker_id);
  for (int t : f.prompt) dreq.add_prompt(t);
  *dreq.mutable_sampling() = f.sampling;
  dreq.set_kv_mode("pull");
  dreq.set_kv_source(presp.kv_source());
  dreq.set_first_token(presp.first_token());
  grpc::ClientContext dctx;
  dctx.set_deadline(grpc_deadline(clock_, f.act->deadline));
  f.act->add(&dctx);
  Status ds = read_stream(f, d, dctx, dreq);
  f.act->remove(&dctx);
  if (ds.ok()) {
    f.prefill_s = presp.prefill_s();
    f.kv_transfer_s = f.final_event.kv_transfer_s();
    return {absl::OkStatus(), false};
  }
  abort_on_workers(f.worker_id, {d, p});
  if (Status st = f.act->status(); !st.ok()) return {st, false};
  if (!ds.ok() && blames_peer(dctx)) {
    // The decode side could not read the held KV: the prefill worker (or its data path) failed.
    registry_.mark_down(p, ds);
    exclude_prefill.push_back(p);
    return {ds, !f.emitted_tokens};
  }
  if (worker_failure(ds)) {
    registry_.mark_down(d, ds);
    exclude_decode.push_back(d);
    return {ds, !f.emitted_tokens};
  }
  return {ds, false};
}

Status Router::generate(const v1::GenerateRequest& request, const std::function<bool()>& client_gone, const Emit& emit) {
  const TimePoint arrival = clock_.now();
  auto prompt = validate(request);
  if (!prompt.ok()) {
    metrics_.count_failure(absl::StatusCodeToString(prompt.status().code()));
    return prompt.status();
  }
  auto act = std::make_shared<Active>();
  act->id = request.request_id().empty() ? new_request_id() : request.request_id();
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
      return absl::AlreadyExistsError(absl::StrCat("request id '", act->id, "' is already running"));
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

  Flow f;
  f.act = act.get();
  f.id = f.worker_id = act->id;
  f.prompt = std::move(*prompt);
  f.sampling = request.sampling();
  f.emit = &emit;
  f.arrival = arrival;

  Status s = admission_.acquire([&] { return act->status(); });
  if (!s.ok()) {
    metrics_.count_failure(absl::StatusCodeToString(s.code()));
    return s;
  }
  AdmissionSlot slot(&admission_);

  std::vector<int> exclude_prefill, exclude_decode;
  Attempt a;
  for (int attempt = 0; attempt < std::max(1, options_.max_attempts); ++attempt) {
    if (attempt > 0) {
      f.worker_id = absl::StrCat(act->id, "/retry", attempt);
      PD_LOG_WARN("request {}: {}; placing it again", act->id, std::string(a.status.message()));
    }
    // Block size can differ per worker only if operators mix configurations; take the first known.
    const worker::Role role = options_.kv_mode == "aggregated" ? worker::ROLE_AGGREGATED : worker::ROLE_DECODE;
    f.blocks_per_worker = 0;
    for (const WorkerLoad& l : registry_.loads(role))
      if (auto info = registry_.info(l.index)) {
        f.blocks_per_worker = blocks_needed(int(f.prompt.size()), f.sampling.max_tokens(), model_.config.max_seq_len, info->block_size());
        break;
      }
    if (options_.kv_mode == "aggregated") a = run_aggregated(f, exclude_decode);
    else if (options_.kv_mode == "pull") a = run_pull(f, exclude_prefill, exclude_decode);
    else a = run_push(f, exclude_prefill, exclude_decode);
    if (a.status.ok() || !a.retryable) break;
  }

  const TimePoint end = clock_.now();
  const bool aborted = act->stop == Active::kAborted;
  if (!a.status.ok() && !aborted) {
    metrics_.count_failure(absl::StatusCodeToString(a.status.code()));
    return a.status;
  }
  v1::GenerateResponse last;
  last.set_request_id(f.id);
  if (!aborted) {
    last.mutable_token_ids()->CopyFrom(f.final_event.token_ids());
    last.set_text(f.final_event.text());
    f.generated += f.final_event.token_ids_size();
    if (f.final_event.token_ids_size() > 0 && f.first_token_s < 0) f.first_token_s = seconds(end - arrival);
  }
  if (!f.sent_first)
    for (int t : f.prompt) last.add_prompt_token_ids(t);
  last.set_finished(true);
  const std::string reason = aborted ? "abort" : f.final_event.finish_reason();
  last.set_finish_reason(reason);
  v1::Timings* t = last.mutable_timings();
  t->set_queued_s(f.assigned ? f.queued_s : seconds(end - arrival));
  t->set_prefill_s(f.prefill_s);
  t->set_kv_transfer_s(f.kv_transfer_s);
  t->set_first_token_s(std::max(0.0, f.first_token_s));
  t->set_total_s(seconds(end - arrival));
  last.set_prefill_worker(f.prefill_worker);
  last.set_decode_worker(f.decode_worker);
  emit(last);

  const double tpot = f.generated >= 2 ? (t->total_s() - t->first_token_s()) / (f.generated - 1) : -1;
  metrics_.observe_request(reason, f.first_token_s, tpot, t->total_s(), int(f.prompt.size()), f.generated);
  if (!aborted && options_.kv_mode != "aggregated" && !f.decode_worker.empty())
    metrics_.observe_kv_transfer(f.prefill_worker, f.decode_worker, kv_bytes_per_token_ * f.prompt.size(), f.kv_transfer_s);
  return absl::OkStatus();
}

}  // namespace pdserve::router
