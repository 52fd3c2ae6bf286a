// The KV cache's filesystem tier (engine/fs_kv_tier.h): in the engine on the bundled model, a
// device cache of about two requests with a host tier and a directory serves earlier prompts
// again after a restart on the same directory; files written at TP 1 serve a TP 2 engine (the
// canonical layout); corrupt files (bit flips, truncations) are misses, deleted, never wrong
// output. The tier alone is tested in fs_kv_tier_test.cc.
#include <gtest/gtest.h>
#include <unistd.h>

#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <random>
#include <thread>

#include "engine/engine.h"
#include "tests/engine/temp_files.h"
#include "tests/engine/test_model.h"
#include "tests/engine/tier_scenario.h"

namespace pdserve::engine {
namespace {

namespace fs = std::filesystem;

EngineOptions tier_options(const std::string& dir, int tp = 1) {
  EngineOptions o;
  o.tp = tp;
  o.kv_cache_bytes = 1500000 / uint64_t(tp);  // About two ~375-token requests.
  o.host_kv_bytes = (uint64_t(64) << 20) / uint64_t(tp);
  o.kv_offload_dir = dir;
  return o;
}

std::unique_ptr<Engine> make_engine(const std::string& dir, int tp = 1) {
  return pdserve::testing::stories_engine(tier_options(dir, tp));
}

// A clock one millisecond later at every reading: a load's deadline falls after a known number
// of the engine's readings, whatever the machine's speed.
class TickingClock final : public Clock {
 public:
  TimePoint now() const override { return TimePoint(std::chrono::milliseconds(++ticks_)); }

 private:
  mutable std::atomic<int64_t> ticks_{0};
};

// A clock whose readings on any thread but its owner's wait until open() (or a minute): the
// tiers' loader thread stops before its first chunk file, so a request stays PENDING for as long
// as the test likes, while the owner — the test, stepping the engine — reads it freely.
class GateClock final : public Clock {
 public:
  TimePoint now() const override {
    if (std::this_thread::get_id() != owner_) {
      std::unique_lock lock(mu_);
      waiting_ = true;
      cv_.notify_all();
      cv_.wait_for(lock, std::chrono::minutes(1), [&] { return open_; });
    }
    return RealClock::instance().now();
  }
  // Whether another thread is waiting at the gate within `limit`.
  bool someone_waits(Duration limit) const {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, limit, [&] { return waiting_; });
  }
  void open() {
    std::lock_guard lock(mu_);
    open_ = true;
    cv_.notify_all();
  }

