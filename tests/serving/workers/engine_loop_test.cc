// EngineLoop: requests submitted from many threads run on the loop's thread and give exactly
// the tokens of a lone in-process run; abort and shutdown finish every request with "abort"
// and free every block; bad and duplicate submissions are refused without a callback.
#include "engine/engine_loop.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <thread>

#include "tests/engine/test_model.h"

namespace pdserve::engine {
namespace {

std::unique_ptr<Engine> make_engine(int tp) {
  auto model = load_model({pdserve::testing::stories_bin()});
  EXPECT_TRUE(model.ok()) << model.status();
  EngineOptions o;
  o.tp = tp;
  o.kv_cache_bytes = 4 << 20;
  auto e = Engine::create(std::move(*model), o);
  EXPECT_TRUE(e.ok()) << e.status();
  return std::move(*e);
}

// Collects one request's events until it finished.
struct Collected {
  std::mutex mu;
  std::condition_variable done_cv;
  std::vector<int> tokens;
  bool done = false;
  FinishReason reason = FinishReason::kNone;
  TokenCallback sink() {
    return [this](const TokenEvent& ev) {
      std::lock_guard lock(mu);
      if (ev.token >= 0) tokens.push_back(ev.token);
      if (ev.finished) {
        done = true;
        reason = ev.reason;
        done_cv.notify_all();
      }
    };
  }
  bool wait(std::chrono::seconds timeout) {
    std::unique_lock lock(mu);
    return done_cv.wait_for(lock, timeout, [&] { return done; });
  }
};

TEST(EngineLoop, ConcurrentSubmissionsEqualLoneRuns) {
  auto reference = make_engine(2);
  SamplingParams p;
  p.max_tokens = 40;
  std::vector<std::vector<int>> prompts = {{1}, {1, 403, 261, 9}, {1, 50, 60, 70, 80, 90, 100}};
  std::vector<std::vector<int>> expected;
  for (const auto& prompt : prompts) expected.push_back(reference->generate(prompt, p)->token_ids);

  EngineLoop loop(make_engine(2));
  std::vector<Collected> got(prompts.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < prompts.size(); ++i)
    threads.emplace_back([&, i] {
      EXPECT_TRUE(loop.submit({"r" + std::to_string(i), prompts[i], p}, got[i].sink()).ok());
    });
  for (auto& t : threads) t.join();
  for (size_t i = 0; i < prompts.size(); ++i) {
    ASSERT_TRUE(got[i].wait(std::chrono::seconds(30)));
    EXPECT_EQ(got[i].tokens, expected[i]) << "request " << i;
  }
  // The last sink runs inside the step whose end refreshes the stats.
  EngineLoopStats s = loop.stats();
  for (int i = 0; i < 100 && s.engine.free_blocks != s.engine.num_blocks; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    s = loop.stats();
  }
  EXPECT_EQ(s.engine.free_blocks, s.engine.num_blocks);
  EXPECT_EQ(s.active_requests, 0);
  EXPECT_EQ(s.queued_prefill_tokens, 0);
}

TEST(EngineLoop, RefusesBadAndDuplicateRequests) {
  EngineLoop loop(make_engine(1));
  std::atomic<int> calls{0};
  SamplingParams p;
  p.max_tokens = 300;
  p.ignore_eos = true;
  EXPECT_FALSE(loop.submit({"empty", {}, p}, [&](const TokenEvent&) { ++calls; }).ok());
  Collected first;
  ASSERT_TRUE(loop.submit({"dup", {1, 2, 3}, p}, first.sink()).ok());
  EXPECT_EQ(loop.submit({"dup", {1, 2, 3}, p}, [&](const TokenEvent&) { ++calls; }).code(),
            absl::StatusCode::kAlreadyExists);
  loop.abort("dup");
  ASSERT_TRUE(first.wait(std::chrono::seconds(30)));
  EXPECT_EQ(first.reason, FinishReason::kAbort);
  EXPECT_EQ(calls.load(), 0);
  loop.shutdown();
  EXPECT_EQ(loop.stats().engine.free_blocks, loop.stats().engine.num_blocks);
}

TEST(EngineLoop, ShutdownAbortsEverythingAndFreesBlocks) {
  auto loop = std::make_unique<EngineLoop>(make_engine(2));
  SamplingParams p;
  p.max_tokens = 400;
  p.ignore_eos = true;
  std::vector<Collected> got(4);
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_TRUE(loop->submit({"s" + std::to_string(i), {1, int(10 + i)}, p}, got[i].sink()).ok());
  loop->shutdown();  // At once: 400 steps each cannot have run yet.
  for (auto& g : got) {
    EXPECT_TRUE(g.done);
    EXPECT_EQ(g.reason, FinishReason::kAbort);
    EXPECT_LT(g.tokens.size(), 400u);
  }
  const EngineLoopStats s = loop->stats();
  EXPECT_EQ(s.engine.free_blocks, s.engine.num_blocks);
  EXPECT_EQ(loop->submit({"late", {1}, p}, nullptr).code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace pdserve::engine
