#include "router/worker_registry.h"

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

WorkerRegistry::WorkerRegistry(std::vector<Endpoint> endpoints, const RegistryOptions& options, const Clock& clock)
    : options_(options), clock_(clock) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(options.max_message_bytes);
  args.SetMaxSendMessageSize(options.max_message_bytes);
  // Reconnect quickly after a worker restarts instead of gRPC's default back-off of up to 2 min.
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  for (Endpoint& e : endpoints) {
    Worker w;
    w.stub = worker::Worker::NewStub(grpc::CreateCustomChannel(e.address, grpc::InsecureChannelCredentials(), args));
    w.endpoint = std::move(e);
    workers_.push_back(std::move(w));
  }
}

WorkerRegistry::~WorkerRegistry() { stop(); }

void WorkerRegistry::apply_poll(int index, const Status& status, const worker::WorkerInfo& info) {
  std::lock_guard lock(mu_);
  Worker& w = workers_[index];
  const bool was_up = w.up;
  const TimePoint now = clock_.now();
  Status s = status;
  if (s.ok() && w.endpoint.role != worker::ROLE_UNSPECIFIED && info.role() != w.endpoint.role)
    s = absl::FailedPreconditionError(absl::StrCat("configured as ", role_name(w.endpoint.role), " but serves ",
                                                   role_name(info.role())));
  w.ever_polled = true;
  if (s.ok()) {
    w.up = true;
    w.info = info;
    w.assigned_requests = w.assigned_blocks = 0;
    w.assigned_prefill_tokens = 0;
    w.next_poll = now + options_.poll_interval;
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
    grpc::ClientContext ctx;
    worker::InfoRequest request;
    worker::WorkerInfo info;
    grpc::Status status;
  };
  std::vector<std::unique_ptr<Call>> calls;
  {
    std::lock_guard lock(mu_);
    const TimePoint now = clock_.now();
    for (size_t i = 0; i < workers_.size(); ++i) {
      if (workers_[i].ever_polled && workers_[i].next_poll > now) continue;
      auto c = std::make_unique<Call>();
      c->index = int(i);
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
    workers_[call->index].stub->async()->Info(&call->ctx, &call->request, &call->info,
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
    apply_poll(c->index, s, c->info);
  }
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
    poll_once();
    std::unique_lock lock(mu_);
    // Real time here: this paces the loop; which workers are due is decided on clock_.
    if (cv_.wait_for(lock, std::chrono::milliseconds(50), [this] { return stopping_; })) return;
  }
}

std::vector<WorkerLoad> WorkerRegistry::loads(worker::Role role) const {
  std::lock_guard lock(mu_);
  std::vector<WorkerLoad> out;
  for (size_t i = 0; i < workers_.size(); ++i) {
    const Worker& w = workers_[i];
    if (w.endpoint.role != role) continue;
    WorkerLoad l;
    l.index = int(i);
    l.up = w.up;
    l.num_blocks = w.info.num_blocks();
    l.free_blocks = w.info.free_blocks() - w.assigned_blocks;
    l.running = w.info.running() + w.assigned_requests;
    l.waiting = w.info.waiting();
    l.queued_prefill_tokens = w.info.queued_prefill_tokens() + w.assigned_prefill_tokens;
    out.push_back(l);
  }
  return out;
}

bool WorkerRegistry::has_role(worker::Role role) const {
  for (const Worker& w : workers_)
    if (w.endpoint.role == role) return true;
  return false;
}

worker::Worker::Stub* WorkerRegistry::stub(int index) const { return workers_[index].stub.get(); }

const std::string& WorkerRegistry::address(int index) const { return workers_[index].endpoint.address; }

std::optional<worker::WorkerInfo> WorkerRegistry::info(int index) const {
  std::lock_guard lock(mu_);
  if (!workers_[index].ever_polled || workers_[index].info.block_size() <= 0) return std::nullopt;
  return workers_[index].info;
}

void WorkerRegistry::note_assigned(int index, int blocks, int64_t prefill_tokens) {
  std::lock_guard lock(mu_);
  Worker& w = workers_[index];
  ++w.assigned_requests;
  w.assigned_blocks += blocks;
  w.assigned_prefill_tokens += prefill_tokens;
}

void WorkerRegistry::mark_down(int index, const Status& why) {
  std::lock_guard lock(mu_);
  Worker& w = workers_[index];
  if (w.up) PD_LOG_WARN("worker {} marked down: {}", w.endpoint.address, std::string(why.message()));
  w.up = false;
  w.next_poll = clock_.now() + options_.retry_interval;
}

std::vector<WorkerGauges> WorkerRegistry::gauges() const {
  std::lock_guard lock(mu_);
  std::vector<WorkerGauges> out;
  for (const Worker& w : workers_) {
    WorkerGauges g;
    g.worker = w.endpoint.address;
    g.role = role_name(w.endpoint.role);
    g.up = w.up;
    g.num_blocks = w.info.num_blocks();
    g.free_blocks = w.info.free_blocks();
    g.running = w.info.running();
    g.waiting = w.info.waiting();
    g.queued_prefill_tokens = w.info.queued_prefill_tokens();
    out.push_back(g);
  }
  return out;
}

}  // namespace pdserve::router
