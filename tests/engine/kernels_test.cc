// CPU kernels against naive formulas, paged attention through every block layout against dense
// attention over the same K/V, and sampling from logits gathered over TP ranks, with its logit
// edits, penalties and log-probabilities against hand-computed values.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <chrono>
#include <cmath>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "engine/communicator.h"
#include "engine/kv_cache_layout.h"
#include "engine/rope_scaling.h"
#include "engine/spin_barrier.h"
#include "engine/tp_shard.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/paged_attention.h"
#include "kernels/cpu/sampling.h"
#include "tests/engine/gathered_logits.h"
#include "tests/engine/random_floats.h"

namespace pdserve::kernels::cpu {
namespace {

using ::pdserve::testing::random_vec;

// The fused residual add + norm the forward pass uses between sublayers: the same bits as the
// add and the norm one after the other, so the CPU engine's tokens stay what they were.
TEST(Kernels, AddRmsNormEqualsAddThenNormBitForBit) {
  const int rows = 3, dim = 67;
  const std::vector<float> x = random_vec(rows * dim, 1), r = random_vec(rows * dim, 2), w = random_vec(dim, 3);
  std::vector<float> want_x = x, want(rows * dim), got_x = x, got(rows * dim);
  add_inplace(want_x.data(), r.data(), rows * dim);
  rms_norm(want.data(), want_x.data(), w.data(), rows, dim, 1e-5f);
  add_rms_norm(got.data(), got_x.data(), r.data(), w.data(), rows, dim, 1e-5f);
  EXPECT_EQ(got_x, want_x);
  EXPECT_EQ(got, want);
}

// The logits rows' norm: rows picked by index (repeated, reordered) with the bits of copying
// them out and norming the copies.
TEST(Kernels, GatherRmsNormEqualsCopyThenNormBitForBit) {
  const int rows = 5, dim = 67;
  const std::vector<float> x = random_vec(rows * dim, 4), w = random_vec(dim, 5);
  const std::vector<int> ids = {3, 0, 3, 4};
  std::vector<float> copied, want(ids.size() * dim), got(ids.size() * dim);
  for (int id : ids) copied.insert(copied.end(), x.begin() + id * dim, x.begin() + (id + 1) * dim);
  rms_norm(want.data(), copied.data(), w.data(), int(ids.size()), dim, 1e-5f);
  gather_rms_norm(got.data(), x.data(), ids.data(), w.data(), int(ids.size()), dim, 1e-5f);
  EXPECT_EQ(got, want);
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

// Attention's input stage in one pass computes the bits of the separate calls it replaced
// (biases, head norms, RoPE, then the KV write), from fused [q | k | v] rows and from three
// buffers, with and without Qwen2's biases and Qwen3's head norms, in both pair layouts.
TEST(Kernels, QkvRopeWriteEqualsItsPartsBitForBit) {
  using namespace engine;
  const int nq = 4, nkv = 2, hd = 10, block = 4, blocks = 4, n = 7;
  const int64_t qw = nq * hd, kvw = nkv * hd, width = qw + 2 * kvw;
  KvCacheSpec spec;
  spec.block_size = block;
  spec.layers = {
      {KvKind::kKv, KvSharding::kByHead, nkv, hd, hd, DType::kF32, KvLayout::kSeparate, KvOrder::kHeadMajor, 0}};
  auto layout = KvCacheLayout::create(spec, 0, 1, blocks);
  ASSERT_TRUE(layout.ok());
  const std::vector<int> table = {3, 0, 2, 1}, pos = {0, 1, 2, 3, 4, 5, 6};
  std::vector<const int*> tables(n, table.data());
  const TokenPlacement place{n, pos.data(), tables.data()};
  const std::vector<float> fused = random_vec(n * width, 7), bias = random_vec(width, 8), norm = random_vec(hd, 9);
  const std::vector<float> inv_freq = engine::rope_frequencies({}, 10000.0f, hd, 64).inv_freq;
  for (bool rotate_half : {false, true})
    for (bool extras : {false, true}) {
      // The separate calls on three compact buffers.
      std::vector<float> q(n * qw), k(n * kvw), v(n * kvw);
      for (int t = 0; t < n; ++t) {
        std::copy_n(&fused[t * width], qw, &q[t * qw]);
        std::copy_n(&fused[t * width + qw], kvw, &k[t * kvw]);
        std::copy_n(&fused[t * width + qw + kvw], kvw, &v[t * kvw]);
      }
      if (extras) {
        add_bias(q.data(), bias.data(), n, qw);
        add_bias(k.data(), bias.data() + qw, n, kvw);
        add_bias(v.data(), bias.data() + qw + kvw, n, kvw);
        rms_norm(q.data(), q.data(), norm.data(), n * nq, hd, 1e-6f);
        rms_norm(k.data(), k.data(), norm.data(), n * nkv, hd, 1e-6f);
      }
      rope(q.data(), n, qw, nq, hd, pos.data(), inv_freq.data(), 1.5f, rotate_half);
      rope(k.data(), n, kvw, nkv, hd, pos.data(), inv_freq.data(), 1.5f, rotate_half);
      std::vector<float> want_cache(layout->total_bytes() / 4);
      paged_kv_write(layout->view(0, reinterpret_cast<uint8_t*>(want_cache.data())), place, k.data(), kvw, v.data(),
                     kvw, nkv);
      for (bool fused_rows : {false, true}) {
        QkvRows rows;
        std::vector<float> sq(n * qw), sk(n * kvw), sv(n * kvw);  // The unfused inputs.
        if (fused_rows) {
          rows = {fused.data(), fused.data() + qw, fused.data() + qw + kvw, width, width, width};
        } else {
          for (int t = 0; t < n; ++t) {
            std::copy_n(&fused[t * width], qw, &sq[t * qw]);
            std::copy_n(&fused[t * width + qw], kvw, &sk[t * kvw]);
            std::copy_n(&fused[t * width + qw + kvw], kvw, &sv[t * kvw]);
          }
          rows = {sq.data(), sk.data(), sv.data(), qw, kvw, kvw};
        }
        rows.n_q_heads = nq;
        rows.n_kv_heads = nkv;
        if (extras) {
          rows.q_bias = bias.data();
          rows.k_bias = bias.data() + qw;
          rows.v_bias = bias.data() + qw + kvw;
          rows.q_norm = rows.k_norm = norm.data();
          rows.norm_eps = 1e-6f;
        }
        std::vector<float> got_q(n * qw), got_cache(layout->total_bytes() / 4);
        qkv_rope_write(got_q.data(), rows, {inv_freq.data(), 1.5f, rotate_half},
                       layout->view(0, reinterpret_cast<uint8_t*>(got_cache.data())), place);
        const std::string what = std::string(fused_rows ? "fused" : "separate") + " rows, rotate_half " +
                                 std::to_string(rotate_half) + ", biases and norms " + std::to_string(extras);
        EXPECT_EQ(got_q, q) << what;
        EXPECT_EQ(got_cache, want_cache) << what;
      }
    }
}

// SwiGLU's product from the two halves of fused gate_up rows, and in place on compact ones.
TEST(Kernels, SiluMulOnFusedHalvesAndInPlace) {
  const int rows = 3, cols = 5;
  const std::vector<float> gu = random_vec(rows * 2 * cols, 10);
  std::vector<float> fused_out(rows * cols), gate(rows * cols), up(rows * cols);
  for (int r = 0; r < rows; ++r) {
    std::copy_n(&gu[r * 2 * cols], cols, &gate[r * cols]);
    std::copy_n(&gu[r * 2 * cols + cols], cols, &up[r * cols]);
  }
  silu_mul(fused_out.data(), gu.data(), gu.data() + cols, rows, cols, 2 * cols);
  std::vector<float> in_place = gate;
  silu_mul(in_place.data(), in_place.data(), up.data(), rows, cols, cols);
  for (int i = 0; i < rows * cols; ++i) {
    const double g = gate[i];
    EXPECT_NEAR(fused_out[i], g / (1 + std::exp(-g)) * up[i], 1e-6) << i;
  }
  EXPECT_EQ(in_place, fused_out);
}

struct LayoutCase {
  engine::KvLayout layout;
  engine::KvOrder order;
  int window;
};

class PagedAttentionTest : public ::testing::TestWithParam<LayoutCase> {};

TEST_P(PagedAttentionTest, EqualsDenseAttention) {
  using namespace engine;
  const int heads = 2, q_per_kv = 2, hd = 12, block = 4, seq = 11, blocks = 6;  // hd: a lane vector and a remainder.
  KvCacheSpec spec;
  spec.block_size = block;
  spec.layers = {{KvKind::kKv, KvSharding::kByHead, heads, hd, hd, DType::kF32, GetParam().layout,
                  GetParam().order, GetParam().window}};
  auto layout = KvCacheLayout::create(spec, 0, 1, blocks);
  ASSERT_TRUE(layout.ok());
  std::vector<float> arena(layout->total_bytes() / 4);
  auto* base = reinterpret_cast<uint8_t*>(arena.data());
  const PagedLayerView view = layout->view(0, base);
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

// The CPU kernels' dot product (kernels/cpu/lanes.h): eight partial sums, element k into sum
// k % 8 in order of k, added in the tree ((s0 + s4) + (s2 + s6)) + ((s1 + s5) + (s3 + s7)).
float lanes_dot(const float* a, const float* b, int n) {
  float s[8] = {};
  for (int k = 0; k < n; ++k) s[k % 8] += a[k] * b[k];
  return ((s[0] + s[4]) + (s[2] + s[6])) + ((s[1] + s[5]) + (s[3] + s[7]));
}

// The attention a key at a time, as the kernel computed it before it scored eight keys at once
// (reduce_lanes_x8): each score lanes_dot(q, K[j]) * scale, softmax in order of j, weights
// score / sum, and out = the weighted V rows summed in order of j from 0.
std::vector<float> one_key_at_a_time(const std::vector<float>& q, const std::vector<float>& k,
                                     const std::vector<float>& v, const std::vector<uint8_t>& hidden, int pos,
                                     int q_heads, int q_per_kv, int hd, float scale) {
  const int kv_heads = q_heads / q_per_kv;
  std::vector<float> out(q_heads * hd);
  for (int h = 0; h < q_heads; ++h) {
    const int g = h / q_per_kv;
    std::vector<float> s(pos + 1);
    float mx = -INFINITY;
    for (int j = 0; j <= pos; ++j) {
      s[j] = hidden[j] ? -INFINITY : lanes_dot(&q[h * hd], &k[(j * kv_heads + g) * hd], hd) * scale;
      mx = std::max(mx, s[j]);
    }
    float sum = 0.0f;
    for (float& x : s) sum += (x = std::exp(x - mx));
    for (int j = 0; j <= pos; ++j) {
      if (hidden[j]) continue;
      const float w = s[j] / sum;
      for (int d = 0; d < hd; ++d) out[h * hd + d] += w * v[(j * kv_heads + g) * hd + d];
    }
  }
  return out;
}

// Scoring eight keys at once changes no bit: against the key-at-a-time reference for head dims
// of one lane vector, with a remainder, and of several vectors, contexts that end inside and at
// the end of a group of eight, and hidden blocks.
TEST(PagedAttention, EqualsTheKeyAtATimeReferenceBitForBit) {
  const int block = 4, q_per_kv = 2, kv_heads = 2, q_heads = kv_heads * q_per_kv;
  for (const int hd : {8, 12, 64}) {
    for (const int pos : {0, 6, 7, 15, 16, 38}) {
      for (const bool masked : {false, true}) {
        const int keys = pos + 1, blocks = (keys + block - 1) / block;
        std::vector<float> k = random_vec(keys * kv_heads * hd, 31 + hd + pos);
        std::vector<float> v = random_vec(keys * kv_heads * hd, 32 + hd + pos);
        const std::vector<float> q = random_vec(q_heads * hd, 33 + hd + pos);
        // The cache: one block per table entry, token-major, laid out in reverse block order.
        std::vector<float> kc(blocks * block * kv_heads * hd), vc(kc.size());
        std::vector<int> table(blocks);
        for (int b = 0; b < blocks; ++b) table[b] = blocks - 1 - b;
        PagedLayerView view;
        view.k = kc.data();
        view.v = vc.data();
        view.block_size = block;
        view.head_dim = view.v_head_dim = hd;
        view.k_block_stride = view.v_block_stride = int64_t(block) * kv_heads * hd;
        view.k_token_stride = view.v_token_stride = int64_t(kv_heads) * hd;
        view.k_head_stride = view.v_head_stride = hd;
        std::vector<int> positions(keys);
        std::iota(positions.begin(), positions.end(), 0);
        std::vector<const int*> tables(keys, table.data());
        paged_kv_write(view, TokenPlacement{keys, positions.data(), tables.data()}, k.data(), kv_heads * hd, v.data(),
                       kv_heads * hd, kv_heads);
        // Masked: every other block but the token's own hidden.
        std::vector<uint8_t> block_mask(blocks, 1), hidden(keys, 0);
        if (masked)
          for (int b = 0; b + 1 < blocks; b += 2) block_mask[b] = 0;
        for (int j = 0; j < keys; ++j) hidden[j] = block_mask[j / block] == 0;
        const int* one_table = table.data();
        TokenPlacement one{1, &pos, &one_table, block_mask.data(), blocks};
        std::vector<float> out(q_heads * hd);
        paged_attention(out.data(), q.data(), view, one, q_heads, q_per_kv, 0, 0.3f);
        const std::vector<float> want = one_key_at_a_time(q, k, v, hidden, pos, q_heads, q_per_kv, hd, 0.3f);
        for (size_t i = 0; i < out.size(); ++i)
          ASSERT_EQ(std::bit_cast<uint32_t>(out[i]), std::bit_cast<uint32_t>(want[i]))
              << "hd " << hd << ", position " << pos << (masked ? ", masked" : "") << ", element " << i;
      }
    }
  }
}

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
      if (r >= slots) {
        EXPECT_EQ(got[r], plain);
      }
    }
  }
  EXPECT_EQ(changed, 2);  // Row 0's argmax was seen and penalised, at each step.
  for (int slot = 0; slot < slots; ++slot)
    for (int id = 0; id < vocab; ++id)
      EXPECT_EQ(is_seen(seen.slot(slot), id), ids[slot].count(id) == 1) << "slot " << slot << ", id " << id;
}

// One row through sample_rows, for the hand-computed cases below: `logits` is the row, the
// edits its own, `seen` (when given) one slot's state, `logprobs` (when given) filled.
struct OneRow {
  std::vector<LogitBias> biases;
  std::vector<int> banned;
  std::vector<int> new_ids;
};
int sample_one(const std::vector<float>& logits, SampleRow row, const OneRow& edits = {}, SeenTokens seen = {},
               RowLogprobs* logprobs = nullptr) {
  row.bias_begin = row.banned_begin = row.new_ids_begin = 0;
  row.bias_count = int(edits.biases.size());
  row.banned_count = int(edits.banned.size());
  if (row.seen_slot >= 0) row.new_ids_count = int(edits.new_ids.size());
  seen.new_ids = edits.new_ids.data();
  SampleScratch scratch;
  int token = -1;
  sample_rows(&token, logprobs, ShardedLogits{logits.data(), 1, int(logits.size()), 1}, &row, seen,
              LogitEdits{edits.biases.data(), edits.banned.data()}, &scratch);
  return token;
}

// A slot's penalty state over `slots` slots of `vocab` ids, kept across steps as the engine keeps it.
struct SlotState {
  int vocab;
  std::vector<uint32_t> bits;
  std::vector<int32_t> counts;
  SlotState(int vocab, int slots, uint32_t bit_fill = 0u, int32_t count_fill = 0)
      : vocab(vocab),
        bits(size_t(slots) * SeenTokens{nullptr, nullptr, nullptr, vocab}.words_per_slot(), bit_fill),
        counts(size_t(slots) * vocab, count_fill) {}
  SeenTokens view() { return {bits.data(), counts.data(), nullptr, vocab}; }
};

SampleRow greedy() { return SampleRow{}; }
SampleRow with_slot(SampleRow row, float repetition, float frequency, float presence) {
  row.seen_slot = 0;
  row.repetition_penalty = repetition;
  row.frequency_penalty = frequency;
  row.presence_penalty = presence;
  return row;
}

// logit_bias and banned ids on greedy rows of {1, 2, 3, 0.5}: the argmax is id 2 unedited.
TEST(LogitEdits, BiasAndBannedIdsMoveTheArgmax) {
  const std::vector<float> logits = {1.0f, 2.0f, 3.0f, 0.5f};
  struct Case {
    const char* name;
    OneRow edits;
    int want;
  };
  const std::vector<Case> cases = {
      {"none", {}, 2},
      {"bias flips the argmax", {{{0, 2.5f}}}, 0},  // 3.5 > 3.
      {"bias just short", {{{0, 1.9f}}}, 2},        // 2.9 < 3.
      {"+100", {{{3, 100.0f}}}, 3},
      {"-100 on the max", {{{2, -100.0f}}}, 1},
      {"every entry added", {{{1, 0.6f}, {1, 0.6f}}}, 1},  // 3.2 > 3; one entry alone is not.
      {"one entry of those", {{{1, 0.6f}}}, 2},
      {"ids outside the vocabulary skipped", {{{-1, 100.0f}, {4, 100.0f}}}, 2},
      {"banned max", {{}, {2}}, 1},
      {"banned two", {{}, {2, 1}}, 0},
      {"banned after the bias", {{{2, 100.0f}}, {2}}, 1},
      {"banned outside the vocabulary skipped", {{}, {7, -3}}, 2},
  };
  for (const Case& c : cases) EXPECT_EQ(sample_one(logits, greedy(), c.edits), c.want) << c.name;
  // A sampled row never draws a banned id, at any draw, even the row's most likely.
  for (double u : {0.0, 0.3, 0.7, 1.0 - 1e-12}) {
    const SampleRow row{1.0f, 0, 1.0f, u};
    EXPECT_EQ(sample_one(logits, row, {{}, {0, 1, 2}}), 3) << u;
    const int got = sample_one(logits, row, {{}, {2}});
    EXPECT_NE(got, 2) << u;
  }
}

// The frequency and presence penalties on output counts, at the thresholds where they move a
// greedy token off id 1 (2.5) to id 0 (2.0): id 1 is in the output twice, so f subtracts 2f
// (flips above f = 0.25) and p subtracts p once (flips above p = 0.5).
TEST(CountPenalties, FrequencyTimesCountPresenceOnce) {
  const std::vector<float> logits = {2.0f, 2.5f};
  struct Case {
    float frequency, presence;
    int want;
  };
  const std::vector<Case> cases = {{0.0f, 0.0f, 1},  {0.24f, 0.0f, 1}, {0.26f, 0.0f, 0},
                                   {0.0f, 0.3f, 1},  {0.0f, 0.49f, 1}, {0.0f, 0.51f, 0},
                                   {0.1f, 0.25f, 1}, {0.1f, 0.35f, 0}, {-1.0f, 0.0f, 1}};
  for (const Case& c : cases) {
    SlotState state(2, 1);
    SampleRow row = with_slot(greedy(), 1.0f, c.frequency, c.presence);
    row.clear_slot = true;
    EXPECT_EQ(sample_one(logits, row, {{}, {}, {1, 1}}, state.view()), c.want)
        << "frequency " << c.frequency << " presence " << c.presence;
    EXPECT_EQ(state.counts, (std::vector<int32_t>{0, 2}));
  }
  // The exact values, in double then rounded once.
  EXPECT_EQ(penalize_counted(2.5f, 2, 0.25f, 0.0f), 2.0f);
  EXPECT_EQ(penalize_counted(2.5f, 3, 0.5f, 0.25f), 0.75f);
  EXPECT_EQ(penalize_counted(2.5f, 0, 0.5f, 0.25f), 2.5f);
  EXPECT_EQ(penalize_counted(-INFINITY, 4, 0.5f, 0.25f), -INFINITY);
}

// The order: logit_bias, then repetition, then frequency/presence. Each case picks a different
// token in any other order: id 1 at logit x, seen once in the output, against id 0 at `other`.
TEST(CountPenalties, BiasThenRepetitionThenFrequency) {
  struct Case {
    float x, other, bias, repetition, frequency;
    int want;
  };
  const std::vector<Case> cases = {
      // 3 / 2 - 1 = 0.5 < 0.8; frequency first: (3 - 1) / 2 = 1 > 0.8.
      {3.0f, 0.8f, 0.0f, 2.0f, 1.0f, 0},
      // -1 * 2 - 1 = -3 > -3.5; frequency first: (-1 - 1) * 2 = -4 < -3.5.
      {-1.0f, -3.5f, 0.0f, 2.0f, 1.0f, 1},
      // (1 + 1) / 2 = 1 < 1.2; bias after the penalty: 1 / 2 + 1 = 1.5 > 1.2.
      {1.0f, 1.2f, 1.0f, 2.0f, 0.0f, 0},
      // (-1 + 2) / 2 = 0.5 > 0.3; bias after: -1 * 2 + 2 = 0 < 0.3.
      {-1.0f, 0.3f, 2.0f, 2.0f, 0.0f, 1},
  };
  for (const Case& c : cases) {
    SlotState state(2, 1);
    SampleRow row = with_slot(greedy(), c.repetition, c.frequency, 0.0f);
    row.clear_slot = true;
    OneRow edits{{{1, c.bias}}, {}, {1}};
    EXPECT_EQ(sample_one({c.other, c.x}, row, edits, state.view()), c.want) << "x " << c.x << " other " << c.other;
  }
}

// Of a step's new ids, those before new_output_from are the prompt: in the bitmap (the
// repetition penalty) but not counted (frequency, presence).
TEST(CountPenalties, PromptIdsAreSeenButNotCounted) {
  SlotState state(4, 1, ~0u, 7);  // Left by an earlier sequence.
  SampleRow row = with_slot(greedy(), 1.0f, 0.0f, 1.0f);
  row.clear_slot = true;
  row.new_output_from = 2;
  // Prompt {1, 1}, output {0, 3, 3}: id 1 keeps 2.5, id 0 drops to 1.0.
  EXPECT_EQ(sample_one({2.0f, 2.5f, 0.0f, 1.0f}, row, {{}, {}, {1, 1, 0, 3, 3}}, state.view()), 1);
  EXPECT_EQ(state.counts, (std::vector<int32_t>{1, 0, 0, 2}));
  EXPECT_EQ(state.bits[0], 0b1011u);
  // The next step's new id is an output token: id 1 is counted now, and the presence penalty
  // moves the argmax to id 2 (id 1 at 1.5, id 0 at 1.0).
  row.clear_slot = false;
  row.new_output_from = 0;
  EXPECT_EQ(sample_one({2.0f, 2.5f, 1.8f, 1.0f}, row, {{}, {}, {1}}, state.view()), 2);
  EXPECT_EQ(state.counts, (std::vector<int32_t>{1, 1, 0, 2}));
}

// clear_slot empties the counts as well as the bitmap: a slot reused by a new sequence carries
// no penalty from the last.
TEST(CountPenalties, ClearSlotZeroesTheCounts) {
  SlotState state(3, 2, ~0u, 5);
  std::fill(state.counts.begin() + 4, state.counts.end(), 0);  // Slot 1: {5, 0, 0}.
  SampleRow row = with_slot(greedy(), 1.0f, 1.0f, 1.0f);
  row.seen_slot = 1;
  // Not cleared: id 0 drops by 6 to -5.
  EXPECT_EQ(sample_one({1.0f, 0.0f, 0.5f}, row, {}, state.view()), 2);
  // Cleared, then id 2 counted once: id 2 drops to -1.5 and id 0 keeps 1 (-5 if its count stayed).
  row.clear_slot = true;
  EXPECT_EQ(sample_one({1.0f, 0.0f, 0.5f}, row, {{}, {}, {2}}, state.view()), 0);
  EXPECT_EQ(state.counts, (std::vector<int32_t>{5, 5, 5, 0, 0, 1}));
  EXPECT_EQ(state.bits, (std::vector<uint32_t>{~0u, 0b100u}));
}

// add_sampled: the token a row samples joins its slot after it is sampled (not penalised in its
// own step), counted as output; the next step, with no new ids, penalises it. A row without it
// leaves the slot as its new ids made it.
TEST(CountPenalties, ASampledTokenJoinsTheSlotWhenAddSampled) {
  for (bool add : {true, false}) {
    SlotState state(3, 1, ~0u, 9);  // Left by an earlier sequence.
    SampleRow row = with_slot(greedy(), 1.0f, 0.0f, 1.0f);
    row.clear_slot = true;
    row.add_sampled = add;
    row.new_output_from = 1;
    // Prompt {2} (seen, not counted): the argmax, id 1, is sampled unpenalised.
    EXPECT_EQ(sample_one({2.0f, 2.5f, 0.0f}, row, {{}, {}, {2}}, state.view()), 1) << add;
    EXPECT_EQ(state.counts, (std::vector<int32_t>{0, add ? 1 : 0, 0})) << add;
    EXPECT_EQ(state.bits[0], add ? 0b110u : 0b100u) << add;
    // Next step, nothing uploaded: with id 1 in the slot the presence penalty moves the argmax to 0.
    row.clear_slot = false;
    row.new_output_from = 0;
    EXPECT_EQ(sample_one({2.0f, 2.5f, 0.0f}, row, {}, state.view()), add ? 0 : 1) << add;
    EXPECT_EQ(state.counts, (std::vector<int32_t>{add ? 1 : 0, add ? 1 : 0, 0})) << add;
  }
}

// log_softmax by hand: of {1, 2, 3, 3}, normalised by log(e + e^2 + 2e^3).
TEST(Logprobs, LogSoftmaxOfTheRawRowTopIdsAndTies) {
  const std::vector<float> logits = {1.0f, 2.0f, 3.0f, 3.0f};
  const double lse = std::log(std::exp(1.0) + std::exp(2.0) + 2.0 * std::exp(3.0));
  struct Case {
    int top, of;
    std::vector<int> ids;
    double of_logit;
  };
  const std::vector<Case> cases = {
      {3, 0, {2, 3, 1}, 1.0},      // The tie 2, 3: the lower id first.
      {0, 1, {}, 2.0},             // No alternatives, one token's.
      {4, -1, {2, 3, 1, 0}, 3.0},  // -1: of the sampled (greedy: 2).
      {9, 3, {2, 3, 1, 0}, 3.0},   // No more than the vocabulary.
      {2, 4, {2, 3}, -INFINITY},   // Outside the vocabulary: -inf.
  };
  for (const Case& c : cases) {
    SampleRow row = greedy();
    row.logprobs = c.top;
    row.logprob_of = c.of;
    RowLogprobs lp;
    EXPECT_EQ(sample_one(logits, row, {}, {}, &lp), 2);
    ASSERT_EQ(lp.top_count, int(c.ids.size())) << c.top;
    for (int j = 0; j < lp.top_count; ++j) {
      EXPECT_EQ(lp.top_ids[j], c.ids[j]) << c.top << " #" << j;
      EXPECT_NEAR(lp.top_logprobs[j], logits[c.ids[j]] - lse, 1e-6) << c.top << " #" << j;
    }
    if (std::isinf(c.of_logit))
      EXPECT_EQ(lp.logprob, -INFINITY) << c.of;
    else
      EXPECT_NEAR(lp.logprob, c.of_logit - lse, 1e-6) << c.of;
  }
  // Never more than kMaxLogprobs.
  SampleRow row = greedy();
  row.logprobs = 25;
  RowLogprobs lp;
  sample_one(std::vector<float>(30, 0.0f), row, {}, {}, &lp);
  ASSERT_EQ(lp.top_count, kMaxLogprobs);
  for (int j = 0; j < kMaxLogprobs; ++j) {
    EXPECT_EQ(lp.top_ids[j], j);
    EXPECT_NEAR(lp.top_logprobs[j], -std::log(30.0), 1e-6);
  }
}

// The sampled token's log-probability, for a sampled (not greedy) row, is its raw one; and a
// row that asks for none leaves its entry as it was.
TEST(Logprobs, OfTheSampledTokenAndOnlyForRowsThatAsk) {
  const std::vector<float> logits = {0.5f, 1.0f, 1.5f, -1.0f, 0.25f};
  double sum = 0.0;
  for (float x : logits) sum += std::exp(double(x));
  for (double u : {0.05, 0.4, 0.8, 0.97}) {
    SampleRow row{1.0f, 0, 1.0f, u};
    row.logprobs = 1;
    RowLogprobs lp;
    const int token = sample_one(logits, row, {}, {}, &lp);
    SampleScratch scratch;
    EXPECT_EQ(token, sample_token(logits.data(), int(logits.size()), row, &scratch));
    EXPECT_NEAR(lp.logprob, logits[token] - std::log(sum), 1e-6) << u;
    EXPECT_EQ(lp.top_ids[0], 2);
  }
  RowLogprobs untouched;
  untouched.logprob = 42.0f;
  untouched.top_count = 3;
  sample_one(logits, greedy(), {}, {}, &untouched);
  EXPECT_EQ(untouched.logprob, 42.0f);
  EXPECT_EQ(untouched.top_count, 3);
}

// Log-probabilities are of the raw logits (vLLM's raw_logprobs) even when bias, banned ids and
// every penalty change the token.
TEST(Logprobs, OfTheRawLogitsWhateverTheEdits) {
  const std::vector<float> logits = {1.0f, 2.0f, 3.0f, 3.0f};
  const double lse = std::log(std::exp(1.0) + std::exp(2.0) + 2.0 * std::exp(3.0));
  SlotState state(4, 1);
  SampleRow row = with_slot(greedy(), 3.0f, 1.0f, 0.5f);
  row.clear_slot = true;
  row.logprobs = 4;
  RowLogprobs lp;
  // 1 + 10 = 11 beats 3 (banned), 3 / 3 - 1.5 (id 3, seen once) and 2.
  EXPECT_EQ(sample_one(logits, row, {{{0, 10.0f}}, {2}, {3}}, state.view(), &lp), 0);
  ASSERT_EQ(lp.top_count, 4);
  const int ids[] = {2, 3, 1, 0};
  for (int j = 0; j < 4; ++j) {
    EXPECT_EQ(lp.top_ids[j], ids[j]);
    EXPECT_NEAR(lp.top_logprobs[j], logits[ids[j]] - lse, 1e-6);
  }
  EXPECT_NEAR(lp.logprob, 1.0 - lse, 1e-6);  // The sampled id 0's raw log-probability.
}

// NaN counts as -inf (ranked with them, the lower id first; no mass); +inf logits share the
// mass; a row with nothing above -inf has none to share.
TEST(Logprobs, NanAndInfiniteLogits) {
  const float nan = std::nanf("");
  struct Case {
    std::vector<float> logits;
    std::vector<int> ids;
    std::vector<double> want;
  };
  const double half = -std::log(2.0);
  const std::vector<Case> cases = {
      {{nan, 1.0f, nan, 1.0f}, {1, 3, 0, 2}, {half, half, -INFINITY, -INFINITY}},
      {{INFINITY, 0.0f, INFINITY}, {0, 2, 1}, {half, half, -INFINITY}},
      {{-INFINITY, nan, -INFINITY}, {0, 1, 2}, {-INFINITY, -INFINITY, -INFINITY}},
      {{nan, -INFINITY, 5.0f}, {2, 0, 1}, {0.0, -INFINITY, -INFINITY}},
  };
  for (const Case& c : cases) {
    RowLogprobs lp;
    row_logprobs(c.logits.data(), int(c.logits.size()), 1, 5, &lp);
    ASSERT_EQ(lp.top_count, int(c.logits.size()));
    for (int j = 0; j < lp.top_count; ++j) {
      EXPECT_EQ(lp.top_ids[j], c.ids[j]) << c.logits[0] << " #" << j;
      if (std::isinf(c.want[j]))
        EXPECT_EQ(lp.top_logprobs[j], float(c.want[j])) << c.logits[0] << " #" << j;
      else
        EXPECT_NEAR(lp.top_logprobs[j], c.want[j], 1e-6) << c.logits[0] << " #" << j;
    }
  }
}

// Every feature at once on random rows over several steps (counts carried in the slots), against
// the module comment's formulas applied by hand, from plain rows and rows gathered over 2-4 TP
// shards, which must give the plain rows' tokens and log-probabilities bit for bit.
TEST(SampleRows, EveryFeatureAgainstTheFormulasPlainAndSharded) {
  const int vocab = 61, rows = 7, slots = 7, steps = 4;
  std::mt19937 rng(17);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  const auto pick = [&rng](int n) { return int(rng() % unsigned(n)); };
  struct Step {
    std::vector<float> logits;
    std::vector<SampleRow> params;
    std::vector<LogitBias> biases;
    std::vector<int> banned, new_ids;
    std::vector<std::vector<int>> prompts;  // Of each row, at the first step.
  };
  // The steps' inputs; the new ids after the first are each row's previous (plain) token.
  std::vector<Step> plan(steps);
  for (Step& s : plan) {
    s.logits.resize(size_t(rows) * vocab);
    for (float& x : s.logits) x = normal(rng);
    for (int r = 0; r < rows; ++r) {
      float* row = s.logits.data() + r * vocab;
      if (r % 3 == 0)
        for (int i = 0; i < vocab; ++i) row[i] = std::round(row[i] * 2.0f) / 2.0f;  // Ties.
      if (r == 4) row[pick(vocab)] = std::nanf("");
      SampleRow p{r % 3 == 0 ? 0.0f : 0.8f, r == 2 ? 6 : 0, r == 5 ? 0.85f : 1.0f, uniform(rng)};
      if (r != rows - 1) {  // The last row has no slot.
        p.seen_slot = (r + 3) % slots;
        p.repetition_penalty = r % 2 ? 1.3f : 0.8f;
        p.frequency_penalty = r % 3 == 1 ? -0.2f : 0.6f;
        p.presence_penalty = r % 4 == 0 ? 0.0f : 0.9f;
      }
      p.bias_begin = int(s.biases.size());
      for (int b = pick(4); b > 0; --b) s.biases.push_back({pick(vocab + 2) - 1, float(normal(rng) * 3.0f)});
      if (r == 1) s.biases.push_back(s.biases.empty() ? LogitBias{3, 1.0f} : s.biases.back());  // A repeat.
      p.bias_count = int(s.biases.size()) - p.bias_begin;
      p.banned_begin = int(s.banned.size());
      for (int b = pick(3); b > 0; --b) s.banned.push_back(pick(vocab + 1));
      p.banned_count = int(s.banned.size()) - p.banned_begin;
      p.logprobs = std::vector<int>{-1, 0, 3, 20}[r % 4];
      p.logprob_of = r % 2 ? -1 : pick(vocab);
      s.params.push_back(p);
      s.prompts.emplace_back();
      for (int i = 0; i < 12; ++i) s.prompts.back().push_back(pick(vocab));
    }
  }
  struct Result {
    std::vector<int> tokens;
    std::vector<RowLogprobs> logprobs;
  };
  const auto run = [&](int shards) {
    SlotState state(vocab, slots, ~0u, 3);
    std::vector<Result> results;
    SampleScratch scratch;
    std::vector<int> previous;
    for (int step = 0; step < steps; ++step) {
      Step& s = plan[step];
      s.new_ids.clear();
      for (int r = 0; r < rows; ++r) {
        SampleRow& p = s.params[r];
        p.new_ids_begin = int(s.new_ids.size());
        p.clear_slot = step == 0;
        if (step == 0) {
          // The prompt, its last 2 counted as output (a preempted sequence's), an id skipped.
          s.new_ids.insert(s.new_ids.end(), s.prompts[r].begin(), s.prompts[r].end());
          p.new_output_from = 10;
          s.new_ids.push_back(vocab);
        } else {
          s.new_ids.push_back(previous[r]);
          p.new_output_from = 0;
        }
        p.new_ids_count = int(s.new_ids.size()) - p.new_ids_begin;
      }
      ShardedLogits logits{nullptr, rows, vocab, shards};
      const std::vector<float> gathered = pdserve::testing::gather_logits(s.logits, logits, std::nanf(""));
      logits.data = gathered.data();
      Result out{std::vector<int>(rows), std::vector<RowLogprobs>(rows)};
      SeenTokens seen = state.view();
      seen.new_ids = s.new_ids.data();
      sample_rows(out.tokens.data(), out.logprobs.data(), logits, s.params.data(), seen,
                  LogitEdits{s.biases.data(), s.banned.data()}, &scratch);
      previous = out.tokens;
      results.push_back(out);
    }
    return results;
  };

  // The formulas, by hand.
  const std::vector<Result> plain = run(1);
  std::vector<std::set<int>> seen(slots);
  std::vector<std::vector<int>> counts(slots, std::vector<int>(vocab, 0));
  int moved = 0;
  for (int step = 0; step < steps; ++step) {
    const Step& s = plan[step];
    for (int r = 0; r < rows; ++r) {
      const SampleRow& p = s.params[r];
      const float* raw = s.logits.data() + r * vocab;
      std::vector<float> row(raw, raw + vocab);
      if (p.seen_slot >= 0) {
        if (p.clear_slot) {
          seen[p.seen_slot].clear();
          counts[p.seen_slot].assign(vocab, 0);
        }
        for (int i = 0; i < p.new_ids_count; ++i) {
          const int id = s.new_ids[p.new_ids_begin + i];
          if (id >= vocab) continue;
          seen[p.seen_slot].insert(id);
          if (i >= p.new_output_from) ++counts[p.seen_slot][id];
        }
      }
      for (int i = 0; i < p.bias_count; ++i) {
        const LogitBias& b = s.biases[p.bias_begin + i];
        if (b.id >= 0 && b.id < vocab) row[b.id] += b.bias;
      }
      for (int i = 0; i < p.banned_count; ++i)
        if (s.banned[p.banned_begin + i] < vocab) row[s.banned[p.banned_begin + i]] = -INFINITY;
      if (p.seen_slot >= 0)
        for (int id = 0; id < vocab; ++id) {
          if (seen[p.seen_slot].count(id))
            row[id] = row[id] > 0 ? row[id] / p.repetition_penalty : row[id] * p.repetition_penalty;
          const int c = counts[p.seen_slot][id];
          row[id] = float(double(row[id]) - (double(p.frequency_penalty) * c + double(p.presence_penalty) * (c > 0)));
        }
      SampleScratch scratch;
      const int want = sample_token(row.data(), vocab, p, &scratch);
      EXPECT_EQ(plain[step].tokens[r], want) << "step " << step << ", row " << r;
      moved += want != sample_token(raw, vocab, p, &scratch);
      if (p.logprobs < 0) continue;
      // log_softmax in long double, NaN as -inf; the top by sorting.
      long double max = -INFINITY, sum = 0.0L;
      for (int i = 0; i < vocab; ++i)
        if (!std::isnan(raw[i])) max = std::max<long double>(max, raw[i]);
      for (int i = 0; i < vocab; ++i)
        if (!std::isnan(raw[i])) sum += std::exp((long double)raw[i] - max);
      const auto lp = [&](int id) {
        return std::isnan(raw[id]) ? -INFINITY : double((long double)raw[id] - max - std::log(sum));
      };
      std::vector<int> order(vocab);
      std::iota(order.begin(), order.end(), 0);
      const auto key = [raw](int i) { return std::isnan(raw[i]) ? -INFINITY : raw[i]; };
      std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return key(a) > key(b); });
      const RowLogprobs& got = plain[step].logprobs[r];
      ASSERT_EQ(got.top_count, p.logprobs);
      for (int j = 0; j < p.logprobs; ++j) {
        EXPECT_EQ(got.top_ids[j], order[j]) << "step " << step << ", row " << r << " #" << j;
        EXPECT_NEAR(got.top_logprobs[j], lp(order[j]), 1e-6) << "step " << step << ", row " << r << " #" << j;
      }
      const double of = lp(p.logprob_of >= 0 ? p.logprob_of : want);
      if (std::isinf(of))
        EXPECT_EQ(got.logprob, float(of));
      else
        EXPECT_NEAR(got.logprob, of, 1e-6) << "step " << step << ", row " << r;
    }
  }
  EXPECT_GT(moved, rows * steps / 3) << "the edits moved too few tokens to test them";
  for (int shards = 2; shards <= 4; ++shards) {
    const std::vector<Result> got = run(shards);
    for (int step = 0; step < steps; ++step) {
      EXPECT_EQ(got[step].tokens, plain[step].tokens) << shards << " shards, step " << step;
      for (int r = 0; r < rows; ++r) {
        const RowLogprobs &a = got[step].logprobs[r], &b = plain[step].logprobs[r];
        EXPECT_EQ(a.logprob, b.logprob) << shards << " shards, step " << step << ", row " << r;
        EXPECT_EQ(a.top_count, b.top_count);
        for (int j = 0; j < a.top_count; ++j) {
          EXPECT_EQ(a.top_ids[j], b.top_ids[j]);
          EXPECT_EQ(a.top_logprobs[j], b.top_logprobs[j]);
        }
      }
    }
  }
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

