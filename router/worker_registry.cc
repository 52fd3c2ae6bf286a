#include "router/worker_registry.h"

#include <algorithm>

#include <grpcpp/grpcpp.h>

#include "common/logging.h"

namespace pdserve::router {

std::string role_name(worker::Role role) {
  switch (role) {
    case worker::ROLE_PREFILL: return "prefill";
    case worker::ROLE_DECODE: return "decode";
    case worker::ROLE_AGGREGATED: return "aggregated";
    default: return "unspecified";
  }
}

std::unique_ptr<worker::Worker::Stub> WorkerRegistry::make_stub(const std::string& address) const {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(options_.max_message_bytes);
  args.SetMaxSendMessageSize(options_.max_message_bytes);
  // Reconnect quickly after a worker restarts instead of gRPC's default back-off of up to 2 min.
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  if (!options_.tls_server_name.empty()) args.SetSslTargetNameOverride(options_.tls_server_name);
  return worker::Worker::NewStub(grpc::CreateCustomChannel(address, options_.credentials, args));
}

WorkerRegistry::WorkerRegistry(std::vector<Endpoint> endpoints, const RegistryOptions& options, const Clock& clock)
    : options_(options), clock_(clock) {
  for (Endpoint& e : endpoints) {
    auto w = std::make_unique<Worker>();
    w->stub = make_stub(e.address);
    w->endpoint = std::move(e);
    workers_.push_back(std::move(w));
  }
}

WorkerRegistry::~WorkerRegistry() { stop(); }

void WorkerRegistry::LoadNotes::forget(const LoadNotes& sent) {
  const auto less = [](auto& now, auto then) { now = std::max<std::decay_t<decltype(now)>>(now - then, 0); };
  less(assigned_requests, sent.assigned_requests);
  less(assigned_blocks, sent.assigned_blocks);
  less(assigned_prefill_tokens, sent.assigned_prefill_tokens);
  less(done_requests, sent.done_requests);
  less(done_blocks, sent.done_blocks);
  less(done_prefill_tokens, sent.done_prefill_tokens);
}

void WorkerRegistry::apply_poll(int index, const Status& status, const worker::WorkerInfo& info,
                                const LoadNotes& sent) {
  std::lock_guard lock(mu_);
  Worker& w = *workers_[index];
  if (!w.listed) return;  // Expired while the poll was out.
  const bool was_up = w.up;
  const TimePoint now = clock_.now();
  Status s = status;
  if (s.ok() && w.endpoint.role != worker::ROLE_UNSPECIFIED && info.role() != w.endpoint.role)
    s = absl::FailedPreconditionError(absl::StrCat("configured as ", role_name(w.endpoint.role), " but serves ",
                                                   role_name(info.role())));
  w.ever_polled = true;
  if (s.ok()) {
    w.up = true;
    // Steps since the last poll (the first: since the engine started; none when a restart at
    // a static address began its counts again).
    if (info.steps_total() > w.info.steps_total() && info.step_seconds_total() >= w.info.step_seconds_total()) {
      const double seconds = info.step_seconds_total() - w.info.step_seconds_total();
      w.step_time = std::chrono::round<Duration>(
          std::chrono::duration<double>(seconds / double(info.steps_total() - w.info.steps_total())));
      const uint64_t tokens = info.step_tokens_total() - std::min(info.step_tokens_total(), w.info.step_tokens_total());
      w.token_seconds = tokens > 0 ? seconds / double(tokens) : 0;
    }
    // Also when this poll saw no step end (the long step is running): the latest rate stands.
    // Capped at the worker's own step size, so that a wild value cannot overflow a Duration.
    const int64_t cap = info.max_batch_tokens() > 0 ? info.max_batch_tokens() : int64_t{1} << 20;
    w.step_in_progress = std::chrono::round<Duration>(std::chrono::duration<double>(
        w.token_seconds * double(std::clamp<int64_t>(info.step_tokens_in_progress(), 0, cap))));
    w.info = info;
    // What was sent or ended after the poll went out is not in its Info: kept.
    w.notes.forget(sent);
    w.next_poll = now + options_.poll_interval;
    if (listener_) listener_->on_worker_info(w.endpoint.address, info);
    if (!was_up) PD_LOG_INFO("worker {} ({}) is up: {} blocks of {} tokens", w.endpoint.address,
                             role_name(info.role()), info.num_blocks(), info.block_size());
  } else {
    w.up = false;
    w.next_poll = now + options_.retry_interval;
    if (was_up || !w.ever_polled) PD_LOG_WARN("worker {} is down: {}", w.endpoint.address, std::string(s.message()));
  }
}

void WorkerRegistry::poll_once() {
  struct Call {
    int index;
    worker::Worker::Stub* stub;
    grpc::ClientContext ctx;
    worker::InfoRequest request;
    worker::WorkerInfo info;
    grpc::Status status;
    LoadNotes sent;
  };
  std::vector<std::unique_ptr<Call>> calls;
  {
    std::lock_guard lock(mu_);
    const TimePoint now = clock_.now();
    for (size_t i = 0; i < workers_.size(); ++i) {
      const Worker& w = *workers_[i];
      if (!w.listed || (w.ever_polled && w.next_poll > now)) continue;
      auto c = std::make_unique<Call>();
      c->index = int(i);
      c->stub = w.stub.get();
      c->sent = w.notes;
      c->ctx.set_deadline(std::chrono::system_clock::now() + options_.rpc_timeout);
      calls.push_back(std::move(c));
    }
  }
  // All polls go out at once, so one slow worker does not delay the others' health.
  std::mutex done_mu;
  std::condition_variable done_cv;
  size_t done = 0;
  for (auto& c : calls) {
    Call* call = c.get();
    call->stub->async()->Info(&call->ctx, &call->request, &call->info,
                                               [&, call](grpc::Status s) {
                                                 call->status = std::move(s);
                                                 std::lock_guard l(done_mu);
                                                 ++done;
                                                 done_cv.notify_all();
                                               });
  }
  {
    std::unique_lock l(done_mu);
    done_cv.wait(l, [&] { return done == calls.size(); });
  }
  for (auto& c : calls) {
    const Status s = c->status.ok() ? absl::OkStatus()
                                    : absl::UnavailableError(absl::StrCat("Info: ", c->status.error_message()));
    apply_poll(c->index, s, c->info, c->sent);
  }
}

void WorkerRegistry::set_listener(WorkerInfoListener* listener) {
  std::lock_guard lock(mu_);
  listener_ = listener;
}

void WorkerRegistry::start() {
  std::lock_guard lock(mu_);
  if (poller_.joinable()) return;
  stopping_ = false;
  poller_ = std::thread([this] { poll_loop(); });
}

void WorkerRegistry::stop() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (poller_.joinable()) poller_.join();
}

