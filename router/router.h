// Request orchestration: validates a client request, admits it through the bounded queue,
// places it on workers and drives them — aggregated (one worker's Generate), push (decode
// Reserve, then prefill Prefill towards the reserved blocks while the decode stream is already
// open) or pull (Prefill holding the KV, then decode Generate reading it) — and streams the
// tokens back with per-request timings. When a worker dies, fails or stalls, the request is
// migrated: placed again with the output the client already has as part of its prompt, and its
// stream goes on as if nothing happened. Both the gRPC and the HTTP front ends call it.
// The flows live in router/flow_*.cc, the request state in router/request_state.h.
#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/clock.h"
#include "common/status.h"
#include "engine/model_config.h"
#include "engine/tokenizer.h"
#include "engine/sampling/stop_checker.h"
#include "engine/tokenizer/chat_template.h"
#include "proto/grpc_status.h"
#include "proto/pdserve.pb.h"
#include "proto/worker.grpc.pb.h"
#include "router/admission_queue.h"
#include "router/kv_mode.h"
#include "router/metrics.h"
#include "router/prompt_affinity.h"
#include "router/worker_registry.h"

namespace pdserve::router {

// How the router chooses workers: kCache weighs the workers' cached prefixes (from their KV
// events) against their load (CacheTerms); kLoad goes by load alone.
enum class Placement { kCache, kLoad };

struct RouterOptions {
  KvMode kv_mode = KvMode::kPush;
  int max_running = 64;          // Requests out at the workers at once.
  int max_waiting = 256;         // Requests waiting for a slot; more are refused ("overloaded").
  Duration request_timeout = std::chrono::seconds(600);
  Duration worker_rpc_timeout = std::chrono::seconds(10);  // Reserve and Abort calls.
  // Placements after the first for a request whose workers fail, die or stall (before or after
  // its first token); past it the request fails with the last worker error.
  int max_migrations = 3;
  // A placement streaming tokens is given up (and the request migrated) when no token came for
  // max(stall_timeout, 50 x its mean inter-token time, 50 x its worker's mean step time, 4 x the
  // expected length of the worker's step in progress: see WorkerRegistry::Watch), or at once
  // when a worker it depends on is down (failed RPCs, failed polls, no heartbeats: a SIGSTOPped
  // worker).
  Duration stall_timeout = std::chrono::seconds(5);
  // How long a request waits for a worker when none can take it (all down — being restarted —
  // or full) before it fails UNAVAILABLE; workers that failed it are tried again once they are
  // back up (the registry probes a down worker again after its back-off).
  Duration worker_wait = std::chrono::seconds(30);
  // How workers are chosen (--placement): kCache needs a KvRouting (docs/router.md, "Placement").
  Placement placement = Placement::kCache;
  double transfer_weight = 1.0;  // tau: a block to transfer, in prefill-block equivalents.
  // Decode-local prefill (P/D modes): a request whose prompt the chosen decode worker's cache
  // lacks at most this many tokens of is prefilled by that decode worker itself — no prefill
  // worker, no transfer (short follow-up turns, short prompts); 0: every prompt is prefilled on
  // a prefill worker. The programs default to 512 (pdserve-router and `pdserve up`
  // --local-prefill-tokens); a Router built in process places as it is told.
  int local_prefill_tokens = 0;
};

class KvRouting;

// The model the router serves: enough to tokenize prompts and check them against the limits.
struct ServedModel {
  std::string name;
  std::vector<std::string> aliases;  // Other accepted `model` values (e.g. the path given).
  std::shared_ptr<const engine::Tokenizer> tokenizer;
  engine::ModelConfig config;
  // The router renders chat prompts itself, with the format of the model it loaded (the same
  // files as the workers', whose Worker.Info reports theirs).
  engine::ChatTemplate chat_template = engine::ChatTemplate::plain("no model loaded");
};

class Router {
 public:
  // Receives each response of a request in order; returns false once the client is gone.
  using Emit = std::function<bool(const v1::GenerateResponse&)>;

  // `kv` (may be null: placement by load) tells where prompts are cached; it outlives the router.
  Router(const RouterOptions& options, ServedModel model, WorkerRegistry& registry, RouterMetrics& metrics,
         const Clock& clock, KvRouting* kv = nullptr);
  ~Router();

