// CPU kernels against naive formulas, paged attention through every block layout against dense
// attention over the same K/V, and sampling from logits gathered over TP ranks.
#include <bit>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <set>
#include <thread>
#include <vector>

#include "engine/communicator.h"
#include "engine/kv_cache_layout.h"
#include "engine/rope_scaling.h"
#include "engine/tp_shard.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/paged_attention.h"
#include "kernels/cpu/sampling.h"
#include "tests/engine/gathered_logits.h"

namespace pdserve::kernels::cpu {
namespace {

std::vector<float> random_vec(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d;
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

TEST(Kernels, RopeRotateHalfEqualsAdjacentOnPermutedDims) {
  const int hd = 8, heads = 2;
  std::vector<float> adj = random_vec(hd * heads, 1), half(hd * heads);
  // Dimension 2i of adjacent layout sits at i in rotate-half, 2i+1 at i + hd/2.
  for (int h = 0; h < heads; ++h)
    for (int i = 0; i < hd / 2; ++i) {
      half[h * hd + i] = adj[h * hd + 2 * i];
      half[h * hd + i + hd / 2] = adj[h * hd + 2 * i + 1];
    }
  const int pos = 7;
  const std::vector<float> inv_freq = engine::rope_frequencies({}, 10000.0f, hd, 256).inv_freq;
  rope(adj.data(), 1, hd * heads, heads, hd, &pos, inv_freq.data(), 1.0f, false);
  rope(half.data(), 1, hd * heads, heads, hd, &pos, inv_freq.data(), 1.0f, true);
  for (int h = 0; h < heads; ++h)
    for (int i = 0; i < hd / 2; ++i) {
      EXPECT_FLOAT_EQ(half[h * hd + i], adj[h * hd + 2 * i]);
      EXPECT_FLOAT_EQ(half[h * hd + i + hd / 2], adj[h * hd + 2 * i + 1]);
    }
}

// Pair i of every head turns by position * inv_freq[i] of whatever table it is given, and its
// cos and sin carry the attention scale.
TEST(Kernels, RopeTurnsEachPairByItsTableEntryAndScales) {
  const int hd = 6, heads = 2, rows = 2;
  const std::vector<float> inv_freq = {0.9f, 0.05f, 0.3f};
  const std::vector<int> pos = {3, 100};
  const float scale = 1.25f;
  const std::vector<float> x = random_vec(rows * hd * heads, 2);
  std::vector<float> got = x;
  rope(got.data(), rows, hd * heads, heads, hd, pos.data(), inv_freq.data(), scale, true);
  for (int r = 0; r < rows; ++r)
    for (int h = 0; h < heads; ++h)
      for (int i = 0; i < hd / 2; ++i) {
        const int a = r * hd * heads + h * hd + i, b = a + hd / 2;
        const double angle = double(pos[r]) * inv_freq[i];
        EXPECT_NEAR(got[a], scale * (x[a] * std::cos(angle) - x[b] * std::sin(angle)), 1e-5) << r << " " << h << " " << i;
        EXPECT_NEAR(got[b], scale * (x[a] * std::sin(angle) + x[b] * std::cos(angle)), 1e-5) << r << " " << h << " " << i;
      }
}

TEST(Kernels, MatmulWithColumnSliceStride) {
  // w is [3][5]; use columns 1..3 (ldw 5).
  std::vector<float> w = random_vec(15, 2), x = random_vec(2 * 3, 3), y(2 * 3);
  matmul_xwt(y.data(), x.data(), w.data() + 1, 2, 3, 3, 5);
  for (int r = 0; r < 2; ++r)
    for (int o = 0; o < 3; ++o) {
      float e = 0;
      for (int i = 0; i < 3; ++i) e += x[r * 3 + i] * w[o * 5 + 1 + i];
      EXPECT_NEAR(y[r * 3 + o], e, 1e-5);
    }
}

TEST(Kernels, MatmulMatchesADoubleReferenceOnEveryTileShape) {
  // Sizes around the tiles (4 rows x 4 columns, k in lanes of 8), accumulating and not.
  for (int rows : {1, 3, 4, 5, 9})
    for (int out : {1, 4, 6, 13})
      for (int in : {1, 7, 8, 17, 64}) {
        std::vector<float> w = random_vec(out * (in + 2), 11), x = random_vec(rows * in, 12);
        std::vector<float> y = random_vec(rows * out, 13), y0 = y;
        matmul_xwt(y.data(), x.data(), w.data(), rows, out, in, in + 2, /*accumulate=*/true);
        for (int r = 0; r < rows; ++r)
          for (int o = 0; o < out; ++o) {
            double e = y0[r * out + o];
            for (int i = 0; i < in; ++i) e += double(x[r * in + i]) * w[o * (in + 2) + i];
            EXPECT_NEAR(y[r * out + o], e, 1e-4) << rows << "x" << out << "x" << in;
          }
      }
}

TEST(Kernels, MatmulRowsDoNotDependOnTheirBatch) {
  // Each row's outputs, bit for bit, whether it is computed alone or among others, at any place
  // in the batch: what keeps greedy tokens independent of batching (ties between top logits).
  const int out = 37, in = 75;
  std::vector<float> w = random_vec(out * in, 21), batch = random_vec(17 * in, 22);
  for (int rows = 1; rows <= 17; ++rows) {
    std::vector<float> y(rows * out);
    matmul_xwt(y.data(), batch.data(), w.data(), rows, out, in, in);
    for (int r = 0; r < rows; ++r) {
      std::vector<float> solo(out);
      matmul_xwt(solo.data(), batch.data() + r * in, w.data(), 1, out, in, in);
      for (int o = 0; o < out; ++o)
        ASSERT_EQ(std::bit_cast<uint32_t>(y[r * out + o]), std::bit_cast<uint32_t>(solo[o]))
            << "row " << r << " of " << rows << ", column " << o;
    }
  }
}

struct LayoutCase {
  engine::KvLayout layout;
  engine::KvOrder order;
  int window;
};

class PagedAttentionTest : public ::testing::TestWithParam<LayoutCase> {};

TEST_P(PagedAttentionTest, EqualsDenseAttention) {
  using namespace engine;
  const int heads = 2, q_per_kv = 2, hd = 4, block = 4, seq = 11, blocks = 6;
  KvCacheSpec spec;
  spec.block_size = block;
  spec.layers = {{KvKind::kKv, KvSharding::kByHead, heads, hd, hd, DType::kF32, GetParam().layout,
                  GetParam().order, GetParam().window}};
  auto layout = KvCacheLayout::create(spec, 0, 1, blocks);
  ASSERT_TRUE(layout.ok());
  std::vector<float> arena(layout->total_bytes() / 4);
  auto* base = reinterpret_cast<uint8_t*>(arena.data());
  PagedLayerView view;
  view.block_size = block;
  view.head_dim = view.v_head_dim = hd;
  view.k = reinterpret_cast<float*>(base + layout->offset(0, KvPart::kK, 0, 0, 0));
  view.v = reinterpret_cast<float*>(base + layout->offset(0, KvPart::kV, 0, 0, 0));
  view.k_block_stride = layout->block_stride(0, KvPart::kK) / 4;
  view.v_block_stride = layout->block_stride(0, KvPart::kV) / 4;
  view.k_token_stride = layout->token_stride(0, KvPart::kK);
  view.v_token_stride = layout->token_stride(0, KvPart::kV);
  view.k_head_stride = layout->head_stride(0, KvPart::kK);
  view.v_head_stride = layout->head_stride(0, KvPart::kV);
  // Scattered, out-of-order blocks.
  const std::vector<int> table = {5, 2, 0};
  std::vector<const int*> tables(seq, table.data());
  std::vector<int> pos(seq);
  for (int i = 0; i < seq; ++i) pos[i] = i;
  const std::vector<float> k = random_vec(seq * heads * hd, 4), v = random_vec(seq * heads * hd, 5);
  const std::vector<float> q = random_vec(seq * heads * q_per_kv * hd, 6);
  TokenPlacement place{seq, pos.data(), tables.data()};
  paged_kv_write(view, place, k.data(), heads * hd, v.data(), heads * hd, heads);
  std::vector<float> out(seq * heads * q_per_kv * hd);
  paged_attention(out.data(), q.data(), view, place, heads * q_per_kv, q_per_kv, GetParam().window, 0.5f);
  for (int t = 0; t < seq; ++t)
    for (int h = 0; h < heads * q_per_kv; ++h) {
      const int first = GetParam().window ? std::max(0, t - GetParam().window + 1) : 0;
      std::vector<float> s;
      float mx = -1e30f;
      for (int j = first; j <= t; ++j) {
        float d = 0;
        for (int i = 0; i < hd; ++i) d += q[(t * heads * q_per_kv + h) * hd + i] * k[(j * heads + h / q_per_kv) * hd + i];
        s.push_back(d * 0.5f);
        mx = std::max(mx, s.back());
      }
      float sum = 0;
      for (float& x : s) sum += (x = std::exp(x - mx));
      for (int i = 0; i < hd; ++i) {
        float e = 0;
        for (int j = first; j <= t; ++j) e += s[j - first] / sum * v[(j * heads + h / q_per_kv) * hd + i];
        EXPECT_NEAR(out[(t * heads * q_per_kv + h) * hd + i], e, 1e-5) << "t=" << t << " h=" << h;
      }
    }
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, PagedAttentionTest,
    ::testing::Values(LayoutCase{engine::KvLayout::kSeparate, engine::KvOrder::kTokenMajor, 0},
                      LayoutCase{engine::KvLayout::kSeparate, engine::KvOrder::kHeadMajor, 0},
                      LayoutCase{engine::KvLayout::kInterleaved, engine::KvOrder::kTokenMajor, 0},
                      LayoutCase{engine::KvLayout::kInterleaved, engine::KvOrder::kHeadMajor, 0},
                      LayoutCase{engine::KvLayout::kSeparate, engine::KvOrder::kHeadOuter, 0},
                      LayoutCase{engine::KvLayout::kSeparate, engine::KvOrder::kHeadOuter, 4},
                      LayoutCase{engine::KvLayout::kSeparate, engine::KvOrder::kTokenMajor, 3},
                      LayoutCase{engine::KvLayout::kInterleaved, engine::KvOrder::kHeadMajor, 5}));

// The gathered logits of sampling on the backend: shard s is the LM head's even_split slice of
// rank s, so the shard layout must split the vocabulary exactly as the engine does.
TEST(ShardedLogits, ShardsAreTheEnginesVocabularySplit) {
  for (int vocab : {1, 7, 512, 32000, 128256})
    for (int shards = 1; shards <= 8; ++shards) {
      const ShardedLogits logits{nullptr, 3, vocab, shards};
      int widest = 0;
      for (int s = 0; s < shards; ++s) {
        const engine::Range r = engine::even_split(vocab, shards, s);
        EXPECT_EQ(logits.shard_begin(s), r.begin) << vocab << "/" << shards;
        EXPECT_EQ(logits.shard_begin(s + 1), r.end) << vocab << "/" << shards;
        widest = std::max(widest, r.size());
      }
      EXPECT_EQ(logits.shard_stride(), widest);
    }
}

// Rows gathered from `shards` ranks (each slice padded to the widest) sample as the plain rows.
TEST(ShardedLogits, SamplingGatheredRowsEqualsSamplingPlainRows) {
  const int rows = 6, vocab = 1001;
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<float> plain(size_t(rows) * vocab);
  for (float& x : plain) x = normal(rng);
  std::vector<SampleRow> params;
  for (int r = 0; r < rows; ++r) params.push_back({r == 0 ? 0.0f : 0.8f, r % 3 == 1 ? 40 : 0, r % 2 ? 0.9f : 1.0f,
                                                   (r + 0.5) / rows});
  SampleScratch scratch;
  std::vector<int> want(rows);
  for (int r = 0; r < rows; ++r) want[r] = sample_token(plain.data() + r * vocab, vocab, params[r], &scratch);
  for (int shards = 1; shards <= 4; ++shards) {
    ShardedLogits logits{nullptr, rows, vocab, shards};
    const std::vector<float> gathered = pdserve::testing::gather_logits(plain, logits, std::nanf(""));
    logits.data = gathered.data();
    std::vector<int> got(rows);
    sample_rows(got.data(), nullptr, logits, params.data(), {}, {}, &scratch);
    EXPECT_EQ(got, want) << shards << " shards";
  }
}

// The repetition penalty in the reference sampler: a row with a slot samples what sample_token
// picks from its logits penalised by hand (seen positive logits divided, the others multiplied),
// over two steps — the first emptying a slot an earlier sequence left full and adding the
// prompt (an id outside the vocabulary skipped), the second adding one id to what is there.
TEST(RepetitionPenalty, SampleRowsPenalisesTheSeenIdsOfEachRowsSlot) {
  const int vocab = 1000, rows = 4, slots = 3;
  const float penalties[rows] = {1.5f, 0.6f, 2.0f, 1.0f};  // Row 3 has no slot.
  std::mt19937 rng(8);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  SeenTokens seen{nullptr, nullptr, nullptr, vocab};
  std::vector<uint32_t> bits(slots * seen.words_per_slot(), ~0u);  // Left by earlier sequences.
  seen.bits = bits.data();
  std::vector<std::set<int>> ids(slots);  // What each slot should hold.
  SampleScratch scratch;
  int changed = 0;
  for (int step = 0; step < 2; ++step) {
    std::vector<float> logits(size_t(rows) * vocab);
    for (float& x : logits) x = normal(rng);
    std::vector<int> new_ids;
    std::vector<SampleRow> params;
    for (int r = 0; r < rows; ++r) {
      SampleRow row{r == 2 ? 0.8f : 0.0f, 0, 1.0f, 0.3};  // Rows 0 and 1 greedy, 2 sampled.
      if (r < slots) {
        row.repetition_penalty = penalties[r];
        row.seen_slot = r;
        row.clear_slot = step == 0;
        row.new_ids_begin = int(new_ids.size());
        const float* lr = logits.data() + int64_t(r) * vocab;
        // The row's argmax first, so that row 0 (greedy, > 1) must move; then the "prompt", or one token.
        const int n = step == 0 ? 300 : 1;
        for (int i = 0; i < n; ++i) {
          const int id = i == 0 ? int(std::max_element(lr, lr + vocab) - lr) : int(rng() % vocab);
          new_ids.push_back(id);
          ids[r].insert(id);
        }
        if (step == 0 && r == 0) new_ids.push_back(vocab);  // Outside the vocabulary: skipped.
        row.new_ids_count = int(new_ids.size()) - row.new_ids_begin;
      }
      params.push_back(row);
    }
    seen.new_ids = new_ids.data();
    std::vector<int> got(rows);
    sample_rows(got.data(), nullptr, ShardedLogits{logits.data(), rows, vocab, 1}, params.data(), seen, {}, &scratch);
    for (int r = 0; r < rows; ++r) {
      std::vector<float> row(logits.begin() + int64_t(r) * vocab, logits.begin() + int64_t(r + 1) * vocab);
      if (r < slots)
        for (int id : ids[r]) row[id] = row[id] > 0 ? row[id] / penalties[r] : row[id] * penalties[r];
      EXPECT_EQ(got[r], sample_token(row.data(), vocab, params[r], &scratch)) << "step " << step << ", row " << r;
      const int plain = sample_token(logits.data() + int64_t(r) * vocab, vocab, params[r], &scratch);
      if (r == 0) changed += got[r] != plain;
      if (r >= slots) EXPECT_EQ(got[r], plain);
    }
  }
  EXPECT_EQ(changed, 2);  // Row 0's argmax was seen and penalised, at each step.
  for (int slot = 0; slot < slots; ++slot)
    for (int id = 0; id < vocab; ++id)
      EXPECT_EQ(is_seen(seen.slot(slot), id), ids[slot].count(id) == 1) << "slot " << slot << ", id " << id;
}

TEST(SharedMemoryCommunicator, AllReduceAndGatherAcrossThreads) {
  const int n = 4, count = 1000;
  auto group = engine::make_shared_memory_group(n);
  std::vector<std::vector<float>> bufs(n), gathered(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      for (int iter = 0; iter < 50; ++iter) {
        bufs[r].assign(count + iter, float(r + 1));
        group[r]->all_reduce_sum(bufs[r].data(), count + iter);
        for (float x : bufs[r]) ASSERT_EQ(x, 10.0f);
      }
      std::vector<float> mine(3, float(r));
      gathered[r].resize(3 * n);
      group[r]->all_gather(mine.data(), 3, gathered[r].data());
    });
  for (auto& t : threads) t.join();
  for (int r = 0; r < n; ++r)
    for (int i = 0; i < 3 * n; ++i) EXPECT_EQ(gathered[r][i], float(i / 3));
}

}  // namespace
}  // namespace pdserve::kernels::cpu