void WorkerRegistry::poll_loop() {
  while (true) {
    expire();
    poll_once();
    std::unique_lock lock(mu_);
    // Real time here: this paces the loop; which workers are due is decided on clock_.
    if (cv_.wait_for(lock, std::chrono::milliseconds(50), [this] { return stopping_ || poll_now_; }) && stopping_)
      return;
    poll_now_ = false;
  }
}

std::vector<WorkerLoad> WorkerRegistry::loads(worker::Role role, int producer) const {
  std::lock_guard lock(mu_);
  std::vector<WorkerLoad> out;
  for (size_t i = 0; i < workers_.size(); ++i) {
    const Worker& w = *workers_[i];
    if (!w.listed || w.endpoint.role != role) continue;
    WorkerLoad l;
    l.index = int(i);
    l.up = w.up;
    l.num_blocks = w.info.num_blocks();
    const LoadNotes& n = w.notes;
    l.free_blocks = std::min(w.info.free_blocks() - n.assigned_blocks + n.done_blocks, w.info.num_blocks());
    l.running = std::max(w.info.running() + n.assigned_requests - n.done_requests, 0);
    l.waiting = w.info.waiting();
    l.queued_prefill_tokens =
        std::max<int64_t>(w.info.queued_prefill_tokens() + n.assigned_prefill_tokens - n.done_prefill_tokens, 0);
    l.tp = w.info.tp();
    l.compat_hash = w.info.compat_hash();
    l.kv_compat = w.info.kv_compat();
    l.block_size = w.info.block_size();
    l.last_chosen = w.last_chosen;
    if (auto it = w.chosen_with.find(producer); producer >= 0 && it != w.chosen_with.end()) l.last_paired = it->second;
    out.push_back(l);
  }
  return out;
}

bool WorkerRegistry::has_role(worker::Role role) const {
  std::lock_guard lock(mu_);
  for (const auto& w : workers_)
    if (w->listed && w->endpoint.role == role) return true;
  return false;
}

worker::Worker::Stub* WorkerRegistry::stub(int index) const {
  std::lock_guard lock(mu_);
  return workers_[index]->stub.get();
}

const std::string& WorkerRegistry::address(int index) const {
  std::lock_guard lock(mu_);
  return workers_[index]->endpoint.address;  // Never changes for a slot.
}

std::optional<worker::WorkerInfo> WorkerRegistry::info(int index) const {
  std::lock_guard lock(mu_);
  const Worker& w = *workers_[index];
  if (!w.ever_polled || w.info.block_size() <= 0) return std::nullopt;
  return w.info;
}

