// A CPU rank's threads (engine/backends/cpu/thread_team.h): the team runs every part of every
// run once, whether its helpers spin or sleep; the parts' ranges tile their items; and the CPU
// backend's GEMMs and attention give the same bits on any thread count, through both ways it
// splits a product (rows of a small matrix, columns of a large one) and its attention's tokens.
#include <gtest/gtest.h>

#include <atomic>
#include <bit>
#include <numeric>
#include <random>
#include <vector>

#include "engine/backend.h"
#include "engine/backends/cpu/thread_team.h"
#include "engine/kv_cache_layout.h"
#include "engine/spin_barrier.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/paged_attention.h"
#include "tests/engine/random_floats.h"

namespace pdserve::engine {
namespace {

using ::pdserve::testing::random_vec;

void expect_same_bits(const std::vector<float>& got, const std::vector<float>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_EQ(std::bit_cast<uint32_t>(got[i]), std::bit_cast<uint32_t>(want[i])) << what << ", element " << i;
}

TEST(PartRange, TilesTheItemsInWholeGrainsInOrder) {
  struct Case {
    int count, parts, grain;
    std::vector<PartRange> want;
  };
  const std::vector<Case> cases = {
      {16, 2, 8, {{0, 8}, {8, 16}}},
      {17, 2, 8, {{0, 8}, {8, 17}}},  // Three grains, the last partial: one, then two.
      {172, 2, 8, {{0, 88}, {88, 172}}},
      {5, 3, 4, {{0, 0}, {0, 4}, {4, 5}}},  // More parts than grains: a part is empty.
      {45, 2, 4, {{0, 24}, {24, 45}}},      // 12 grains of 4 rows, six each (the last partial).
      {0, 2, 4, {{0, 0}, {0, 0}}},
      {7, 1, 4, {{0, 7}}},
      {64, 4, 1, {{0, 16}, {16, 32}, {32, 48}, {48, 64}}},
  };
  for (const Case& c : cases)
    for (int p = 0; p < c.parts; ++p) {
      const PartRange r = part_range(c.count, c.parts, p, c.grain);
      EXPECT_EQ(r.begin, c.want[p].begin) << c.count << " items, part " << p << " of " << c.parts;
      EXPECT_EQ(r.end, c.want[p].end) << c.count << " items, part " << p << " of " << c.parts;
    }
}

// spins 0: the helpers sleep between runs (the futex path); spin_budget: they spin first.
class ThreadTeamTest : public ::testing::TestWithParam<int> {};

TEST_P(ThreadTeamTest, EveryPartOfEveryRunRunsOnceBeforeRunReturns) {
  ThreadTeam team(3, GetParam());
  ASSERT_EQ(team.size(), 3);
  for (const int parts : {0, 1, 2, 3, 7, 64}) {
    std::vector<std::atomic<int>> ran(size_t(std::max(parts, 1)));
    for (int run = 1; run <= 300; ++run) {
      team.run(parts, [&](int i) { ran[size_t(i)].fetch_add(1, std::memory_order_relaxed); });
      // Every part of this run has finished (and none ran twice) by the time run() returns.
      for (int i = 0; i < parts; ++i) ASSERT_EQ(ran[size_t(i)].load(), run) << "part " << i << " of " << parts;
    }
  }
}

TEST_P(ThreadTeamTest, PartsRunOnSeveralThreadsAndTheirWritesAreSeenByTheCaller) {
  // Each part spins until another part has started, so one thread alone could never finish a
  // run: the helpers must take parts. What the parts write is read after run() with no atomics.
  ThreadTeam team(2, GetParam());
  for (int run = 0; run < 50; ++run) {
    std::atomic<int> started{0};
    std::vector<int> out(2, 0);
    team.run(2, [&](int i) {
      started.fetch_add(1);
      while (started.load() < 2) cpu_relax();
      out[size_t(i)] = run * 10 + i;
    });
    EXPECT_EQ(out, (std::vector<int>{run * 10, run * 10 + 1}));
  }
}

TEST_P(ThreadTeamTest, ATeamStopsWhateverItsHelpersHaveSeen) {
  // Destroyed at once (helpers not yet started, or asleep), or after a run published before a
  // helper had started: a helper must see both the run and the stop.
  for (int i = 0; i < 50; ++i) {
    ThreadTeam idle(4, GetParam());
    ThreadTeam used(4, GetParam());
    std::atomic<int> ran{0};
    used.run(8, [&](int) { ran.fetch_add(1); });
    EXPECT_EQ(ran.load(), 8);
  }
}

INSTANTIATE_TEST_SUITE_P(Waits, ThreadTeamTest, ::testing::Values(0, 1 << 12),
                         [](const auto& info) { return info.param == 0 ? "sleeping" : "spinning"; });

TEST(MatmulColumns, EqualTheWholeProductsColumnsBitForBit) {
  // Ranges on and off the tiles (8 columns for one row, 4 otherwise), and y's other columns left
  // as they were.
  for (int rows : {1, 3, 4, 9})
    for (auto [begin, end] : {std::pair{0, 37}, {0, 8}, {8, 37}, {3, 21}, {36, 37}, {5, 5}}) {
      const int out = 37, in = 70;
      std::vector<float> w = random_vec(out * (in + 3), 41), x = random_vec(rows * in, 42), whole(rows * out);
      kernels::cpu::matmul_xwt(whole.data(), x.data(), w.data(), rows, out, in, in + 3);
      std::vector<float> part(rows * out, -7.0f);
      kernels::cpu::matmul_xwt_columns(part.data(), x.data(), w.data(), rows, out, in, in + 3, begin, end);
      for (int r = 0; r < rows; ++r)
        for (int o = 0; o < out; ++o) {
          const float want = o >= begin && o < end ? whole[r * out + o] : -7.0f;
          ASSERT_EQ(std::bit_cast<uint32_t>(part[r * out + o]), std::bit_cast<uint32_t>(want))
              << rows << " rows, columns [" << begin << ", " << end << "), row " << r << " column " << o;
        }
    }
}

// The CPU backend on 1, 2 and 3 threads, the same products and attention, bit for bit.
class CpuThreadsTest : public ::testing::Test {
 protected:
  std::vector<std::unique_ptr<Backend>> backends() {
    std::vector<std::unique_ptr<Backend>> b;
    for (int threads : {1, 2, 3}) b.push_back(make_cpu_backend({threads, threads}));
    return b;
  }
};

TEST_F(CpuThreadsTest, GemmsGiveTheSameBitsOnAnyThreadCount) {
  struct Shape {
    int rows, out, in;
    int64_t ldw;
    const char* split;
  };
  const std::vector<Shape> shapes = {
      {1, 768, 768, 768, "columns: a GEMV of a large matrix"},
      {1, 1003, 600, 611, "columns: uneven, a column slice (ldw > in)"},
      {5, 700, 400, 400, "columns: too few rows to split"},
      {32, 172, 64, 64, "rows: a small matrix, a batch"},
      {45, 130, 72, 80, "rows: uneven, a column slice"},
      {256, 64, 64, 64, "rows: a prefill chunk"},
      {3, 10, 10, 10, "none: below the threshold"},
  };
  auto team = backends();
  for (const Shape& s : shapes) {
    const std::vector<float> w = random_vec(size_t(s.out) * s.ldw, 51), x = random_vec(size_t(s.rows) * s.in, 52);
    std::vector<float> want(size_t(s.rows) * s.out);
    kernels::cpu::matmul_xwt(want.data(), x.data(), w.data(), s.rows, s.out, s.in, s.ldw);
    for (auto& backend : team) {
      std::vector<float> got(want.size(), 1.0f);
      backend->matmul_xwt(got.data(), x.data(), w.data(), s.rows, s.out, s.in, s.ldw);
      expect_same_bits(got, want, std::string(s.split));
    }
  }
}

TEST_F(CpuThreadsTest, AttentionGivesTheSameBitsOnAnyThreadCount) {
  // A prefill chunk of one sequence (later tokens see more keys: the parts balance keys, not
  // tokens), with and without a window and a block mask, and a decode batch of sequences at
  // scattered positions.
  const int kv_heads = 2, q_per_kv = 3, q_heads = kv_heads * q_per_kv, hd = 16, block = 4, blocks = 64;
  KvCacheSpec spec;
  spec.block_size = block;
  spec.layers = {
      {KvKind::kKv, KvSharding::kByHead, kv_heads, hd, hd, DType::kF32, KvLayout::kSeparate, KvOrder::kTokenMajor, 0}};
  auto layout = KvCacheLayout::create(spec, 0, 1, blocks);
  ASSERT_TRUE(layout.ok()) << layout.status();
  std::vector<float> arena(layout->total_bytes() / sizeof(float));
  const kernels::PagedLayerView view = layout->view(0, reinterpret_cast<uint8_t*>(arena.data()));
  // Four sequences of 64 positions, blocks interleaved and reversed.
  std::vector<std::vector<int>> tables(4, std::vector<int>(16));
  for (int s = 0; s < 4; ++s)
    for (int b = 0; b < 16; ++b) tables[s][b] = blocks - 1 - (b * 4 + s);
  {
    const std::vector<float> k = random_vec(size_t(4 * 64) * kv_heads * hd, 61), v = random_vec(k.size(), 62);
    std::vector<int> positions(4 * 64);
    std::vector<const int*> rows(4 * 64);
    for (int i = 0; i < 4 * 64; ++i) positions[i] = i % 64, rows[i] = tables[i / 64].data();
    kernels::cpu::paged_kv_write(view, kernels::TokenPlacement{4 * 64, positions.data(), rows.data()}, k.data(),
                                 kv_heads * hd, v.data(), kv_heads * hd, kv_heads);
  }
  std::vector<uint8_t> mask(64 * 16, 1);
  for (int t = 0; t < 64; ++t)
    for (int b = 0; b < t / block; b += 3) mask[t * 16 + b] = 0;  // Never the token's own block.
  struct Case {
    std::vector<int> positions, sequences;
    int window;
    bool masked;
    const char* what;
  };
  std::vector<int> chunk(64), zeros(64, 0);
  std::iota(chunk.begin(), chunk.end(), 0);
  const std::vector<Case> cases = {
      {chunk, zeros, 0, false, "prefill chunk"},
      {chunk, zeros, 5, false, "prefill chunk, window 5"},
      {chunk, zeros, 0, true, "prefill chunk, block mask"},
      {{63, 10, 40, 63, 2, 55, 31, 63, 20, 47, 63, 9, 33, 60, 1, 62},
       {0, 1, 2, 3, 0, 1, 2, 3, 3, 2, 1, 0, 3, 2, 1, 0},
       0,
       false,
       "decode batch"},
      {{63, 5}, {1, 2}, 0, false, "two tokens"},
  };
  auto team = backends();
  for (const Case& c : cases) {
    const int n = int(c.positions.size());
    std::vector<const int*> rows(n);
    for (int t = 0; t < n; ++t) rows[t] = tables[c.sequences[t]].data();
    kernels::TokenPlacement place{n, c.positions.data(), rows.data()};
    if (c.masked) place.block_mask = mask.data(), place.mask_stride = 16;
    const std::vector<float> q = random_vec(size_t(n) * q_heads * hd, 63);
    std::vector<float> want(size_t(n) * q_heads * hd);
    kernels::cpu::paged_attention(want.data(), q.data(), view, place, q_heads, q_per_kv, c.window, 0.25f);
    for (auto& backend : team) {
      std::vector<float> got(want.size(), 1.0f);
      backend->paged_attention(got.data(), q.data(), view, place, q_heads, q_per_kv, c.window, 0.25f,
                               GemmPrecision::kExact);
      expect_same_bits(got, want, c.what);
    }
  }
}

TEST(CpuThreads, MoreThanOneIsForTheCpuBackendOnly) {
  auto refused = make_backend("emulated", 0, {2, 2});
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("--cpu-threads 2 is for the cpu backend"), std::string::npos)
      << refused.status();
  EXPECT_FALSE(make_backend("cpu", 0, {0, 0}).ok());
  EXPECT_TRUE(make_backend("cpu", 0, {4, 4}).ok());
}

}  // namespace
}  // namespace pdserve::engine