 private:
  const std::thread::id owner_ = std::this_thread::get_id();
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  mutable bool waiting_ = false;
  bool open_ = false;
};

using pdserve::testing::prompt_of;
using pdserve::testing::run;

// The scenario: ten distinct ~375-token prompts, then the first five again, with the
// same text and ≥ 256 cached tokens each; after a restart on the same directory, again (from the
// files: the new engine's device and host tiers start empty).
TEST(FsTier, ServesEarlierPromptsAgainAfterARestart) {
  const std::string dir = testing::fresh_dir("fs-tier-restart");
  std::vector<std::vector<int>> first;
  {
    auto e = make_engine(dir);
    for (int i = 0; i < 10; ++i) first.push_back(run(*e, prompt_of(375, i)).token_ids);
    for (int i = 0; i < 5; ++i) {
      const GenerationResult again = run(*e, prompt_of(375, i));
      EXPECT_EQ(again.token_ids, first[size_t(i)]) << i;
      EXPECT_GE(again.cached_tokens, 256) << i;
    }
  }  // Destroyed: its queued writes finish.
  EXPECT_GE(testing::files_in(dir, ".kvc").size(), 10u);
  auto e = make_engine(dir);
  for (int i = 0; i < 5; ++i) {
    const GenerationResult again = run(*e, prompt_of(375, i));
    EXPECT_EQ(again.token_ids, first[size_t(i)]) << i;
    EXPECT_GE(again.cached_tokens, 256) << i;
  }
  const EngineStats s = e->stats();
  EXPECT_GE(s.disk_hit_tokens, 5u * 256);
  EXPECT_GE(s.disk_loaded_chunks, 5u);
  EXPECT_EQ(s.free_blocks, s.num_blocks);
  EXPECT_EQ(s.host_free_blocks, s.host_blocks);
  EXPECT_FALSE(testing::has_temp_files(dir));
}

// The files' payload is TP-independent: written by a TP 1 engine, read by a TP 2 one.
TEST(FsTier, FilesWrittenAtOneTpServeAnother) {
  const std::string dir = testing::fresh_dir("fs-tier-tp");
  std::vector<std::vector<int>> want;
  {
    auto e = make_engine(dir, 1);
    for (int i = 0; i < 3; ++i) want.push_back(run(*e, prompt_of(300, i)).token_ids);
  }
  auto e = make_engine(dir, 2);
  for (int i = 0; i < 3; ++i) {
    const GenerationResult r = run(*e, prompt_of(300, i));
    EXPECT_EQ(r.token_ids, want[size_t(i)]) << i;
    EXPECT_GE(r.cached_tokens, 256) << i;
  }
  EXPECT_GE(e->stats().disk_loaded_chunks, 3u);
}

// --kv-load-timeout-ms: a load that reaches its deadline keeps the chunks it loaded and computes
// the rest, with the same tokens. The engine reads the clock when the load starts and before each
// chunk file, so on a clock that ticks a millisecond a reading, a 2.5 ms deadline lets exactly two
// chunks in. Without a deadline the same files give the whole prefix.
TEST(FsTier, ALoadPastItsDeadlineKeepsItsPrefixAndComputesTheRest) {
  const std::string dir = testing::fresh_dir("fs-tier-deadline");
  EngineOptions o = tier_options(dir);
  o.kv_offload_chunk_blocks = 4;  // 64 tokens a file: a 375-token prompt spans five.
  std::vector<int> want;
  {
    auto e = pdserve::testing::stories_engine(o);
    want = run(*e, prompt_of(375, 0)).token_ids;
  }
  TickingClock ticking;
  EngineOptions bounded = o;
  bounded.clock = &ticking;
  bounded.kv_load_timeout = std::chrono::microseconds(2500);
  {
    auto e = pdserve::testing::stories_engine(bounded);
    const GenerationResult r = run(*e, prompt_of(375, 0));
    EXPECT_EQ(r.token_ids, want);
    EXPECT_EQ(r.cached_tokens, 2 * 64);
    const EngineStats s = e->stats();
    EXPECT_EQ(s.disk_loaded_chunks, 2u);
    EXPECT_EQ(s.disk_load_timeouts, 1u);
    EXPECT_GT(s.disk_load_s, 0);
    EXPECT_EQ(s.free_blocks, s.num_blocks);
  }
  auto e = pdserve::testing::stories_engine(o);
  const GenerationResult r = run(*e, prompt_of(375, 0));
  EXPECT_EQ(r.token_ids, want);
  EXPECT_EQ(r.cached_tokens, 5 * 64);
  EXPECT_EQ(e->stats().disk_load_timeouts, 0u);
}

// Chunk files are read off the scheduler's thread: while a request waits PENDING for its files
// (the loader held at the gate), a running request keeps decoding, and the pending one counts as
// waiting; once the files are read it is admitted with the whole prefix from them, and both give
// the tokens they give alone. Reading the files in admission instead blocks no other thread (the
// gate never sees a waiter) and fails the test.
TEST(FsTier, ARequestWaitingForItsFilesLetsTheRunningOnesStep) {
  const std::string dir = testing::fresh_dir("fs-tier-pending");
  EngineOptions o = tier_options(dir);
  o.kv_offload_chunk_blocks = 4;
  const std::vector<int> pending_prompt = prompt_of(375, 3), running_prompt = prompt_of(40, 8);
  std::vector<int> want_pending, want_running;
  {
    auto e = pdserve::testing::stories_engine(o);
    want_pending = run(*e, pending_prompt).token_ids;
    want_running = run(*e, running_prompt, 40).token_ids;
  }
  GateClock gate;
  o.clock = &gate;
  auto e = pdserve::testing::stories_engine(o);
  SamplingParams p;
  p.ignore_eos = true;
  p.max_tokens = 40;
  GenerationResult running, pending;
  auto collect = [](GenerationResult& r) {
    return [&r](const TokenEvent& ev) {
      if (ev.token >= 0) r.token_ids.push_back(ev.token);
      r.cached_tokens = ev.cached_tokens;
    };
  };
  ASSERT_TRUE(e->add_request({"running", running_prompt, p}, collect(running)).ok());
  ASSERT_TRUE(e->step().ok());
  ASSERT_EQ(running.token_ids.size(), 1u);
  p.max_tokens = 8;
  ASSERT_TRUE(e->add_request({"pending", pending_prompt, p}, collect(pending)).ok());
  ASSERT_TRUE(e->step().ok());
  ASSERT_TRUE(gate.someone_waits(std::chrono::seconds(20))) << "no chunk file was read off the scheduler's thread";
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(e->step().ok());
  EXPECT_EQ(running.token_ids.size(), 12u);
  EXPECT_TRUE(pending.token_ids.empty());
  EngineStats s = e->stats();
  EXPECT_EQ(s.waiting, 1);
  EXPECT_EQ(s.running, 1);
  EXPECT_EQ(s.disk_pending_loads, 1u);
  gate.open();
  ASSERT_TRUE(e->run_until_idle().ok());
  EXPECT_EQ(running.token_ids, want_running);
  EXPECT_EQ(pending.token_ids, want_pending);
  EXPECT_EQ(pending.cached_tokens, 5 * 64);
  s = e->stats();
  EXPECT_EQ(s.disk_loaded_chunks, 5u);
  EXPECT_EQ(s.free_blocks, s.num_blocks);
}

// A deadline bounds the filesystem tier's loads: refused without one, and when negative.
TEST(FsTier, ALoadTimeoutNeedsTheFilesystemTier) {
  EngineOptions o;
  o.kv_load_timeout = std::chrono::milliseconds(5);
  auto e = pdserve::testing::try_stories_engine(o);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("needs --kv-offload-dir"), std::string::npos) << e.status();
  o = tier_options(testing::fresh_dir("fs-tier-negative"));
  o.kv_load_timeout = std::chrono::milliseconds(-1);
  e = pdserve::testing::try_stories_engine(o);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("must not be negative"), std::string::npos) << e.status();
}

