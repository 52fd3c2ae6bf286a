// The state of one request inside the router, shared by its flows (router/flow_*.cc), the
// watchdog and Abort: Router::Active is what outside threads may touch (stop reasons, the
// worker calls to cancel, the current placement's progress); Router::Flow is the request's own
// progress across placements (the output the client already has, the timings), touched only
// by the thread running the request; Router::Attempt is how one placement ended.
#pragma once

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "common/clock.h"
#include "engine/sampling/sampler.h"
#include "kvtransfer/fault.h"
#include "proto/engine_sampling.h"
#include "router/kv_routing.h"
#include "router/router.h"

namespace pdserve::router {

inline double seconds(Duration d) { return std::chrono::duration<double>(d).count(); }

// Whether a worker call's status says the worker (or the way to it) failed, not the request.
inline bool worker_failure(const Status& s) {
  return absl::IsUnavailable(s) || absl::IsInternal(s) || absl::IsUnknown(s) || absl::IsAborted(s) ||
         absl::IsDataLoss(s);
}

// Whether the worker answered that its failure was its KV peer's (kvtransfer/fault.h): then the
// peer, not this worker, is the one to mark down.
inline bool blames_peer(grpc::ClientContext& ctx) {
  const auto& md = ctx.GetServerTrailingMetadata();
  const auto it = md.find(std::string(kvtransfer::kFaultMetadataKey));
  return it != md.end() && std::string_view(it->second.data(), it->second.size()) == kvtransfer::kPeerFault;
}

// The load of worker `index` in `loads` (which holds it).
inline WorkerLoad load_of(const std::vector<WorkerLoad>& loads, int index) {
  for (const WorkerLoad& l : loads)
    if (l.index == index) return l;
  return {};
}

// The wall-clock deadline gRPC wants for `deadline` on `clock`.
inline std::chrono::system_clock::time_point grpc_deadline(const Clock& clock, TimePoint deadline) {
  return std::chrono::system_clock::now() +
         std::chrono::duration_cast<std::chrono::system_clock::duration>(deadline - clock.now());
}

// A placement's request on a decode-side (or aggregated) worker, counted in that worker's load
// (WorkerRegistry::note_assigned) from construction until the placement ends there, however it
// ends (note_request_done).
class AssignedTo {
 public:
  AssignedTo(WorkerRegistry& registry, int index, int blocks, int64_t prefill_tokens)
      : registry_(registry), index_(index), blocks_(blocks) {
    registry_.note_assigned(index, blocks, prefill_tokens);
  }
  ~AssignedTo() { registry_.note_request_done(index_, blocks_); }
  AssignedTo(const AssignedTo&) = delete;
  AssignedTo& operator=(const AssignedTo&) = delete;

 private:
  WorkerRegistry& registry_;
  const int index_, blocks_;
};

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
  // The current placement, for the watchdog: its workers (once tokens flow, only the one
  // streaming them), when it last made progress, its mean inter-token time, and why the
  // watchdog ended it (the worker at fault and the reason; -1 while it has not).
  std::vector<int> workers;
  int streaming_worker = -1;
  TimePoint last_progress{};
  int attempt_tokens = 0;
  Duration mean_itl{0};
  int stalled_worker = -1;
  // Counts placements (begin_attempt), so that the watchdog's verdict on one it looked at cannot
  // land on the next: it would cancel the new placement's first calls (its Reserve) as though
  // their worker had failed.
  uint64_t attempt = 0;
  std::string stalled_why;