  // Runs one request to its end, streaming through `emit`; the returned status is the one the
  // client sees. `client_gone` is polled to notice a cancelled client and stop the workers.
  // `client` names who sent it (its API key's tag; empty without keys): request ids live in the
  // client's namespace, so one client can neither abort nor collide with another's requests.
  // `affinity` places it where a sibling sample computed its prompt, and reports where this
  // one's was computed (router/prompt_affinity.h).
  Status generate(const v1::GenerateRequest& request, const std::function<bool()>& client_gone, const Emit& emit,
                  const std::string& client = "", const PromptAffinity& affinity = {});
  // Aborts `client`'s running request by id: its workers free it and its stream ends with "abort".
  bool abort(const std::string& request_id, const std::string& client = "");
  // Checks a request and returns its prompt tokens: InvalidArgument for a missing or too long
  // prompt, token ids outside the vocabulary or bad sampling values; NotFound for another model.
  StatusOr<std::vector<int>> validate(const v1::GenerateRequest& request) const;

  v1::ModelInfo model_info() const;
  // Whether requests can be served now: a worker of every role the mode needs is up.
  bool ready() const;
  const ServedModel& model() const { return model_; }
  // The workers' prefix caches as the router sees them (null without KV events).
  const KvRouting* kv_routing() const { return kv_; }
  // The Prometheus exposition of the router and its workers.
  std::string metrics_text() const;
  int running() const { return admission_.running(); }
  int waiting() const { return admission_.waiting(); }
  // Draining (SIGTERM): new requests are refused with UNAVAILABLE (a client retries on another
  // router replica) and ready() turns false; requests already in go on.
  void set_draining() {
    std::lock_guard lock(active_mu_);
    draining_ = true;
  }
  // Requests between arrival and their end (queued at the router or out at the workers).
  int in_flight() const;
  // Aborts every request in flight (the drain's end): each stream ends with "abort".
  void abort_all();