// Every file damaged — a bit flipped anywhere, or cut short — is a miss: deleted, counted, and
// the prompt computed, with the same tokens.
TEST(FsTier, CorruptFilesAreMissesNeverWrongOutput) {
  const std::string dir = testing::fresh_dir("fs-tier-corrupt");
  std::vector<std::vector<int>> want;
  {
    auto e = make_engine(dir);
    for (int i = 0; i < 6; ++i) want.push_back(run(*e, prompt_of(300, i)).token_ids);
  }
  std::mt19937 rng(9);
  const auto files = testing::files_in(dir, ".kvc");
  ASSERT_EQ(files.size(), 6u);
  for (size_t i = 0; i < files.size(); ++i) {
    const uint64_t size = fs::file_size(files[i]);
    if (i % 2 == 0) {
      std::fstream f(files[i], std::ios::in | std::ios::out | std::ios::binary);
      const uint64_t at = rng() % size;
      f.seekg(std::streamoff(at));
      char c = 0;
      f.read(&c, 1);
      c = char(c ^ (1 << (rng() % 8)));
      f.seekp(std::streamoff(at));
      f.write(&c, 1);
    } else {
      fs::resize_file(files[i], rng() % size);
    }
  }
  auto e = make_engine(dir);
  for (int i = 0; i < 6; ++i) {
    const GenerationResult r = run(*e, prompt_of(300, i));
    EXPECT_EQ(r.token_ids, want[size_t(i)]) << i;
    EXPECT_EQ(r.cached_tokens, 0) << i;
  }
  EXPECT_EQ(e->stats().disk_corrupt_files, 6u);
  EXPECT_EQ(e->stats().disk_loaded_chunks, 0u);
}

}  // namespace
}  // namespace pdserve::engine