// broadcast: every rank ends with the root's ints, the root's unchanged, for each root in turn;
// the root rewrites its buffer right after each call, which no peer may still be reading.
TEST(SharedMemoryCommunicator, BroadcastFromEachRoot) {
  const int n = 3, count = 17;
  auto group = engine::make_shared_memory_group(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      std::vector<int> buf(count);
      for (int iter = 0; iter < 60; ++iter) {
        const int root = iter % n;
        for (int i = 0; i < count; ++i) buf[i] = r == root ? 1000 * iter + i : -1;
        group[r]->broadcast(buf.data(), count, root);
        for (int i = 0; i < count; ++i) EXPECT_EQ(buf[i], 1000 * iter + i) << "rank " << r << ", root " << root;
        if (r == root) std::fill(buf.begin(), buf.end(), -2);  // Its peers have read it.
      }
    });
  for (auto& t : threads) t.join();
  std::vector<int> one = {4, 5};
  engine::make_shared_memory_group(1)[0]->broadcast(one.data(), 2, 0);  // A group of one: nothing to do.
  EXPECT_EQ(one, (std::vector<int>{4, 5}));
}

TEST(SpinBarrier, NoThreadLeavesAPhaseBeforeAllArriveAndCompletionRunsOncePerPhase) {
  // Thread 0 is late now and then by more than the spin budget, so the others also take the
  // sleeping path (a lost wake-up there would hang this test).
  const int n = 3, phases = 400;
  int completions = 0;
  engine::SpinBarrier barrier(n, [&completions]() noexcept { ++completions; });
  std::vector<std::atomic<int>> at(n);
  std::vector<std::thread> threads;
  for (int t = 0; t < n; ++t)
    threads.emplace_back([&, t] {
      for (int phase = 1; phase <= phases; ++phase) {
        if (t == 0 && phase % 50 == 0) {
          const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(5);
          while (std::chrono::steady_clock::now() < until) engine::cpu_relax();
        }
        at[t].store(phase);
        barrier.arrive_and_wait();
        // EXPECT, not ASSERT: a thread that left the loop would strand the others in the barrier.
        for (int u = 0; u < n; ++u) EXPECT_GE(at[u].load(), phase) << "thread " << u << " had not arrived";
        barrier.arrive_and_wait();  // Nobody starts the next phase while another still checks.
      }
    });
  for (auto& th : threads) th.join();
  EXPECT_EQ(completions, 2 * phases);
}

}  // namespace
}  // namespace pdserve::kernels::cpu