void WorkerRegistry::note_chosen(int index, int producer) {
  std::lock_guard lock(mu_);
  Worker& w = *workers_[index];
  w.last_chosen = ++choices_;
  if (producer >= 0) w.chosen_with[producer] = choices_;
}

void WorkerRegistry::note_assigned(int index, int blocks, int64_t prefill_tokens) {
  std::lock_guard lock(mu_);
  Worker& w = *workers_[index];
  ++w.notes.assigned_requests;
  w.notes.assigned_blocks += blocks;
  w.notes.assigned_prefill_tokens += prefill_tokens;
}

worker::Role WorkerRegistry::role(int index) const {
  std::lock_guard lock(mu_);
  return workers_[index]->endpoint.role;
}

std::vector<WorkerRegistry::Watch> WorkerRegistry::watch() const {
  std::lock_guard lock(mu_);
  std::vector<Watch> out;
  out.reserve(workers_.size());
  for (const auto& w : workers_)
    out.push_back({!w->up && !w->leaving, w->step_time, w->listed ? w->step_in_progress : Duration{0}});
  return out;
}

bool WorkerRegistry::is_up(int index) const {
  std::lock_guard lock(mu_);
  const Worker& w = *workers_[index];
  return w.listed && w.up;
}

bool WorkerRegistry::report_failure(int index, const Status& why) {
  {
    std::lock_guard lock(mu_);
    Worker& w = *workers_[index];
    if (++w.consecutive_failures < options_.failure_threshold) {
      PD_LOG_WARN("worker {}: a request failed ({} in a row; down at {}): {}", w.endpoint.address,
                  w.consecutive_failures, options_.failure_threshold, std::string(why.message()));
      return !w.up;
    }
  }
  mark_down(index, why);
  return true;
}

void WorkerRegistry::note_prefill_done(int index, int64_t prefill_tokens) {
  std::lock_guard lock(mu_);
  workers_[index]->notes.done_prefill_tokens += prefill_tokens;
  ++workers_[index]->notes.done_requests;
}

void WorkerRegistry::note_request_done(int index, int blocks) {
  std::lock_guard lock(mu_);
  Worker& w = *workers_[index];
  ++w.notes.done_requests;
  w.notes.done_blocks += blocks;
}

void WorkerRegistry::report_success(int index) {
  std::lock_guard lock(mu_);
  workers_[index]->consecutive_failures = 0;
}

void WorkerRegistry::mark_down(int index, const Status& why) {
  std::lock_guard lock(mu_);
  Worker& w = *workers_[index];
  if (w.up) PD_LOG_WARN("worker {} marked down: {}", w.endpoint.address, std::string(why.message()));
  w.up = false;
  w.leaving = false;  // A draining worker that fails has failed.
  w.consecutive_failures = 0;
  w.next_poll = clock_.now() + options_.retry_interval;
}

std::vector<WorkerGauges> WorkerRegistry::gauges() const {
  std::lock_guard lock(mu_);
  std::vector<WorkerGauges> out;
  for (const auto& wp : workers_) {
    const Worker& w = *wp;
    if (!w.listed) continue;
    WorkerGauges g;
    g.worker = w.endpoint.address;
    g.role = role_name(w.endpoint.role);
    g.up = w.up;
    g.num_blocks = w.info.num_blocks();
    g.free_blocks = w.info.free_blocks();
    g.running = w.info.running();
    g.waiting = w.info.waiting();
    g.queued_prefill_tokens = w.info.queued_prefill_tokens();
    g.backend = w.info.backend();
    g.kv_memory = w.info.kv_memory();
    g.kv_staged_to_host_bytes = w.info.kv_staged_to_host_bytes();
    g.kv_staged_to_device_bytes = w.info.kv_staged_to_device_bytes();
    g.kv_transfer_requests = w.info.kv_transfer_requests();
    g.kv_transfer_bytes = w.info.kv_transfer_bytes();
    g.kv_transfer_failures = w.info.kv_transfer_failures();
    g.kv_transfer_leases_expired = w.info.kv_transfer_leases_expired();
    g.kv_transfer_refused = w.info.kv_transfer_refused();
    g.kv_transfer_seconds = w.info.kv_transfer_seconds();
    g.preemptions = w.info.preemptions_total();
    g.host_copies = w.info.host_copies_total();
    g.host_copy_fallbacks = w.info.host_copy_fallbacks_total();
    g.transfer_held_block_seconds = w.info.transfer_held_block_seconds_total();
    auto tier = [](bool present, const worker::KvTierStats& t) {
      return WorkerGauges::Tier{present,
                                t.blocks(),
                                t.free_blocks(),
                                t.cached_blocks(),
                                t.hit_tokens_total(),
                                t.stored_blocks_total(),
                                t.loaded_blocks_total(),
                                t.bytes(),
                                t.dropped_blocks_total(),
                                t.evicted_blocks_total(),
                                t.corrupt_files_total(),
                                t.load_seconds_total(),
                                t.load_timeouts_total(),
                                t.pending_loads_total(),
                                t.failed_loads_total(),
                                t.stale_loads_total(),
                                t.leases_total(),
                                t.leased_blocks_total()};
    };
    g.host = tier(w.info.has_host_tier(), w.info.host_tier());
    g.disk = tier(w.info.has_disk_tier(), w.info.disk_tier());
    g.peer = tier(w.info.has_peer_tier(), w.info.peer_tier());
    out.push_back(g);
  }
  return out;
}