 private:
  struct Active;
  struct Flow;
  struct Attempt;
  // One placement of a request in each mode (router/flow_aggregated.cc, flow_push.cc, flow_pull.cc).
  Attempt run_aggregated(Flow& f);
  Attempt run_push(Flow& f);
  Attempt run_pull(Flow& f);
  // P/D modes: the decode worker that would take `f` (by its cache and load) when it lacks at
  // most RouterOptions::local_prefill_tokens of its prompt; -1: prefill on a prefill worker.
  int decode_local_worker(const Flow& f) const;
  // A P/D placement where decode worker `d` prefills the request itself (kv_mode "local").
  Attempt run_decode_local(Flow& f, int d);
  // A placement on worker `w` alone, which prefills and decodes (aggregated, or decode-local).
  Attempt run_on_one(Flow& f, int w);
  // Places the request until it ends, migrating it when a placement's workers fail.
  Status run_placements(Flow& f);
  // A P/D placement on prefill worker `p` and decode worker `d` that streamed to its end: both
  // served it, and its timings are kept.
  Attempt pd_served(Flow& f, int p, int d, const worker::PrefillResponse& prefill);
  // A P/D placement's prefill worker: chosen by load (and cache, with cache placement) among the
  // prefill workers and noted (WorkerRegistry::note_chosen); index -1: none.
  struct PrefillChoice {
    int index = -1;
    std::vector<WorkerLoad> loads;    // The prefill workers', cached_blocks set by cache_terms.
    std::optional<CacheTerms> terms;  // cache_terms' (nullopt: placement by load).
    WorkerLoad load;                  // The chosen one's.
    const CacheTerms* terms_or_null() const { return terms ? &*terms : nullptr; }
  };
  PrefillChoice choose_prefill(const Flow& f);
  // A P/D placement's decode worker for the chosen prefill worker: chosen by load (and cache,
  // with cache placement) among the decode workers that pair with it, and noted with it; -1: none.
  int choose_decode(const Flow& f, const PrefillChoice& prefill);
  // Why no prefill worker was chosen for a P/D request: none up or none with room (waited
  // for), or up workers that may not pair (a configuration error: no wait).
  Attempt no_pair(const Flow& f, const std::vector<WorkerLoad>& prefill) const;
  // Opens a worker's Generate stream and reads it (read_events).
  Status read_stream(Flow& f, int decode_index, grpc::ClientContext& ctx, const worker::WorkerGenerateRequest& req);
  // Reads an open Generate stream (call `ctx`) of worker `decode_index` to its end, forwarding
  // its events; its first event must carry `want_prompt_logprobs` prompt log-probabilities. A
  // broken event cancels the call: the request is placed again at once.
  Status read_events(Flow& f, int decode_index, grpc::ClientContext& ctx,
                     grpc::ClientReaderInterface<worker::WorkerEvent>& reader, int want_prompt_logprobs = 0);
  // Forwards one non-final event of the worker streaming the request to the client.
  void forward(Flow& f, int worker, const worker::WorkerEvent& ev);
  // The event for the first token a prefill worker answered (P/D): its text through the stop
  // rules after the output so far, as the decode worker's engine counts it; no token for a
  // stop token (or -1); its log-probability with it (PrefillResponse.first_token_logprob).
  worker::WorkerEvent first_token_event(const Flow& f, const worker::PrefillResponse& prefill) const;
  // Streams that event before any decode event (WorkerGenerateRequest.first_token_streamed).
  void forward_first_token(Flow& f, const worker::PrefillResponse& prefill);
  // Internal unless prefill worker `p`'s answer has the log-probabilities the placement asked
  // for: the first token's (unless it is a stop token), one per prompt token after the first.
  Status check_prefill(const Flow& f, int p, const worker::PrefillResponse& prefill) const;
  // Internal (naming `from`) unless a message's `tokens` come with one log-probability each
  // when the request asked for them, and with none otherwise.
  Status check_logprobs(const Flow& f, const std::string& from,
                        const google::protobuf::RepeatedPtrField<v1::TokenLogprob>& logprobs, int tokens) const;
  // Sends an event's tokens and text to the client (cancelling the request if it is gone).
  void emit_output(Flow& f, const worker::WorkerEvent& ev);
  // Counts a failure of worker `index` (down after a few in a row) and keeps it out of this
  // request's placements.
  void fail_worker(Flow& f, int index, const Status& why, bool stalled = false);
  // The placement the watchdog gave up on (a stalled or down worker), as a failure of that
  // worker; nullopt when the watchdog did not.
  std::optional<Attempt> stalled_attempt(Flow& f);
  // Best-effort Worker.Abort of `worker_request_id` on each worker, without waiting for answers.
  void abort_on_workers(const std::string& worker_request_id, const std::vector<int>& workers);
  // The stop rules fed with the output the client already has (what a resumed worker replays).
  engine::StopChecker stop_after_output(const Flow& f) const;
  // The bytes a worker's stop rules get for `token` after `prev` (engine::Tokenizer::token_text,
  // as the engine's).
  std::string token_bytes(const Flow& f, int prev, int token) const;
  void watchdog_loop();
  // The watchdog's look at one request's placement: gives it up when a worker it depends on is
  // down or its stream stalled. `watched` is the registry's watch() of this tick.
  void watch_placement(Active& a, TimePoint now, const std::vector<WorkerRegistry::Watch>& watched);
  std::string new_request_id();
  // The index of `f`'s preferred prefill or decode worker among `loads` (-1: none, or gone).
  int preferred(const Flow& f, const std::vector<WorkerLoad>& loads, bool prefill) const;
  // With cache placement: sets each load's cached_blocks for `f`'s prompt and returns the
  // terms to place by; nullopt (placement by load) without it.
  std::optional<CacheTerms> cache_terms(const Flow& f, std::vector<WorkerLoad>& loads) const;
  // After dispatching `f` to `worker`: its prompt's blocks are predicted there.
  void predict_cached(const Flow& f, int worker);
  // Peer tier: the worker whose host tier holds more of the prompt than the prefill worker
  // `prefill` has (when it reads from peers), for it to read first. Asked before predicting the
  // prompt on `prefill` (predict_cached), which would credit it with the whole prompt.
  std::optional<worker::PrefixSource> prefix_source(const Flow& f, int prefill) const;

  const RouterOptions options_;
  const ServedModel model_;
  WorkerRegistry& registry_;
  RouterMetrics& metrics_;
  const Clock& clock_;
  KvRouting* const kv_;
  mutable AdmissionQueue admission_;
  uint64_t kv_bytes_per_token_ = 0;

  std::atomic<bool> draining_{false};
  mutable std::mutex active_mu_;
  std::map<std::string, std::shared_ptr<Active>> active_;
  std::atomic<uint64_t> next_id_{0};
  const std::string id_prefix_;

  std::mutex watchdog_mu_;
  std::condition_variable watchdog_cv_;
  bool stopping_ = false;
  std::thread watchdog_;

  // Worker.Abort calls in flight; the destructor waits for them. Each call's ClientContext holds
  // its channel, and a channel's last reference dropped on gRPC's callback thread tears down the
  // completion queue that thread drains (libgrpc 1.51: a double free). The registry, which
  // outlives the router, holds every channel while these wait.
  std::mutex aborts_mu_;
  std::condition_variable aborts_done_;
  int aborts_in_flight_ = 0;
};

}  // namespace pdserve::router
