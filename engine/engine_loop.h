// EngineLoop runs an Engine on a thread of its own so that servers can feed it from many
// threads: it steps while there is work and sleeps on a condition variable otherwise. Each
// request carries its own event sink (called on the loop thread); shutdown aborts whatever is
// still queued or running, so every request gets a final event and every block it held is free.
#pragma once

#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "engine/engine.h"

namespace pdserve::engine {

struct EngineLoopStats {
  EngineStats engine;
  // Prompt tokens to compute of requests that have not produced their first token yet: each
  // prompt less what the prefix cache held of it when it was submitted (preloaded requests
  // excluded: their prompt is computed elsewhere). The router weighs workers by it against the
  // uncached blocks it sends them.
  int64_t queued_prefill_tokens = 0;
  int active_requests = 0;  // Submitted and not yet finished.
};

class EngineLoop {
 public:
  // Takes the engine (its layer hook, if any, must already be set) and starts the thread.
  explicit EngineLoop(std::unique_ptr<Engine> engine);
  // Shuts down (see shutdown()).
  ~EngineLoop();

  EngineLoop(const EngineLoop&) = delete;
  EngineLoop& operator=(const EngineLoop&) = delete;

  // Queues a request; `sink` gets its events on the loop thread, the last one finished.
  // Fails at once (and `sink` is never called) on bad input, a duplicate id, or after shutdown.
  Status submit(GenerationRequest request, TokenCallback sink);
  // Cancels a request; it finishes with "abort" and its blocks are freed. Unknown ids: no-op.
  void abort(const std::string& id);
  // Whether a request of this id is queued or running.
  bool active(const std::string& id) const;
  // A snapshot, safe from any thread (Engine::stats: free blocks and the step in progress live,
  // counters at most one step old).
  EngineLoopStats stats() const;
  // Aborts every request, waits until each finished, and stops the thread. Idempotent.
  void shutdown();

  // The engine, for its thread-safe members only: config, tokenizer,
  // reserve_cached_blocks, release_blocks, blocks_needed, kv_arena, kv_layout, tp, stats,
  // steps_after.
  Engine& engine() { return *engine_; }
  const Engine& engine() const { return *engine_; }

 private:
  struct Active {
    int64_t queued_prompt_tokens = 0;  // Until the first token.
  };
  void run();
  // Wraps a sink with the loop's bookkeeping (runs on the loop thread).
  void on_event(const TokenCallback& sink, const TokenEvent& event);

  std::unique_ptr<Engine> engine_;
  mutable std::mutex mu_;
  std::condition_variable wake_;
  bool work_ = false;      // Something was submitted or aborted since the loop last looked.
  bool stopping_ = false;
  bool stopped_ = false;
  std::map<std::string, Active> active_;
  int64_t queued_prefill_tokens_ = 0;
  std::thread thread_;
};

}  // namespace pdserve::engine