WorkerRegistry::Worker* WorkerRegistry::find(const std::string& address) {
  for (auto& w : workers_)
    if (w->endpoint.address == address) return w.get();
  return nullptr;
}

Status WorkerRegistry::register_worker(const Endpoint& endpoint, const std::string& worker_id) {
  if (endpoint.address.empty()) return absl::InvalidArgumentError("a registering worker must give its address");
  if (endpoint.role == worker::ROLE_UNSPECIFIED) return absl::InvalidArgumentError("a registering worker must give its role");
  {
    std::lock_guard lock(mu_);
    const TimePoint now = clock_.now();
    Worker* w = find(endpoint.address);
    if (w && !w->registered) {
      if (w->endpoint.role != endpoint.role)
        return absl::FailedPreconditionError(absl::StrCat(endpoint.address, " is configured as ",
                                                          role_name(w->endpoint.role), ", not ",
                                                          role_name(endpoint.role)));
      return absl::OkStatus();  // A static worker: listed for good already.
    }
    if (!w) {
      const auto registered = std::count_if(workers_.begin(), workers_.end(), [](const auto& x) { return x->registered; });
      if (registered >= options_.max_registered)
        return absl::ResourceExhaustedError(absl::StrCat("the registry is full (", options_.max_registered,
                                                         " registered addresses)"));
      workers_.push_back(std::make_unique<Worker>());
      w = workers_.back().get();
      w->endpoint.address = endpoint.address;
      w->stub = make_stub(endpoint.address);
      w->registered = true;
      w->listed = false;
    }
    const bool fresh = !w->listed || w->endpoint.role != endpoint.role || w->worker_id != worker_id;
    if (fresh) {
      // A new worker (or a restarted one at the same address): forget what the slot knew.
      w->endpoint.role = endpoint.role;
      w->worker_id = worker_id;
      w->listed = true;
      w->up = false;
      w->leaving = false;
      w->ever_polled = false;
      w->info.Clear();
      w->notes = {};
      w->last_chosen = 0;
      w->chosen_with.clear();
      w->step_time = Duration{0};
      w->token_seconds = 0;
      w->step_in_progress = Duration{0};
      PD_LOG_INFO("worker {} ({}, {}) registered", endpoint.address, role_name(endpoint.role), worker_id);
    }
    w->last_heartbeat = now;
    if (fresh) poll_now_ = true;
  }
  cv_.notify_all();
  return absl::OkStatus();
}

bool WorkerRegistry::heartbeat(const std::string& address) {
  std::lock_guard lock(mu_);
  Worker* w = find(address);
  if (!w || !w->listed) return false;
  if (w->registered) w->last_heartbeat = clock_.now();
  return true;
}

bool WorkerRegistry::deregister(const std::string& address) {
  std::lock_guard lock(mu_);
  Worker* w = find(address);
  if (!w || !w->registered || !w->listed) return false;
  w->listed = false;
  w->up = false;
  w->leaving = true;
  if (listener_) listener_->on_worker_removed(address);
  PD_LOG_INFO("worker {} deregistered", address);
  return true;
}

std::vector<std::string> WorkerRegistry::expire() {
  std::lock_guard lock(mu_);
  const TimePoint now = clock_.now();
  std::vector<std::string> out;
  for (auto& w : workers_) {
    if (!w->registered || !w->listed || now - w->last_heartbeat <= options_.heartbeat_timeout) continue;
    w->listed = false;
    w->up = false;
    PD_LOG_WARN("worker {} ({}) dropped: no heartbeat for {} ms", w->endpoint.address, role_name(w->endpoint.role),
                std::chrono::duration_cast<std::chrono::milliseconds>(now - w->last_heartbeat).count());
    if (listener_) listener_->on_worker_removed(w->endpoint.address);
    out.push_back(w->endpoint.address);
  }
  return out;
}

std::vector<WorkerRegistry::Endpoint> WorkerRegistry::listed() const {
  std::lock_guard lock(mu_);
  std::vector<Endpoint> out;
  for (const auto& w : workers_)
    if (w->listed) out.push_back(w->endpoint);
  return out;
}

}  // namespace pdserve::router
