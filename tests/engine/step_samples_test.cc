// The engine's step window on the bundled model: each step's sample says exactly what the
// step computed (prompt chunks, decodes and their context lengths) and how long its forward
// pass and sampling took on the engine's clock, and the counters in stats() are its sums.
#include <gtest/gtest.h>

#include <atomic>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "engine/engine.h"
#include "tests/engine/test_model.h"

namespace pdserve::engine {
namespace {

// Moves 1 ms each time it is read: a step (read before the forward pass and after sampling)
// takes exactly 1 ms.
class TickingClock final : public Clock {
 public:
  TimePoint now() const override { return TimePoint(std::chrono::milliseconds(++ms_)); }

 private:
  mutable std::atomic<int64_t> ms_{0};
};

std::unique_ptr<Engine> make_engine(EngineOptions options) {
  auto model = load_model({pdserve::testing::stories_bin()});
  EXPECT_TRUE(model.ok()) << model.status();
  auto engine = Engine::create(std::move(*model), options);
  EXPECT_TRUE(engine.ok()) << engine.status();
  return std::move(*engine);
}

SamplingParams exactly(int tokens) {
  SamplingParams p;
  p.max_tokens = tokens;
  p.ignore_eos = true;
  return p;
}

std::vector<int> prompt_of(int n) {
  std::vector<int> p = {1};
  while (int(p.size()) < n) p.push_back(20 + int(p.size()));
  return p;
}

// (prefill_tokens, prefill_seqs, decode_seqs, kv_tokens) of each sample.
using Shape = std::tuple<int64_t, int, int, int64_t>;
std::vector<Shape> shapes(const std::vector<StepSample>& samples) {
  std::vector<Shape> out;
  for (const StepSample& s : samples) out.emplace_back(s.prefill_tokens, s.prefill_seqs, s.decode_seqs, s.kv_tokens);
  return out;
}

// A step's tokens are in stats() while its forward pass runs, and only then (a watcher tells a
// long step from a stuck engine by them).
TEST(StepSamples, TheStepInProgressIsLiveWhileItRuns) {
  EngineOptions options;
  options.max_batch_tokens = 8;
  auto engine = make_engine(options);
  std::mutex mu;  // The hook runs on the rank's thread.
  std::vector<int64_t> seen;
  engine->set_layer_hook([&](int, int layer, const std::vector<std::string>&) {
    if (layer != 0) return;
    const int64_t in_progress = engine->stats().step_tokens_in_progress;
    std::lock_guard lock(mu);
    seen.push_back(in_progress);
  });
  EXPECT_EQ(engine->stats().step_tokens_in_progress, 0);
  ASSERT_TRUE(engine->add_request({"a", prompt_of(20), exactly(4)}, nullptr).ok());
  ASSERT_TRUE(engine->run_until_idle().ok());
  std::lock_guard lock(mu);
  EXPECT_EQ(seen, (std::vector<int64_t>{8, 8, 4, 1, 1, 1}));
  EXPECT_EQ(engine->stats().step_tokens_in_progress, 0);
}

TEST(StepSamples, ChunkedPrefillThenDecodesAreRecordedStepByStep) {
  TickingClock clock;
  EngineOptions options;
  options.clock = &clock;
  options.max_batch_tokens = 8;  // The 20-token prompt prefills in chunks of 8, 8 and 4.
  auto engine = make_engine(options);
  ASSERT_TRUE(engine->add_request({"a", prompt_of(20), exactly(4)}, nullptr).ok());
  ASSERT_TRUE(engine->run_until_idle().ok());

  const std::vector<StepSample> samples = engine->steps_after(0);
  // The third chunk samples the first token; three decodes follow, each reading the prompt
  // and the tokens generated so far (the one it feeds included).
  const std::vector<Shape> want = {{8, 1, 0, 0}, {8, 1, 0, 0}, {4, 1, 0, 0}, {0, 0, 1, 21}, {0, 0, 1, 22}, {0, 0, 1, 23}};
  EXPECT_EQ(shapes(samples), want);
  for (size_t i = 0; i < samples.size(); ++i) {
    EXPECT_EQ(samples[i].seq, i + 1);
    EXPECT_DOUBLE_EQ(samples[i].wall_s, 0.001) << "step " << i + 1;
  }
  const EngineStats stats = engine->stats();
  EXPECT_EQ(stats.steps, 6u);
  EXPECT_EQ(stats.prefill_tokens, 20u);
  EXPECT_EQ(stats.decode_tokens, 3u);
  EXPECT_NEAR(stats.step_seconds, 0.006, 1e-12);

  EXPECT_EQ(shapes(engine->steps_after(4)), std::vector<Shape>(want.begin() + 4, want.end()));
  EXPECT_TRUE(engine->steps_after(6).empty());
}

// A prefill joining a decoding sequence shares its step; a one-token prompt is a prefill too.
TEST(StepSamples, APrefillAndADecodeShareAStep) {
  auto engine = make_engine({});  // The real clock: steps take time.
  ASSERT_TRUE(engine->add_request({"a", prompt_of(5), exactly(3)}, nullptr).ok());
  ASSERT_TRUE(engine->step().ok());
  ASSERT_TRUE(engine->add_request({"b", prompt_of(1), exactly(2)}, nullptr).ok());
  ASSERT_TRUE(engine->run_until_idle().ok());
  const std::vector<StepSample> samples = engine->steps_after(0);
  const std::vector<Shape> want = {{5, 1, 0, 0}, {1, 1, 1, 6}, {0, 0, 2, 7 + 2}};
  EXPECT_EQ(shapes(samples), want);
  for (const StepSample& s : samples) EXPECT_GT(s.wall_s, 0) << "step " << s.seq;
  EXPECT_EQ(engine->stats().decode_tokens, 3u);
  EXPECT_EQ(engine->stats().prefill_tokens, 6u);
}

// A window smaller than the run keeps its newest steps, still numbered from the first.
TEST(StepSamples, ASmallWindowKeepsTheNewestSteps) {
  EngineOptions options;
  options.step_window = 3;
  auto engine = make_engine(options);
  ASSERT_TRUE(engine->add_request({"a", prompt_of(10), exactly(6)}, nullptr).ok());
  ASSERT_TRUE(engine->run_until_idle().ok());
  EXPECT_EQ(engine->stats().steps, 6u);
  const std::vector<StepSample> kept = engine->steps_after(0);
  ASSERT_EQ(kept.size(), 3u);
  EXPECT_EQ(kept[0].seq, 4u);
  EXPECT_EQ(kept[2].seq, 6u);
  EXPECT_EQ(shapes(kept), (std::vector<Shape>{{0, 0, 1, 13}, {0, 0, 1, 14}, {0, 0, 1, 15}}));
}

}  // namespace
}  // namespace pdserve::engine