  // Whether the client went away; false once generate() is returning.
  bool client_is_gone() {
    std::lock_guard lock(probe_mu);
    return !probes_ended && client_gone && client_gone();
  }
  void end_probes() {
    std::lock_guard lock(probe_mu);
    probes_ended = true;
  }
  // Stops the request for good: every worker call is cancelled and the request ends with `why`.
  void cancel(Stop why) {
    int expected = kNone;
    if (!stop.compare_exchange_strong(expected, why)) return;
    std::lock_guard lock(mu);
    for (grpc::ClientContext* c : contexts) c->TryCancel();
  }
  void add(grpc::ClientContext* c) {
    std::lock_guard lock(mu);
    contexts.push_back(c);
    if (stop != kNone || stalled_worker >= 0) c->TryCancel();
  }
  void remove(grpc::ClientContext* c) {
    std::lock_guard lock(mu);
    std::erase(contexts, c);
  }
  // A new placement on `placed` (streaming from the last of them) starts at `now`.
  void begin_attempt(std::vector<int> placed, TimePoint now) {
    std::lock_guard lock(mu);
    workers = std::move(placed);
    ++attempt;
    streaming_worker = -1;
    last_progress = now;
    attempt_tokens = 0;
    mean_itl = Duration(0);
    stalled_worker = -1;
    stalled_why.clear();
  }
  // Tokens arrived from `worker` at `now`: the placement depends on that worker alone now.
  void on_tokens(int worker, int n, TimePoint now) {
    std::lock_guard lock(mu);
    if (streaming_worker < 0)
      workers = {worker};
    else if (attempt_tokens > 0 && n > 0)
      mean_itl += ((now - last_progress) / n - mean_itl) / 8;  // EWMA, 1/8.
    streaming_worker = worker;
    attempt_tokens += n;
    last_progress = now;
  }
  // The watchdog ends placement `of_attempt` (not the request), if it is still the current one:
  // `worker` failed it, and the request is placed again.
  void stall(int worker, std::string why, uint64_t of_attempt) {
    std::lock_guard lock(mu);
    if (stalled_worker >= 0 || of_attempt != attempt) return;
    stalled_worker = worker;
    stalled_why = std::move(why);
    for (grpc::ClientContext* c : contexts) c->TryCancel();
  }
  // The worker the watchdog blamed for the current placement and why; -1 if it did not.
  int stalled(std::string* why) {
    std::lock_guard lock(mu);
    if (why != nullptr) *why = stalled_why;
    return stalled_worker;
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

struct Router::Flow {
  Active* act = nullptr;
  std::string id;         // The client's request id.
  std::string worker_id;  // The id the workers see (differs per placement, so no stale state collides).
  std::vector<int> prompt;
  v1::SamplingParams sampling;  // As the client sent them.
  std::string cache_salt;       // GenerateRequest.cache_salt: the prefix-cache namespace.
  // Tokens the client already has. A placement after a mid-stream failure prefills prompt +
  // output and decodes the rest (engine::GenerationRequest::resumed_tokens).
  std::vector<int> output;
  // sampling.prompt_logprobs set: the prompt's, from the placement that computed them (the
  // prefill side's PrefillResponse, or an aggregated worker's first event), held until the
  // client's first message carries them.
  google::protobuf::RepeatedPtrField<v1::TokenLogprob> prompt_logprobs;
  // Whether a placement computed them: a later one (a migration) is not asked again.
  bool prompt_logprobs_done = false;
  int migrations = 0;  // Placements after the first.
  int blocks_per_worker = 0;
  const Emit* emit = nullptr;
  const PromptAffinity* affinity = nullptr;
  TimePoint arrival;
  bool assigned = false;
  bool sent_first = false;
  double first_token_s = -1;
  worker::WorkerEvent final_event;
  bool finished = false;
  double prefill_s = 0, kv_transfer_s = 0;
  int cached_tokens = 0;  // GenerateResponse.cached_tokens.
  int decode_cached_tokens = 0, transferred_blocks = 0;  // Timings' (the decode worker's final event).
  uint64_t transferred_bytes = 0;  // transferred_blocks × the decode worker's block size × KV bytes a token.
  std::string prefill_worker, decode_worker;
  double queued_s = 0;
  // Workers that failed this request: not tried again for it.
  std::vector<int> exclude_prefill, exclude_decode;
  // The current placement's prompt (tokens()) and its block keys, set once per placement.
  std::vector<int> placement_tokens;
  std::optional<KvRouting::PromptKeys> prompt_keys;
  bool local_prefill = false;  // The decode worker prefilled the placement itself (no transfer).

  void assign(const Clock& clock) {
    if (!assigned) queued_s = seconds(clock.now() - arrival);
    assigned = true;
  }
  // The placement's prompt: the client's prompt, then the output it already has.
  std::vector<int> tokens() const {
    std::vector<int> t = prompt;
    t.insert(t.end(), output.begin(), output.end());
    return t;
  }
  // The placement's sampling parameters (engine::GenerationRequest::resumed_tokens): max_tokens
  // counts what is still to generate; min_tokens, like the frequency and presence penalties,
  // all of the output, the resumed tokens included, so it stays — or is 0 once the output
  // already reached it. The prompt's log-probabilities are asked for only until a placement
  // computed them (with output in the prompt they would be over other tokens anyway).
  v1::SamplingParams placement_sampling() const {
    v1::SamplingParams s = sampling;
    const int streamed = int(output.size());
    s.set_max_tokens(s.max_tokens() - streamed);
    if (streamed >= s.min_tokens()) s.set_min_tokens(0);
    if (prompt_logprobs_done || streamed > 0) s.clear_prompt_logprobs();
    return s;
  }
  // A placement's prompt log-probabilities (empty for a one-token prompt, or when not asked).
  void take_prompt_logprobs(const google::protobuf::RepeatedPtrField<v1::TokenLogprob>& lps) {
    if (!lps.empty()) prompt_logprobs = lps;
    prompt_logprobs_done = true;
  }
  // Fills what every worker request of this placement carries.
  template <typename WorkerRequest>
  void fill(WorkerRequest& r) const {
    r.set_request_id(worker_id);
    for (int t : prompt) r.add_prompt(t);
    for (int t : output) r.add_prompt(t);
    *r.mutable_sampling() = placement_sampling();
    r.set_resumed_tokens(int(output.size()));
    r.set_cache_salt(cache_salt);
  }
  // The same for a P/D placement's decode side, which is never asked for the prompt's
  // log-probabilities: the prefill side computed them.
  void fill_decode(worker::WorkerGenerateRequest& r) const {
    fill(r);
    r.mutable_sampling()->clear_prompt_logprobs();
  }
};

struct Router::Attempt {
  Status status;
  bool retryable = false;  // A worker failed (or stalled): place the request again.
  // No worker could take the request (none up, none with room, none pairable): it is placed
  // again once one can, within RouterOptions::worker_wait.
  bool no_worker = false;
  static Attempt unplaced(Status why) { return {std::move(why), false, true}; }
};

}  // namespace pdserve::router
