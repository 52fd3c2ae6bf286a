#include "engine/engine_loop.h"

#include <vector>

#include "common/logging.h"

namespace pdserve::engine {

EngineLoop::EngineLoop(std::unique_ptr<Engine> engine) : engine_(std::move(engine)) {
  thread_ = std::thread([this] { run(); });
}

EngineLoop::~EngineLoop() { shutdown(); }

Status EngineLoop::submit(GenerationRequest request, TokenCallback sink) {
  const std::string id = request.id;
  // Outside the loop's lock: the allocator takes its own.
  const int64_t to_compute =
      request.handoff.preloaded_blocks.empty()
          ? int64_t(request.prompt.size()) - engine_->cached_prefix_tokens(request.prompt, request.cache_salt)
          : 0;
  {
    std::lock_guard lock(mu_);
    if (stopping_) return absl::UnavailableError("the engine is shutting down");
    if (id.empty()) return absl::InvalidArgumentError("empty request id");
    if (active_.count(id)) return absl::AlreadyExistsError(absl::StrCat("request ", id, " is already active"));
    Active& a = active_[id];
    a.queued_prompt_tokens = to_compute;
    queued_prefill_tokens_ += a.queued_prompt_tokens;
  }
  Status added = engine_->add_request(
      std::move(request), [this, sink = std::move(sink)](const TokenEvent& ev) { on_event(sink, ev); });
  std::lock_guard lock(mu_);
  if (!added.ok()) {
    auto it = active_.find(id);
    if (it != active_.end()) {
      queued_prefill_tokens_ -= it->second.queued_prompt_tokens;
      active_.erase(it);
    }
    return added;
  }
  work_ = true;
  wake_.notify_one();
  return absl::OkStatus();
}

void EngineLoop::on_event(const TokenCallback& sink, const TokenEvent& ev) {
  {
    std::lock_guard lock(mu_);
    auto it = active_.find(ev.id);
    if (it != active_.end()) {
      if (ev.token >= 0 || ev.finished) {
        queued_prefill_tokens_ -= it->second.queued_prompt_tokens;
        it->second.queued_prompt_tokens = 0;
      }
      if (ev.finished) active_.erase(it);
    }
  }
  if (sink) sink(ev);
}

void EngineLoop::abort(const std::string& id) {
  {
    std::lock_guard lock(mu_);
    if (!active_.count(id)) return;
  }
  // Not under mu_: the engine may hold its own lock while it calls a sink, which takes mu_.
  engine_->abort(id);
  std::lock_guard lock(mu_);
  work_ = true;
  wake_.notify_one();
}

bool EngineLoop::active(const std::string& id) const {
  std::lock_guard lock(mu_);
  return active_.count(id) > 0;
}

EngineLoopStats EngineLoop::stats() const {
  EngineLoopStats s;
  // Safe while the loop thread steps (see Engine::stats), and not under mu_: the engine holds
  // its lock while it calls a sink, which takes mu_.
  s.engine = engine_->stats();
  std::lock_guard lock(mu_);
  s.queued_prefill_tokens = queued_prefill_tokens_;
  s.active_requests = int(active_.size());
  return s;
}

void EngineLoop::shutdown() {
  {
    std::lock_guard lock(mu_);
    if (stopped_) return;
    stopping_ = true;
    wake_.notify_one();
  }
  if (thread_.joinable()) thread_.join();
  std::lock_guard lock(mu_);
  stopped_ = true;
}

void EngineLoop::run() {
  // Never calls into the engine while holding mu_: the engine holds its own lock while it calls a
  // sink, which takes mu_ (on_event), so holding mu_ around engine calls inverts the lock order.
  auto active_ids = [this] {
    std::vector<std::string> ids;
    for (const auto& [id, a] : active_) ids.push_back(id);
    return ids;
  };
  std::unique_lock lock(mu_);
  while (true) {
    if (stopping_) {
      const std::vector<std::string> ids = active_ids();
      lock.unlock();
      if (ids.empty() && !engine_->has_work()) break;
      // Re-issued every step: a submit racing with shutdown may have queued its request after
      // an earlier abort of the same id was applied.
      for (const std::string& id : ids) engine_->abort(id);
      lock.lock();
    } else if (!work_) {
      lock.unlock();
      const bool busy = engine_->has_work();
      lock.lock();
      // A submit meanwhile set work_ under mu_, so the wait cannot miss it.
      if (!busy) {
        wake_.wait(lock, [&] { return work_ || stopping_; });
        continue;
      }
    }
    work_ = false;
    lock.unlock();
    // One step per round, so that shutdown is noticed between steps.
    Status s = engine_->step();
    if (!s.ok()) {
      PD_LOG_ERROR("engine step failed: {}; aborting its requests", s.ToString());
      lock.lock();
      const std::vector<std::string> ids = active_ids();
      lock.unlock();
      for (const std::string& id : ids) engine_->abort(id);
    }
    lock.lock();
  }
}

}  // namespace pdserve::engine
