// StepWindow: samples are numbered in order, a full ring keeps the newest, and after(seq)
// returns exactly the kept samples past seq, oldest first.
#include "engine/step_window.h"

#include <gtest/gtest.h>

namespace pdserve::engine {
namespace {

// The seqs of window.after(seq).
std::vector<uint64_t> seqs_after(const StepWindow& window, uint64_t seq) {
  std::vector<uint64_t> out;
  for (const StepSample& s : window.after(seq)) out.push_back(s.seq);
  return out;
}

TEST(StepWindow, NumbersSamplesAndKeepsTheirFields) {
  StepWindow w(8);
  EXPECT_EQ(w.total(), 0u);
  EXPECT_TRUE(w.after(0).empty());
  w.record({.seq = 99, .prefill_tokens = 7, .prefill_seqs = 1, .decode_seqs = 2, .kv_tokens = 30, .wall_s = 0.5});
  w.record({.decode_seqs = 3});
  EXPECT_EQ(w.total(), 2u);
  const std::vector<StepSample> all = w.after(0);
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(all[0].seq, 1u);  // The window numbers them, whatever the caller set.
  EXPECT_EQ(all[0].prefill_tokens, 7);
  EXPECT_EQ(all[0].prefill_seqs, 1);
  EXPECT_EQ(all[0].decode_seqs, 2);
  EXPECT_EQ(all[0].kv_tokens, 30);
  EXPECT_EQ(all[0].wall_s, 0.5);
  EXPECT_EQ(all[1].seq, 2u);
  EXPECT_EQ(all[1].decode_seqs, 3);
}

TEST(StepWindow, AfterFiltersAndAFullRingKeepsTheNewest) {
  struct Case {
    int recorded;
    uint64_t after;
    std::vector<uint64_t> want;
  };
  const Case cases[] = {
      {3, 0, {1, 2, 3}},        // Not full: everything.
      {3, 1, {2, 3}},           // Only seq > after.
      {3, 3, {}},               // Nothing newer.
      {3, 100, {}},             // A caller ahead of the window (another worker's seq).
      {4, 0, {1, 2, 3, 4}},     // Exactly full.
      {6, 0, {3, 4, 5, 6}},     // Wrapped: the oldest two are gone.
      {6, 4, {5, 6}},           // Wrapped, filtered.
      {11, 2, {8, 9, 10, 11}},  // Wrapped more than once; asked from before the window.
      {3, UINT64_MAX, {}},
  };
  for (const Case& c : cases) {
    StepWindow w(4);
    for (int i = 0; i < c.recorded; ++i) w.record({.prefill_tokens = i + 1});
    EXPECT_EQ(seqs_after(w, c.after), c.want) << c.recorded << " recorded, after " << c.after;
    for (const StepSample& s : w.after(c.after))  // Each seq still holds its own sample.
      EXPECT_EQ(s.prefill_tokens, int64_t(s.seq)) << s.seq;
  }
}

}  // namespace
}  // namespace pdserve::engine
