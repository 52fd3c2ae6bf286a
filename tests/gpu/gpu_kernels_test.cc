// The GPU kernels against the CPU reference kernels on the same random inputs, in the manner of
// llama.cpp's test-backend-ops (tolerances in kernel_test_util.h). The same file builds for a GPU
// (gpu_backend_tests) and for the CPU emulation of the kernels (gpu_emulated_tests,
// every build), where shapes are smaller.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <tuple>

#include "engine/gpu_backend.h"
#include "engine/kv_cache_layout.h"
#include "engine/model/float_convert.h"
#include "engine/rope_scaling.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/paged_attention.h"
#include "kernels/cpu/sampling.h"
#include "kernels/gpu/ops.h"
#include "tests/engine/gathered_logits.h"
#include "tests/gpu/kernel_test_util.h"

namespace pdserve::kernels {
namespace {

using engine::DType;
using engine::KvCacheLayout;
using engine::KvCacheSpec;
using engine::KvLayout;
using engine::KvOrder;
using engine::KvPart;
using gpu::Storage;

TEST(GpuKernels, RmsNormAndFusedResidual) {
  REQUIRE_GPU();
  for (int dim : {288, 4096}) {
    const int rows = 5;
    std::vector<float> x = random_vec(rows * dim, 1), r = random_vec(rows * dim, 2), w = random_vec(dim, 3);
    std::vector<float> want(rows * dim);
    cpu::rms_norm(want.data(), x.data(), w.data(), rows, dim, 1e-5f);
    Dev<float> dx(x), dr(r), dw(w), dout(rows * dim);
    gpu::rms_norm(dout.get(), dx.get(), dw.get(), rows, dim, 1e-5f, nullptr);
    EXPECT_LE(rel_error(dout.host(), want), kF32Tol) << "dim " << dim;

    // Rows picked by index, repeats and reordering included (the logits rows of a step).
    const std::vector<int> ids = {4, 0, 4, 2};
    std::vector<float> want_gathered(ids.size() * dim);
    cpu::gather_rms_norm(want_gathered.data(), x.data(), ids.data(), w.data(), ids.size(), dim, 1e-5f);
    Dev<int> dids(ids);
    Dev<float> dgathered(ids.size() * dim);
    gpu::gather_rms_norm(dgathered.get(), dx.get(), dids.get(), dw.get(), ids.size(), dim, 1e-5f, nullptr);
    EXPECT_LE(rel_error(dgathered.host(), want_gathered), kF32Tol) << "gathered, dim " << dim;

    std::vector<float> xr = x;
    cpu::add_inplace(xr.data(), r.data(), rows * dim);
    cpu::rms_norm(want.data(), xr.data(), w.data(), rows, dim, 1e-5f);
    gpu::add_rms_norm(dout.get(), dx.get(), dr.get(), dw.get(), rows, dim, 1e-5f, nullptr);
    EXPECT_LE(rel_error(dout.host(), want), kF32Tol);
    EXPECT_LE(rel_error(dx.host(), xr), kF32Tol) << "residual sum written back";
  }
}

// SwiGLU from the halves of fused gate_up rows and in place on compact ones, and the residual add.
TEST(GpuKernels, ElementwiseSwiGluAndResidual) {
  REQUIRE_GPU();
  const int rows = 7, cols = 333;
  const int64_t n = int64_t(rows) * cols;
  const std::vector<float> gu = random_vec(2 * n, 5);
  std::vector<float> want(n), g(n), u(n);
  for (int r = 0; r < rows; ++r) {
    std::copy_n(&gu[r * 2 * cols], cols, &g[r * cols]);
    std::copy_n(&gu[r * 2 * cols + cols], cols, &u[r * cols]);
  }
  cpu::silu_mul(want.data(), gu.data(), gu.data() + cols, rows, cols, 2 * cols);
  Dev<float> dgu(gu), dout(n), dg(g), du(u);
  gpu::silu_mul(dout.get(), dgu.get(), dgu.get() + cols, rows, cols, 2 * cols, nullptr);
  EXPECT_LE(rel_error(dout.host(), want), kF32Tol);
  gpu::silu_mul(dg.get(), dg.get(), du.get(), rows, cols, cols, nullptr);
  EXPECT_LE(rel_error(dg.host(), want), kF32Tol);
  cpu::add_inplace(want.data(), u.data(), n);
  gpu::add_inplace(dg.get(), du.get(), n, nullptr);
  EXPECT_LE(rel_error(dg.host(), want), kF32Tol);
}

// Negative ids are a previous step's sampled tokens, read on the device (asynchronous scheduling).
TEST(GpuKernels, EmbedF32AndBf16TablesAndSampledTokens) {
  REQUIRE_GPU();
  const int vocab = 50, dim = 96;
  std::vector<float> table = random_vec(vocab * dim, 8);
  std::vector<int> tokens = {3, 0, -2, 49, 3, -1, 17}, sampled = {12, 44};
  std::vector<float> want;
  for (int t : tokens) {
    const int id = t < 0 ? sampled[-1 - t] : t;
    want.insert(want.end(), table.begin() + id * dim, table.begin() + (id + 1) * dim);
  }
  Dev<float> dt(table), dout(tokens.size() * dim);
  Dev<int> dtok(tokens), dsampled(sampled);
  gpu::embed(dout.get(), dt.get(), Storage::kF32, dtok.get(), tokens.size(), dim, dsampled.get(), nullptr);
  EXPECT_EQ(dout.host(), want);
  std::vector<uint16_t> t16(table.size());
  for (size_t i = 0; i < table.size(); ++i) t16[i] = engine::f32_to_bf16(table[i]);
  Dev<uint16_t> dt16(t16);
  gpu::embed(dout.get(), dt16.get(), Storage::kBF16, dtok.get(), tokens.size(), dim, dsampled.get(), nullptr);
  EXPECT_LE(rel_error(dout.host(), want), kHalfTol);
}

// The device sampler's tokens for host `logits` laid out as `shape` (its data pointer unused)
// with `params`, `seen` (device memory, or none) and `scratch` (sample_scratch_floats of device
// memory, kept by a caller that reuses it; null: fresh).
std::vector<int> device_tokens(const std::vector<float>& logits, ShardedLogits shape,
                               const std::vector<SampleRow>& params, const SeenTokens& seen = {},
                               float* scratch = nullptr) {
  Dev<float> dlogits(logits), fresh(scratch ? 0 : size_t(sample_scratch_floats(shape.rows, shape.vocab)));
  Dev<SampleRow> dparams(params);
  Dev<int> dtokens(shape.rows);
  shape.data = dlogits.get();
  gpu::sample(dtokens.get(), nullptr, shape, dparams.get(), seen, {}, scratch ? scratch : fresh.get(), nullptr);
  return dtokens.host();
}

// Sampling on the device picks the reference's token (kernels/cpu/sampling.h) for greedy rows
// (ties, NaN, -inf), temperatures, top-k, top-p and both, on rows with many equal logits, from
// plain rows and rows gathered over TP shards, at random draws.
TEST(GpuKernels, SamplingMatchesCpuReference) {
  REQUIRE_GPU();
  std::mt19937 rng(21);
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  const std::vector<int> vocabs =
      kEmulated ? std::vector<int>{1, 7, 1000, 3001} : std::vector<int>{1000, 32000, 128256};
  for (int vocab : vocabs)
    for (int shards : {1, 3}) {
      std::vector<kernels::SampleRow> params;
      for (float t : {0.0f, 0.5f, 1.0f, 1.7f})
        for (int k : {0, 1, 5, 50, 2000})
          for (float p : {1.0f, 0.95f, 0.5f, 0.05f}) params.push_back({t, k, p, uniform(rng)});
      params.push_back({1.0f, 0, 1.0f, 1.0 - 1e-12});  // The last candidate of the walk.
      params.push_back({1.0f, 4, 1.0f, 1.0 - 1e-12});  // The last of the sorted top 4.
      params.push_back({1.0f, 0, 1.0f, 0.0});          // The first candidate,
      const int leading_gap = int(params.size());
      params.push_back({1.0f, 0, 1.0f, 0.0});  // after a run of -inf.
      const int all_nan = int(params.size());
      params.push_back({1.0f, 0, 0.9f, 0.5});
      const int rows = int(params.size());
      std::vector<float> plain = random_vec(size_t(rows) * vocab, 22 + vocab + shards, 3.0f);
      for (int r = 0; r < rows; ++r) {
        float* row = plain.data() + int64_t(r) * vocab;
        // Every third row in steps of 0.5: ties everywhere, at every cut.
        if (r % 3 == 0)
          for (int i = 0; i < vocab; ++i) row[i] = std::round(row[i] * 2.0f) / 2.0f;
        if (r % 5 == 1) row[r % vocab] = std::nanf("");
        if (r % 7 == 2)
          for (int i = 0; i < vocab; i += 2) row[i] = -INFINITY;
        if (r == leading_gap)
          for (int i = 0; i < vocab * 3 / 5; ++i) row[i] = -INFINITY;
        if (r == all_nan)  // But one -inf: the reference takes index 0.
          for (int i = 0; i < vocab; ++i) row[i] = i == vocab / 2 ? -INFINITY : std::nanf("");
      }
      kernels::ShardedLogits logits{nullptr, rows, vocab, shards};
      const std::vector<float> gathered = pdserve::testing::gather_logits(plain, logits, 0.0f);
      logits.data = gathered.data();
      std::vector<int> want(rows);
      cpu::SampleScratch scratch;
      cpu::sample_rows(want.data(), nullptr, logits, params.data(), {}, {}, &scratch);

      const std::vector<int> got = device_tokens(gathered, logits, params);
      for (int r = 0; r < rows; ++r)
        EXPECT_EQ(got[r], want[r]) << "vocab " << vocab << ", " << shards << " shards, row " << r << ": temperature "
                                   << params[r].temperature << " top_k " << params[r].top_k << " top_p "
                                   << params[r].top_p << " u " << params[r].u;
    }
}

// The narrowing the top_k / top_p searches start with (a histogram names a bin edge, the columns
// above it are compacted): on rows shaped like an LLM's (a few dominant logits over a N(0, 1)
// floor), on flat N(0, 1) and N(0, 3) rows (nuclei of thousands), and on all-equal rows (every
// column in one bin), the token is the reference's, and ten runs give the same tokens — the
// histogram's atomics land in any order.
TEST(GpuKernels, SamplingNarrowedSearchesMatchCpuReferenceAndRepeat) {
  REQUIRE_GPU();
  const int vocab = kEmulated ? 8192 : 128256;
  std::mt19937 rng(5);
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<kernels::SampleRow> params;
  std::vector<float> logits;
  for (int shape = 0; shape < 4; ++shape)
    for (const auto& [t, k, p] : {std::tuple{1.0f, 0, 0.95f}, std::tuple{0.7f, 0, 0.5f}, std::tuple{1.0f, 40, 1.0f},
                                  std::tuple{1.2f, 500, 0.9f}, std::tuple{1.0f, 0, 0.999f}}) {
      params.push_back({t, k, p, uniform(rng)});
      for (int i = 0; i < vocab; ++i) {
        const float floor = normal(rng);
        logits.push_back(shape == 0   ? floor + (i % 997 == 0 ? 12.0f + float(i % 5) : 0.0f)
                         : shape == 1 ? floor
                         : shape == 2 ? 3.0f * floor
                                      : 0.25f);
      }
    }
  const int rows = int(params.size());
  const kernels::ShardedLogits host{logits.data(), rows, vocab, 1};
  std::vector<int> want(rows);
  cpu::SampleScratch cpu_scratch;
  cpu::sample_rows(want.data(), nullptr, host, params.data(), {}, {}, &cpu_scratch);
  // One scratch for every run: what a run leaves there must not change the next one's tokens.
  Dev<float> scratch(size_t(sample_scratch_floats(rows, vocab)));
  for (int run = 0; run < (kEmulated ? 3 : 10); ++run) {
    const std::vector<int> got = device_tokens(logits, host, params, {}, scratch.get());
    for (int r = 0; r < rows; ++r)
      EXPECT_EQ(got[r], want[r]) << "run " << run << ", row " << r << " (shape " << r / 5 << "): temperature "
                                 << params[r].temperature << " top_k " << params[r].top_k << " top_p "
                                 << params[r].top_p;
  }
}

// The repetition penalty on the device, over two steps as the engine drives it: each row's new
// ids join its slot (emptied first on the slot's first use, though an earlier sequence left it
// full; an id outside the vocabulary skipped), seen logits are divided or multiplied, and the
// token is the reference's for greedy, top-k and top-p rows, plain and TP-gathered, with a row
// without a slot among them; after both steps the bitmaps are the reference's.
TEST(GpuKernels, RepetitionPenaltyMatchesCpuReference) {
  REQUIRE_GPU();
  std::mt19937 rng(31);
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  const std::vector<int> vocabs = kEmulated ? std::vector<int>{7, 1000, 3001} : std::vector<int>{1000, 128256};
  for (int vocab : vocabs)
    for (int shards : {1, 3}) {
      struct Mode {
        float temperature;
        int top_k;
        float top_p;
        float penalty;
      };
      const std::vector<Mode> modes = {{0.0f, 0, 1.0f, 1.3f}, {0.0f, 0, 1.0f, 0.7f}, {0.8f, 0, 0.9f, 2.0f},
                                       {1.0f, 40, 1.0f, 1.1f}, {0.7f, 0, 1.0f, 1.5f}};
      const int slots = int(modes.size());
      const kernels::SeenTokens shape{nullptr, nullptr, nullptr, vocab};
      std::vector<uint32_t> want_bits(size_t(slots) * shape.words_per_slot(), 0xA5A5A5A5u);
      Dev<uint32_t> dbits(want_bits);
      int changed = 0;
      for (int step = 0; step < 2; ++step) {
        std::vector<kernels::SampleRow> params;
        std::vector<int> new_ids;
        for (int m = 0; m < slots; ++m) {
          kernels::SampleRow row{modes[m].temperature, modes[m].top_k, modes[m].top_p, uniform(rng)};
          row.repetition_penalty = modes[m].penalty;
          row.seen_slot = (m + 2) % slots;  // Rows and slots in different orders.
          row.clear_slot = step == 0;
          row.new_ids_begin = int(new_ids.size());
          const int n = step == 0 ? 1 + vocab / 3 : 1;  // The prompt, then one token.
          for (int i = 0; i < n; ++i) new_ids.push_back(int(uniform(rng) * vocab));
          if (step == 0) new_ids.push_back(vocab);  // Outside the vocabulary.
          row.new_ids_count = int(new_ids.size()) - row.new_ids_begin;
          params.push_back(row);
        }
        params.push_back({0.0f, 0, 1.0f, 0.0});  // No slot: no penalty.
        const int rows = int(params.size());
        const std::vector<float> plain = random_vec(size_t(rows) * vocab, 40 + vocab + shards + step, 3.0f);
        kernels::ShardedLogits logits{nullptr, rows, vocab, shards};
        const std::vector<float> gathered = pdserve::testing::gather_logits(plain, logits, 0.0f);
        logits.data = gathered.data();
        std::vector<int> want(rows), unpenalised(rows);
        cpu::SampleScratch scratch;
        cpu::sample_rows(want.data(), nullptr, logits, params.data(), {want_bits.data(), nullptr, new_ids.data(), vocab}, {}, &scratch);
        std::vector<kernels::SampleRow> without = params;
        for (kernels::SampleRow& r : without) r.seen_slot = -1;
        cpu::sample_rows(unpenalised.data(), nullptr, logits, without.data(), {}, {}, &scratch);

        Dev<int> dnew(new_ids);
        const std::vector<int> got = device_tokens(gathered, logits, params, {dbits.get(), nullptr, dnew.get(), vocab});
        for (int r = 0; r < rows; ++r) {
          EXPECT_EQ(got[r], want[r]) << "vocab " << vocab << ", " << shards << " shards, step " << step << ", row " << r;
          changed += want[r] != unpenalised[r];
        }
        EXPECT_EQ(want[rows - 1], unpenalised[rows - 1]);
      }
      EXPECT_EQ(dbits.host(), want_bits) << "vocab " << vocab << ", " << shards << " shards";
      if (vocab > 7) {
        EXPECT_GT(changed, 0) << "the penalty moved no token at vocab " << vocab;
      }
    }
}

// logit_bias, banned ids, the frequency and presence penalties and log-probabilities on the
// device, each alone and all together, with the repetition penalty, for greedy, top-k, top-p and
// plain sampled rows, plain and gathered over 2 and 3 TP shards, at vocabularies no multiple of
// the block (also a 7-id one): over three steps as the engine drives them — the prompt first (its last ids counted
// as output), then each row's previous token, uploaded or, for half the rows (add_sampled), joining
// the slot where it was sampled — with the bitmaps and counts kept in device
// memory, the tokens are the reference's, the log-probabilities within 1e-5 (ids exactly), rows
// that ask for none untouched, and the slots' state the reference's after every step.
TEST(GpuKernels, LogitEditsCountPenaltiesAndLogprobsMatchCpuReference) {
  REQUIRE_GPU();
  std::mt19937 rng(41);
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  const auto pick = [&rng](int n) { return int(rng() % unsigned(n)); };
  const std::vector<int> vocabs = kEmulated ? std::vector<int>{7, 1100} : std::vector<int>{1000, 32000, 128256};
  enum Feature { kBias = 1, kBanned = 2, kRepetition = 4, kFrequency = 8, kPresence = 16, kLogprobs = 32 };
  const std::vector<int> features = {0,
                                     kBias,
                                     kBanned,
                                     kRepetition,
                                     kFrequency,
                                     kPresence,
                                     kLogprobs,
                                     kBias | kBanned | kLogprobs,
                                     kRepetition | kFrequency | kPresence,
                                     63};
  struct Mode {
    float temperature;
    int top_k;
    float top_p;
  };
  const std::vector<Mode> modes = {{0.0f, 0, 1.0f}, {0.8f, 0, 1.0f}, {1.0f, 40, 1.0f}, {0.7f, 0, 0.9f}};
  // Each row's features and mode: no feature and the combinations in every mode, each feature
  // alone greedy and in one of the sampled modes (the emulation's time goes to the modes' passes).
  std::vector<std::pair<int, int>> row_kinds;
  for (size_t fi = 0; fi < features.size(); ++fi) {
    const bool alone = fi > 0 && fi < 7;
    for (int m = 0; m < int(modes.size()); ++m)
      if (!alone || m == 0 || m == 1 + int(fi) % 3) row_kinds.push_back({features[fi], m});
  }
  const int rows = int(row_kinds.size()), slots = rows + 2, steps = 3;
  kernels::RowLogprobs sentinel;
  sentinel.logprob = 7.0f;
  sentinel.top_count = -3;
  for (int vocab : vocabs)
    for (int shards : {1, 2, 3}) {
      const kernels::SeenTokens shape{nullptr, nullptr, nullptr, vocab};
      std::vector<uint32_t> want_bits(size_t(slots) * shape.words_per_slot(), 0x5A5A5A5Au);
      std::vector<int32_t> want_counts(size_t(slots) * vocab, 4);  // Left by earlier sequences.
      Dev<uint32_t> dbits(want_bits);
      Dev<int32_t> dcounts(want_counts);
      std::vector<int> previous(rows, 0);
      int moved = 0, with_logprobs = 0;
      for (int step = 0; step < steps; ++step) {
        std::vector<float> plain = random_vec(size_t(rows) * vocab, 50 + vocab + shards + step, 3.0f);
        std::vector<kernels::SampleRow> params;
        std::vector<kernels::LogitBias> biases;
        std::vector<int> banned, new_ids;
        for (int r = 0; r < rows; ++r) {
          float* lr = plain.data() + int64_t(r) * vocab;
          if (r % 3 == 0)  // Ties everywhere.
            for (int i = 0; i < vocab; ++i) lr[i] = std::round(lr[i] * 2.0f) / 2.0f;
          if (r % 5 == 1) lr[r % vocab] = std::nanf("");
          const int f = row_kinds[r].first;
          const Mode& m = modes[row_kinds[r].second];
          kernels::SampleRow p{m.temperature, m.top_k, m.top_p, uniform(rng)};
          const int argmax =
              int(std::max_element(lr, lr + vocab,
                                   [](float a, float b) { return std::isnan(a) || (!std::isnan(b) && a < b); }) -
                  lr);
          if (f & (kRepetition | kFrequency | kPresence)) {
            p.seen_slot = (r * 7 + 3) % slots;  // Rows and slots in different orders.
            p.clear_slot = step == 0;
            p.repetition_penalty = f & kRepetition ? (r % 2 ? 1.4f : 0.7f) : 1.0f;
            p.frequency_penalty = f & kFrequency ? (r % 2 ? 0.8f : -0.3f) : 0.0f;
            p.presence_penalty = f & kPresence ? 1.1f : 0.0f;
            p.add_sampled = r % 4 < 2;
            p.new_ids_begin = int(new_ids.size());
            if (step == 0) {
              for (int i = 0; i < 1 + vocab / 4; ++i) new_ids.push_back(i == 0 ? argmax : pick(vocab));
              for (int i = 0; i < 3; ++i)
                new_ids.push_back(i == 0 ? argmax : pick(vocab));  // Output, twice the argmax.
              new_ids.push_back(argmax);
              new_ids.push_back(vocab);  // Outside the vocabulary.
              p.new_output_from = 1 + vocab / 4;
            } else {
              if (!p.add_sampled) new_ids.push_back(previous[r]);  // Else in the slot already.
              new_ids.push_back(argmax);  // So that the penalties bite at every step.
            }
            p.new_ids_count = int(new_ids.size()) - p.new_ids_begin;
          }
          if (f & kBias) {
            p.bias_begin = int(biases.size());
            for (int b = 0; b < 5; ++b) biases.push_back({pick(vocab + 2) - 1, normal(rng)});
            biases.push_back({argmax, -4.0f});
            biases.push_back(biases[p.bias_begin]);  // A repeated id: both added.
            p.bias_count = int(biases.size()) - p.bias_begin;
          }
          if (f & kBanned) {
            p.banned_begin = int(banned.size());
            banned.push_back(argmax);
            for (int b = 0; b < 3; ++b) banned.push_back(pick(vocab + 1));
            p.banned_count = int(banned.size()) - p.banned_begin;
          }
          if (f & kLogprobs) {
            p.logprobs = std::vector<int>{0, 1, 5, kernels::kMaxLogprobs}[(r + step) % 4];
            p.logprob_of = r % 2 ? -1 : pick(vocab);
            ++with_logprobs;
          }
          params.push_back(p);
        }
        kernels::ShardedLogits logits{nullptr, rows, vocab, shards};
        const std::vector<float> gathered = pdserve::testing::gather_logits(plain, logits, 0.0f);
        logits.data = gathered.data();
        std::vector<int> want(rows), unedited(rows);
        std::vector<kernels::RowLogprobs> want_lp(rows, sentinel);
        cpu::SampleScratch scratch;
        cpu::sample_rows(want.data(), want_lp.data(), logits, params.data(),
                         {want_bits.data(), want_counts.data(), new_ids.data(), vocab}, {biases.data(), banned.data()},
                         &scratch);
        std::vector<kernels::SampleRow> plain_params(rows);
        for (int r = 0; r < rows; ++r)
          plain_params[r] = {params[r].temperature, params[r].top_k, params[r].top_p, params[r].u};
        cpu::sample_rows(unedited.data(), nullptr, logits, plain_params.data(), {}, {}, &scratch);

        Dev<float> dlogits(gathered), dscratch(size_t(kernels::sample_scratch_floats(rows, vocab)));
        Dev<kernels::SampleRow> dparams(params);
        Dev<kernels::LogitBias> dbiases(biases);
        Dev<int> dbanned(banned), dnew(new_ids), dtokens(rows);
        Dev<kernels::RowLogprobs> dlp(std::vector<kernels::RowLogprobs>(rows, sentinel));
        logits.data = dlogits.get();
        gpu::sample(dtokens.get(), dlp.get(), logits, dparams.get(), {dbits.get(), dcounts.get(), dnew.get(), vocab},
                    {dbiases.get(), dbanned.get()}, dscratch.get(), nullptr);
        const std::vector<int> got = dtokens.host();
        const std::vector<kernels::RowLogprobs> got_lp = dlp.host();
        for (int r = 0; r < rows; ++r) {
          const std::string where = "vocab " + std::to_string(vocab) + ", " + std::to_string(shards) +
                                    " shards, step " + std::to_string(step) + ", row " + std::to_string(r) +
                                    " (features " + std::to_string(row_kinds[r].first) + ", mode " +
                                    std::to_string(row_kinds[r].second) + ")";
          EXPECT_EQ(got[r], want[r]) << where;
          moved += want[r] != unedited[r];
          const kernels::RowLogprobs &g = got_lp[r], &w = want_lp[r];
          ASSERT_EQ(g.top_count, w.top_count) << where;
          const auto near = [](float a, float b) {
            return std::isinf(b) ? a == b
                                 : std::abs(double(a) - double(b)) <= kF32Tol * std::max(1.0, std::abs(double(b)));
          };
          EXPECT_TRUE(near(g.logprob, w.logprob)) << where << ": " << g.logprob << " vs " << w.logprob;
          for (int j = 0; j < w.top_count; ++j) {
            EXPECT_EQ(g.top_ids[j], w.top_ids[j]) << where << " #" << j;
            EXPECT_TRUE(near(g.top_logprobs[j], w.top_logprobs[j]))
                << where << " #" << j << ": " << g.top_logprobs[j] << " vs " << w.top_logprobs[j];
          }
        }
        EXPECT_EQ(dbits.host(), want_bits) << "vocab " << vocab << ", " << shards << " shards, step " << step;
        EXPECT_EQ(dcounts.host(), want_counts) << "vocab " << vocab << ", " << shards << " shards, step " << step;
        previous = want;
      }
      if (vocab > 7) {
        EXPECT_GT(moved, rows) << "the edits moved too few tokens at vocab " << vocab;
      }
      EXPECT_GT(with_logprobs, 0);
    }
}

// The portable GEMM (bf16 weights; the HIP backend's fallback): the GEMV for up to 8 rows and
// the tiled kernel beyond, on odd shapes that leave partial tiles in every dimension, a column
// slice (ldw > in, offset start), and f16/bf16 weights against the CPU on the same rounded values.
TEST(GpuKernels, PortableGemmMatchesCpuForEveryWeightStorage) {
  REQUIRE_GPU();
  struct Shape {
    int rows, out, in, ldw, offset;
  };
  // Rows <= 8 take the GEMV: 16-byte loads where every weight row starts 16-byte aligned (offset 0
  // and ldw a multiple of 8 elements, or of 4 for f32; a tail of in % 8 or in % 4 one by one),
  // else one weight per load.
  for (const Shape& sh :
       {Shape{1, 33, 64, 64, 0}, Shape{7, 200, 100, 128, 5}, Shape{8, 1000, 4100, 4100, 1}, Shape{2, 50, 256, 272, 0},
        Shape{5, 37, 1003, 1008, 0}, Shape{8, 300, 2052, 2056, 0}, Shape{3, 20, 44, 44, 0}, Shape{9, 70, 33, 40, 0},
        Shape{70, 65, 17, 17, 0}, Shape{130, 129, 300, 310, 3}}) {
    std::vector<float> w = random_vec(size_t(sh.out) * sh.ldw + sh.offset, 20 + sh.rows);
    const std::vector<float> x = random_vec(size_t(sh.rows) * sh.in, 30 + sh.rows);
    for (Storage st : {Storage::kF32, Storage::kF16, Storage::kBF16}) {
      std::vector<float> rounded = w;
      std::vector<uint16_t> half(w.size());
      for (size_t i = 0; i < w.size(); ++i) {
        if (st == Storage::kF16) {
          half[i] = engine::f32_to_f16(w[i]);
          rounded[i] = engine::f16_to_f32(half[i]);
        } else if (st == Storage::kBF16) {
          half[i] = engine::f32_to_bf16(w[i]);
          rounded[i] = engine::bf16_to_f32(half[i]);
        }
      }
      std::vector<float> want(size_t(sh.rows) * sh.out);
      cpu::matmul_xwt(want.data(), x.data(), rounded.data() + sh.offset, sh.rows, sh.out, sh.in, sh.ldw);
      Dev<float> dw32(w), dx(x), dy(want.size());
      Dev<uint16_t> dw16(half);
      const void* dw = st == Storage::kF32 ? static_cast<const void*>(dw32.get() + sh.offset)
                                           : static_cast<const void*>(dw16.get() + sh.offset);
      gpu::matmul_xwt(dy.get(), dx.get(), dw, st, sh.rows, sh.out, sh.in, sh.ldw, nullptr);
      ASSERT_EQ(gpuGetLastError(), gpuSuccess);
      EXPECT_LE(rel_error(dy.host(), want), kF32Tol)
          << "rows " << sh.rows << " out " << sh.out << " in " << sh.in << " storage " << int(st);
    }
  }
}

// SwiGLU's fused gate-up GEMV (decode rows): bit for bit the GEMV into [gate | up] then silu_mul,
// for every row count, with and without bf16 activations, 16-byte and one-by-one weight loads;
// and within the f32 tolerance of the CPU's matmul then silu_mul on the same rounded weights.
TEST(GpuKernels, GateUpSiluGemvEqualsGemvThenSiluMul) {
  REQUIRE_GPU();
  struct Shape {
    int hidden, in, ldw;
  };
  for (const Shape& sh : {Shape{40, 64, 64}, Shape{37, 203, 203}, Shape{70, 100, 104}}) {
    for (int rows = 1; rows <= gpu::kGemvMaxRows; ++rows) {
      std::vector<float> w = random_vec(size_t(2 * sh.hidden) * sh.ldw, 90 + rows);
      std::vector<uint16_t> w16(w.size());
      for (size_t i = 0; i < w.size(); ++i) {
        w16[i] = engine::f32_to_bf16(w[i]);
        w[i] = engine::bf16_to_f32(w16[i]);
      }
      const std::vector<float> x = random_vec(size_t(rows) * sh.in, 100 + rows);
      std::vector<float> gate_up(size_t(rows) * 2 * sh.hidden), want(size_t(rows) * sh.hidden);
      cpu::matmul_xwt(gate_up.data(), x.data(), w.data(), rows, 2 * sh.hidden, sh.in, sh.ldw);
      cpu::silu_mul(want.data(), gate_up.data(), gate_up.data() + sh.hidden, rows, sh.hidden, 2 * sh.hidden);
      Dev<uint16_t> dw(w16);
      Dev<float> dx(x), dgu(gate_up.size()), dunfused(want.size()), dfused(want.size());
      for (bool bf16_x : {false, true}) {
        const std::string at = "rows " + std::to_string(rows) + " hidden " + std::to_string(sh.hidden) + " ldw " +
                               std::to_string(sh.ldw) + (bf16_x ? " bf16 x" : " f32 x");
        gpu::matmul_xwt(dgu.get(), dx.get(), dw.get(), Storage::kBF16, rows, 2 * sh.hidden, sh.in, sh.ldw, nullptr,
                        bf16_x);
        gpu::silu_mul(dunfused.get(), dgu.get(), dgu.get() + sh.hidden, rows, sh.hidden, 2 * sh.hidden, nullptr);
        gpu::gate_up_silu_gemv(dfused.get(), dx.get(), dw.get(), rows, sh.hidden, sh.in, sh.ldw, nullptr, bf16_x);
        ASSERT_EQ(gpuGetLastError(), gpuSuccess) << at;
        const std::vector<float> fused = dfused.host(), unfused = dunfused.host();
        EXPECT_EQ(0, std::memcmp(fused.data(), unfused.data(), fused.size() * sizeof(float))) << at;
        if (!bf16_x) {
          EXPECT_LE(rel_error(fused, want), kF32Tol) << at;
        }
      }
    }
  }
}

// The portable GEMM rounding x to bf16 as it loads it (GemmPrecision::kBf16): GEMV and tiled
// kernel against the CPU on the same rounded x and w; and round_to_bf16, the vendor GEMM's input
// copy, bit for bit the CPU's rounding (ties to even, both signs, tiny and huge values).
TEST(GpuKernels, PortableGemmWithBf16ActivationsMatchesCpuOnRoundedInputs) {
  REQUIRE_GPU();
  for (int rows : {1, 3, 8, 9, 70}) {
    const int out = 45, in = 200, ldw = 208;
    std::vector<float> w = random_vec(size_t(out) * ldw, 60 + rows), x = random_vec(size_t(rows) * in, 70 + rows);
    std::vector<uint16_t> w16(w.size());
    for (size_t i = 0; i < w.size(); ++i) {
      w16[i] = engine::f32_to_bf16(w[i]);
      w[i] = engine::bf16_to_f32(w16[i]);
    }
    std::vector<float> rounded = x, want(size_t(rows) * out);
    for (float& v : rounded) v = engine::bf16_to_f32(engine::f32_to_bf16(v));
    cpu::matmul_xwt(want.data(), rounded.data(), w.data(), rows, out, in, ldw);
    Dev<uint16_t> dw(w16);
    Dev<float> dx(x), dy(want.size());
    gpu::matmul_xwt(dy.get(), dx.get(), dw.get(), Storage::kBF16, rows, out, in, ldw, nullptr, /*bf16_x=*/true);
    ASSERT_EQ(gpuGetLastError(), gpuSuccess);
    EXPECT_LE(rel_error(dy.host(), want), kF32Tol) << rows << " rows";
  }
  std::vector<float> values = random_vec(1000, 80);
  for (float v : {0.0f, -0.0f, 1.0f, 1.00390625f, 1.01171875f, -1.00390625f, 3.0e38f, -3.0e38f, 1e-39f, 1e-45f})
    values.push_back(v);  // 1 + 2^-8 and 1 + 3·2^-8: ties, one rounding down to even and one up.
  std::vector<uint16_t> want(values.size());
  for (size_t i = 0; i < values.size(); ++i) want[i] = engine::f32_to_bf16(values[i]);
  Dev<float> din(values);
  Dev<uint16_t> dout(values.size());
  gpu::round_to_bf16(dout.get(), din.get(), int64_t(values.size()), nullptr);
  ASSERT_EQ(gpuGetLastError(), gpuSuccess);
  EXPECT_EQ(dout.host(), want);
}

// A paged cache of one layer on the host (f32, the reference) and on the device (`storage`),
// the same blocks handed to three sequences in shuffled order, `blocks_per_seq` each.
struct PagedCase {
  static constexpr int kBlock = 16;
  int blocks;
  int kv_heads, hd;
  Storage storage;
  KvCacheLayout host_layout, dev_layout;
  std::vector<float> host_arena;
  std::unique_ptr<Dev<uint8_t>> dev_arena;
  std::vector<std::vector<int>> tables;

  static KvCacheLayout make_layout(int blocks, int kv_heads, int hd, int v_hd, KvLayout layout, KvOrder order,
                                   DType dtype) {
    KvCacheSpec spec;
    spec.block_size = kBlock;
    spec.layers = {{v_hd ? engine::KvKind::kKv : engine::KvKind::kKeyOnly, engine::KvSharding::kByHead,
                    kv_heads, hd, v_hd, dtype, layout, order, 0}};
    return *KvCacheLayout::create(spec, 0, 1, blocks);
  }
  static DType dtype_of(Storage s) {
    return s == Storage::kF32 ? DType::kF32 : (s == Storage::kBF16 ? DType::kBF16 : DType::kF16);
  }

  PagedCase(int kv_heads, int hd, bool key_only, KvLayout layout, KvOrder order, Storage storage,
            int blocks_per_seq = 8)
      : blocks(3 * blocks_per_seq),
        kv_heads(kv_heads),
        hd(hd),
        storage(storage),
        host_layout(make_layout(blocks, kv_heads, hd, key_only ? 0 : hd, layout, order, DType::kF32)),
        dev_layout(make_layout(blocks, kv_heads, hd, key_only ? 0 : hd, layout, order, dtype_of(storage))) {
    host_arena.assign(host_layout.total_bytes() / 4, 0.0f);
    dev_arena = std::make_unique<Dev<uint8_t>>(dev_layout.total_bytes());
    std::vector<int> ids(blocks);
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), std::mt19937(12));
    for (int s = 0; s < 3; ++s)
      tables.emplace_back(ids.begin() + s * blocks_per_seq, ids.begin() + (s + 1) * blocks_per_seq);
  }

  static kernels::PagedLayerView view(const KvCacheLayout& L, uint8_t* arena) { return L.view(0, arena); }
  kernels::PagedLayerView host_view() { return view(host_layout, reinterpret_cast<uint8_t*>(host_arena.data())); }
  kernels::PagedLayerView dev_view() { return view(dev_layout, dev_arena->get()); }

  // The device cache read back as f32 in the host layout, for comparison.
  std::vector<float> dev_as_host_layout() {
    const std::vector<uint8_t> raw = dev_arena->host();
    kernels::PagedLayerView d = view(dev_layout, const_cast<uint8_t*>(raw.data())), h = host_view();
    std::vector<float> out(host_arena.size());
    auto read = [&](const void* base, int64_t off) -> float {
      if (storage == Storage::kF32) return static_cast<const float*>(base)[off];
      const auto* p = static_cast<const uint16_t*>(base) + off;
      return storage == Storage::kBF16 ? engine::bf16_to_f32(*p) : engine::f16_to_f32(*p);
    };
    auto* out_base = reinterpret_cast<uint8_t*>(out.data());
    const auto* host_base = reinterpret_cast<const uint8_t*>(host_arena.data());
    for (int b = 0; b < blocks; ++b)
      for (int s = 0; s < kBlock; ++s)
        for (int hh = 0; hh < kv_heads; ++hh)
          for (int e = 0; e < hd; ++e) {
            const int64_t kh = b * h.k_block_stride + s * h.k_token_stride + hh * h.k_head_stride + e;
            const int64_t kd = b * d.k_block_stride + s * d.k_token_stride + hh * d.k_head_stride + e;
            reinterpret_cast<float*>(out_base + (reinterpret_cast<const uint8_t*>(h.k) - host_base))[kh] = read(d.k, kd);
            if (!h.v) continue;
            const int64_t vh = b * h.v_block_stride + s * h.v_token_stride + hh * h.v_head_stride + e;
            const int64_t vd = b * d.v_block_stride + s * d.v_token_stride + hh * d.v_head_stride + e;
            reinterpret_cast<float*>(out_base + (reinterpret_cast<const uint8_t*>(h.v) - host_base))[vh] = read(d.v, vd);
          }
    return out;
  }
};

// Tokens of one step on host and device: positions, and per token its sequence's table.
struct Placement {
  std::vector<int> positions, seq;
  std::vector<const int*> host_tables;
  std::vector<int> flat;
  std::unique_ptr<Dev<int>> d_positions, d_flat;
  std::unique_ptr<Dev<const int*>> d_tables;

  Placement(const std::vector<std::pair<int, int>>& seq_pos, const std::vector<std::vector<int>>& tables) {
    std::vector<size_t> offset;
    for (const auto& t : tables) {
      offset.push_back(flat.size());
      flat.insert(flat.end(), t.begin(), t.end());
    }
    d_flat = std::make_unique<Dev<int>>(flat);
    std::vector<const int*> dev_tables;
    for (const auto& [s, p] : seq_pos) {
      positions.push_back(p);
      seq.push_back(s);
      host_tables.push_back(tables[s].data());
      dev_tables.push_back(d_flat->get() + offset[s]);
    }
    d_positions = std::make_unique<Dev<int>>(positions);
    d_tables = std::make_unique<Dev<const int*>>(dev_tables);
  }
  int n() const { return int(positions.size()); }
  kernels::TokenPlacement host() const { return {n(), positions.data(), host_tables.data()}; }
  kernels::TokenPlacement dev() const { return {n(), d_positions->get(), d_tables->get()}; }
};

// Every position of three sequences (lengths 70, 128, 9), written in one call.
std::vector<std::pair<int, int>> all_positions() {
  std::vector<std::pair<int, int>> sp;
  const int lens[3] = {70, 128, 9};
  for (int s = 0; s < 3; ++s)
    for (int p = 0; p < lens[s]; ++p) sp.push_back({s, p});
  return sp;
}

struct LayoutParam {
  KvLayout layout;
  KvOrder order;
  Storage storage;
};

class GpuPaged : public ::testing::TestWithParam<LayoutParam> {};

TEST_P(GpuPaged, KvWriteThenDecodeAndPrefillAttentionMatchCpu) {
  REQUIRE_GPU();
  const LayoutParam P = GetParam();
  const double tol = P.storage == Storage::kF32 ? kF32Tol : kHalfTol;
  const int kv_heads = 2, q_per_kv = 3, hd = 64, nq = kv_heads * q_per_kv;
  PagedCase c(kv_heads, hd, false, P.layout, P.order, P.storage);
  Placement all(all_positions(), c.tables);
  const int64_t kv_row = kv_heads * hd;
  std::vector<float> k = random_vec(all.n() * kv_row, 20), v = random_vec(all.n() * kv_row, 21);
  cpu::paged_kv_write(c.host_view(), all.host(), k.data(), kv_row, v.data(), kv_row, kv_heads);
  Dev<float> dk(k), dv(v);
  gpu::paged_kv_write(c.dev_view(), all.dev(), dk.get(), kv_row, dv.get(), kv_row, kv_heads, nullptr);
  EXPECT_LE(rel_error(c.dev_as_host_layout(), c.host_arena), P.storage == Storage::kF32 ? 0.0 : kHalfTol);

  // A mixed step: a decode token, a 40-token prefill chunk from position 30, another decode.
  std::vector<std::pair<int, int>> step = {{0, 69}};
  for (int p = 30; p < 70; ++p) step.push_back({1, p});
  step.push_back({2, 8});
  Placement pl(step, c.tables);
  std::vector<float> q = random_vec(pl.n() * nq * hd, 22);
  Dev<float> dq(q), dout(pl.n() * nq * hd);
  const float scale = 1.0f / std::sqrt(float(hd));
  // Block mask as the index cache would set it: drop block 1 of every sequence where visible.
  const int mask_stride = 8;
  std::vector<uint8_t> mask(pl.n() * mask_stride, 1);
  for (int t = 0; t < pl.n(); ++t)
    if (pl.positions[t] / PagedCase::kBlock > 1) mask[t * mask_stride + 1] = 0;
  Dev<uint8_t> dmask(mask);
  for (int window : {0, 20})
    for (bool masked : {false, true}) {
      kernels::TokenPlacement hp = pl.host(), dp = pl.dev();
      if (masked) {
        hp.block_mask = mask.data();
        dp.block_mask = dmask.get();
        hp.mask_stride = dp.mask_stride = mask_stride;
      }
      std::vector<float> want(pl.n() * nq * hd);
      cpu::paged_attention(want.data(), q.data(), c.host_view(), hp, nq, q_per_kv, window, scale);
      gpu::paged_attention(dout.get(), dq.get(), c.dev_view(), dp, nq, q_per_kv, window, scale, nullptr);
      EXPECT_LE(rel_error(dout.host(), want), tol) << "decode kernel, window " << window << " mask " << masked;
      gpu::prefill_attention(dout.get(), dq.get(), c.dev_view(), dp, nq, q_per_kv, window, scale, nullptr);
      EXPECT_LE(rel_error(dout.host(), want), tol) << "prefill kernel, window " << window << " mask " << masked;
      gpu::prefill_attention_bf16(dout.get(), dq.get(), c.dev_view(), dp, nq, q_per_kv, window, scale, nullptr);
      EXPECT_LE(rel_error(dout.host(), want), kBf16OperandsTol)
          << "tensor-core prefill kernel, window " << window << " mask " << masked;
      for (int splits : {1, 3, 7, gpu::kMaxDecodeSplits}) {
        Dev<float> scratch(std::max<size_t>(1, gpu::split_decode_scratch_floats(pl.n(), nq, hd, splits)));
        // At most one key a split: these short ranges are cut in `splits` pieces.
        gpu::split_decode_attention(dout.get(), dq.get(), c.dev_view(), dp, nq, q_per_kv, window, scale, splits, 1,
                                    scratch.get(), nullptr);
        EXPECT_LE(rel_error(dout.host(), want), tol)
            << "split decode kernel, " << splits << " splits, window " << window << " mask " << masked;
      }
    }
}

// Attention's input stage against the CPU reference: fused [q | k | v] rows and three buffers,
// with and without Qwen2's biases and Qwen3's head norms, both pair layouts, an unscaled, a
// llama3 and a yarn table (its cos/sin scale), into the layout's cache in its storage.
void expect_qkv_rope_write_matches_cpu(const LayoutParam& P, int hd) {
  const int kv_heads = 2, nq = 6;
  PagedCase c(kv_heads, hd, false, P.layout, P.order, P.storage);
  Placement all(all_positions(), c.tables);
  const int n = all.n();
  const int64_t qw = nq * hd, kvw = kv_heads * hd, width = qw + 2 * kvw;
  const std::vector<float> fused = random_vec(n * width, 30), bias = random_vec(width, 31), norm = random_vec(hd, 32);
  std::vector<float> q(n * qw), k(n * kvw), v(n * kvw);
  for (int t = 0; t < n; ++t) {
    std::copy_n(&fused[t * width], qw, &q[t * qw]);
    std::copy_n(&fused[t * width + qw], kvw, &k[t * kvw]);
    std::copy_n(&fused[t * width + qw + kvw], kvw, &v[t * kvw]);
  }
  Dev<float> dfused(fused), dq(q), dk(k), dv(v), dbias(bias), dnorm(norm), dq_out(n * qw);
  engine::RopeScaling llama3;
  llama3.type = engine::RopeScalingType::kLlama3;
  llama3.factor = 8.0;
  llama3.original_max_position_embeddings = 64;
  engine::RopeScaling yarn;
  yarn.type = engine::RopeScalingType::kYarn;
  yarn.factor = 4.0;
  yarn.original_max_position_embeddings = 64;
  for (const engine::RopeScaling& scaling : {engine::RopeScaling{}, llama3, yarn}) {
    const engine::RopeFrequencies table = engine::rope_frequencies(scaling, 10000.0f, hd, 512);
    Dev<float> dfreq(table.inv_freq);
    for (bool rotate_half : {false, true})
      for (bool extras : {false, true})
        for (bool fused_rows : {false, true}) {
          kernels::QkvRows host_rows{fused.data(), fused.data() + qw, fused.data() + qw + kvw, width, width, width};
          kernels::QkvRows dev_rows{dfused.get(), dfused.get() + qw, dfused.get() + qw + kvw, width, width, width};
          if (!fused_rows) dev_rows = {dq.get(), dk.get(), dv.get(), qw, kvw, kvw};
          for (kernels::QkvRows* r : {&host_rows, &dev_rows}) {
            r->n_q_heads = nq;
            r->n_kv_heads = kv_heads;
            r->norm_eps = 1e-6f;
          }
          if (extras) {
            host_rows.q_bias = bias.data();
            host_rows.k_bias = bias.data() + qw;
            host_rows.v_bias = bias.data() + qw + kvw;
            host_rows.q_norm = host_rows.k_norm = norm.data();
            dev_rows.q_bias = dbias.get();
            dev_rows.k_bias = dbias.get() + qw;
            dev_rows.v_bias = dbias.get() + qw + kvw;
            dev_rows.q_norm = dev_rows.k_norm = dnorm.get();
          }
          std::vector<float> want_q(n * qw);
          cpu::qkv_rope_write(want_q.data(), host_rows, {table.inv_freq.data(), table.attention_scale, rotate_half},
                              c.host_view(), all.host());
          gpu::qkv_rope_write(dq_out.get(), dev_rows, {dfreq.get(), table.attention_scale, rotate_half}, c.dev_view(),
                              all.dev(), nullptr);
          const std::string what = "head dim " + std::to_string(hd) + ", scaling " + std::to_string(int(scaling.type)) +
                                   ", rotate_half " + std::to_string(rotate_half) + ", biases and norms " +
                                   std::to_string(extras) + (fused_rows ? ", fused rows" : ", separate rows");
          EXPECT_LE(rel_error(dq_out.host(), want_q), kRopeTol) << what;
          EXPECT_LE(rel_error(c.dev_as_host_layout(), c.host_arena), P.storage == Storage::kF32 ? kRopeTol : kHalfTol)
              << what;
        }
  }
}

TEST_P(GpuPaged, QkvRopeWriteMatchesCpu) {
  REQUIRE_GPU();
  expect_qkv_rope_write_matches_cpu(GetParam(), 64);
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, GpuPaged,
    ::testing::Values(LayoutParam{KvLayout::kSeparate, KvOrder::kTokenMajor, Storage::kF32},
                      LayoutParam{KvLayout::kSeparate, KvOrder::kHeadMajor, Storage::kF32},
                      LayoutParam{KvLayout::kSeparate, KvOrder::kHeadOuter, Storage::kF32},
                      LayoutParam{KvLayout::kSeparate, KvOrder::kHeadOuter, Storage::kBF16},
                      LayoutParam{KvLayout::kInterleaved, KvOrder::kTokenMajor, Storage::kF32},
                      LayoutParam{KvLayout::kInterleaved, KvOrder::kHeadMajor, Storage::kF32},
                      LayoutParam{KvLayout::kSeparate, KvOrder::kTokenMajor, Storage::kBF16},
                      LayoutParam{KvLayout::kInterleaved, KvOrder::kHeadMajor, Storage::kF16}),
    [](const ::testing::TestParamInfo<LayoutParam>& info) {
      const LayoutParam& p = info.param;
      std::string name = std::string(p.layout == KvLayout::kSeparate ? "separate_" : "interleaved_") +
                         engine::kv_order_name(p.order) + "_" +
                         (p.storage == Storage::kF32 ? "f32" : p.storage == Storage::kBF16 ? "bf16" : "f16");
      std::replace(name.begin(), name.end(), '-', '_');
      return name;
    });

// The head dims of real models (128: Llama-3, Qwen2.5) and the kernel's largest (256), which
// launch 128 threads a head where 64 do up to head dim 64.
TEST(GpuKernels, QkvRopeWriteWideHeadsMatchCpu) {
  REQUIRE_GPU();
  expect_qkv_rope_write_matches_cpu({KvLayout::kSeparate, KvOrder::kHeadOuter, Storage::kBF16}, 128);
  expect_qkv_rope_write_matches_cpu({KvLayout::kInterleaved, KvOrder::kTokenMajor, Storage::kF32}, 256);
}

TEST(GpuPagedAttention, WideGroupsAndLargeHeadDim) {
  REQUIRE_GPU();
  // 20 query heads per KV head (more than one prefill tile of rows) at head dim 256.
  const int kv_heads = 1, q_per_kv = 20, hd = 256, nq = kv_heads * q_per_kv;
  PagedCase c(kv_heads, hd, false, KvLayout::kSeparate, KvOrder::kTokenMajor, Storage::kF32);
  Placement all(all_positions(), c.tables);
  std::vector<float> k = random_vec(all.n() * hd, 30), v = random_vec(all.n() * hd, 31);
  cpu::paged_kv_write(c.host_view(), all.host(), k.data(), hd, v.data(), hd, kv_heads);
  Dev<float> dk(k), dv(v);
  gpu::paged_kv_write(c.dev_view(), all.dev(), dk.get(), hd, dv.get(), hd, kv_heads, nullptr);
  std::vector<float> q = random_vec(all.n() * nq * hd, 32), want(all.n() * nq * hd);
  Dev<float> dq(q), dout(want.size());
  cpu::paged_attention(want.data(), q.data(), c.host_view(), all.host(), nq, q_per_kv, 0, 0.0625f);
  gpu::prefill_attention(dout.get(), dq.get(), c.dev_view(), all.dev(), nq, q_per_kv, 0, 0.0625f, nullptr);
  EXPECT_LE(rel_error(dout.host(), want), kF32Tol);
  // The tensor-core kernel's largest tiles (148 KB of shared memory at head dim 256).
  gpu::prefill_attention_bf16(dout.get(), dq.get(), c.dev_view(), all.dev(), nq, q_per_kv, 0, 0.0625f, nullptr);
  EXPECT_LE(rel_error(dout.host(), want), kBf16OperandsTol);
  gpu::paged_attention(dout.get(), dq.get(), c.dev_view(), all.dev(), nq, q_per_kv, 0, 0.0625f, nullptr);
  EXPECT_LE(rel_error(dout.host(), want), kF32Tol);
  // Groups of 8 query heads, the last of 4; splits of 64 and of 15 keys.
  for (int splits : {2, 9}) {
    Dev<float> scratch(gpu::split_decode_scratch_floats(all.n(), nq, hd, splits));
    gpu::split_decode_attention(dout.get(), dq.get(), c.dev_view(), all.dev(), nq, q_per_kv, 0, 0.0625f, splits, 1,
                                scratch.get(), nullptr);
    EXPECT_LE(rel_error(dout.host(), want), kF32Tol) << splits << " splits";
  }
}

// The tensor-core prefill kernel where the short cases above do not reach: a long prompt in one
// chunk (its length a multiple of neither the 64-row nor the 32-key tile), its last part as a
// continuation over the cached rest, a window and a block mask, groups of 1, 4 and 8 query heads,
// head dims 64, 128 and 72 (zero-padded to 80). The reference reads the device's bf16 cache, so
// the difference is the kernel's own rounding of Q and P and its order of sums.
TEST(GpuPagedAttention, TensorCorePrefillLongChunksGroupsAndHeadDims) {
  REQUIRE_GPU();
  struct Shape {
    int q_per_kv, hd;
  };
  const int len = kEmulated ? 300 : 1100, resume = kEmulated ? 190 : 700;
  const int blocks_per_seq = (len + PagedCase::kBlock - 1) / PagedCase::kBlock;
  for (const Shape sh : {Shape{1, 64}, Shape{4, 128}, Shape{8, 72}}) {
    const int kv_heads = 2, nq = kv_heads * sh.q_per_kv;
    PagedCase c(kv_heads, sh.hd, false, KvLayout::kSeparate, KvOrder::kHeadOuter, Storage::kBF16, blocks_per_seq);
    std::vector<std::pair<int, int>> prompt;
    for (int p = 0; p < len; ++p) prompt.push_back({1, p});
    Placement all(prompt, c.tables);
    const int64_t kv_row = int64_t(kv_heads) * sh.hd;
    std::vector<float> k = random_vec(all.n() * kv_row, 60), v = random_vec(all.n() * kv_row, 61);
    Dev<float> dk(k), dv(v);
    gpu::paged_kv_write(c.dev_view(), all.dev(), dk.get(), kv_row, dv.get(), kv_row, kv_heads, nullptr);
    c.host_arena = c.dev_as_host_layout();
    const float scale = 1.0f / std::sqrt(float(sh.hd));
    const std::vector<uint8_t> mask = [&] {  // Block 5 dropped wherever it is not the token's own.
      std::vector<uint8_t> m(size_t(len) * blocks_per_seq, 1);
      for (int t = 0; t < len; ++t)
        if (t / PagedCase::kBlock > 5) m[size_t(t) * blocks_per_seq + 5] = 0;
      return m;
    }();
    for (int first : {0, resume}) {
      std::vector<std::pair<int, int>> chunk(prompt.begin() + first, prompt.end());
      Placement pl(chunk, c.tables);
      std::vector<float> q = random_vec(size_t(pl.n()) * nq * sh.hd, 62);
      Dev<float> dq(q), dout(size_t(pl.n()) * nq * sh.hd);
      std::vector<uint8_t> chunk_mask(mask.begin() + size_t(first) * blocks_per_seq, mask.end());
      Dev<uint8_t> dmask(chunk_mask);
      for (const auto& [window, masked] : {std::pair{0, false}, std::pair{0, true}, std::pair{100, false}}) {
        kernels::TokenPlacement hp = pl.host(), dp = pl.dev();
        if (masked) {
          hp.block_mask = chunk_mask.data();
          dp.block_mask = dmask.get();
          hp.mask_stride = dp.mask_stride = blocks_per_seq;
        }
        std::vector<float> want(dout.host().size());
        cpu::paged_attention(want.data(), q.data(), c.host_view(), hp, nq, sh.q_per_kv, window, scale);
        gpu::prefill_attention_bf16(dout.get(), dq.get(), c.dev_view(), dp, nq, sh.q_per_kv, window, scale, nullptr);
        EXPECT_LE(rel_error(dout.host(), want), kBf16OperandsTol)
            << "group " << sh.q_per_kv << ", head dim " << sh.hd << ", chunk from " << first << ", window " << window
            << ", mask " << masked;
      }
    }
  }
}

// The GPU backend's attention verb takes the tensor-core kernel for a prefill chunk exactly when
// the precision is kBf16: the exact precision gives prefill_attention's bits, kBf16
// prefill_attention_bf16's, and the two differ where the build has tensor cores (the precision
// is not ignored).
TEST(GpuPagedAttention, BackendTakesTheTensorCoreKernelForBf16PrefillChunks) {
  REQUIRE_GPU();
  auto backend = engine::make_gpu_backend(0);
  ASSERT_TRUE(backend.ok()) << backend.status();
  const int kv_heads = 2, q_per_kv = 4, hd = 64, nq = kv_heads * q_per_kv;
  PagedCase c(kv_heads, hd, false, KvLayout::kSeparate, KvOrder::kHeadOuter, Storage::kBF16);
  Placement all(all_positions(), c.tables);
  const int64_t kv_row = kv_heads * hd;
  std::vector<float> k = random_vec(all.n() * kv_row, 70), v = random_vec(all.n() * kv_row, 71);
  Dev<float> dk(k), dv(v);
  gpu::paged_kv_write(c.dev_view(), all.dev(), dk.get(), kv_row, dv.get(), kv_row, kv_heads, nullptr);
  std::vector<std::pair<int, int>> chunk;  // 60 tokens of the second sequence, from position 40.
  for (int p = 40; p < 100; ++p) chunk.push_back({1, p});
  Placement pl(chunk, c.tables);
  Dev<float> dq(random_vec(size_t(pl.n()) * nq * hd, 72));
  const size_t n_out = size_t(pl.n()) * nq * hd;
  Dev<float> exact(n_out), bf16(n_out), via_exact(n_out), via_bf16(n_out);
  const float scale = 0.125f;
  gpu::prefill_attention(exact.get(), dq.get(), c.dev_view(), pl.dev(), nq, q_per_kv, 0, scale, nullptr);
  gpu::prefill_attention_bf16(bf16.get(), dq.get(), c.dev_view(), pl.dev(), nq, q_per_kv, 0, scale, nullptr);
  ASSERT_EQ(gpuDeviceSynchronize(), gpuSuccess);  // The backend's stream does not wait for the default one.
  (*backend)->paged_attention(via_exact.get(), dq.get(), c.dev_view(), pl.dev(), nq, q_per_kv, 0, scale,
                              engine::GemmPrecision::kExact);
  (*backend)->paged_attention(via_bf16.get(), dq.get(), c.dev_view(), pl.dev(), nq, q_per_kv, 0, scale,
                              engine::GemmPrecision::kBf16);
  ASSERT_TRUE((*backend)->synchronize().ok());
  EXPECT_EQ(via_exact.host(), exact.host());
  EXPECT_EQ(via_bf16.host(), bf16.host());
#if defined(PDSERVE_GPU_WMMA)
  EXPECT_NE(bf16.host(), exact.host());
#else
  EXPECT_EQ(bf16.host(), exact.host());  // HIP: no tensor-core kernel yet (R11).
#endif
}

// A decode token's split attention is its own: the same bits alone or beside others, under a
// launch of just the splits it fills or of the most there are (what a recorded step replayed
// over other batches computes), one split written directly or through the merge.
TEST(GpuPagedAttention, SplitDecodeTokensComputeTheSameWhateverTheirBatchAndGrid) {
  REQUIRE_GPU();
  const int kv_heads = 2, q_per_kv = 3, hd = 64, nq = kv_heads * q_per_kv, min_keys = 8;
  PagedCase c(kv_heads, hd, false, KvLayout::kSeparate, KvOrder::kTokenMajor, Storage::kBF16);
  Placement all(all_positions(), c.tables);
  std::vector<float> k = random_vec(all.n() * kv_heads * hd, 80), v = random_vec(all.n() * kv_heads * hd, 81);
  cpu::paged_kv_write(c.host_view(), all.host(), k.data(), kv_heads * hd, v.data(), kv_heads * hd, kv_heads);
  Dev<float> dk(k), dv(v);
  gpu::paged_kv_write(c.dev_view(), all.dev(), dk.get(), kv_heads * hd, dv.get(), kv_heads * hd, kv_heads, nullptr);
  // 128 visible keys (16 splits of 8), 70 (9 splits), 6 (one).
  const std::vector<std::pair<int, int>> step = {{1, 127}, {0, 69}, {2, 5}};
  const int64_t row = int64_t(nq) * hd;
  const std::vector<float> q = random_vec(step.size() * row, 82);
  Dev<float> dq(q);
  for (int window : {0, 50}) {
    auto run = [&](const Placement& pl, const float* q_dev, int splits) {
      Dev<float> out(pl.n() * row),
          scratch(std::max<size_t>(1, gpu::split_decode_scratch_floats(pl.n(), nq, hd, splits)));
      gpu::split_decode_attention(out.get(), q_dev, c.dev_view(), pl.dev(), nq, q_per_kv, window, 0.125f, splits,
                                  min_keys, scratch.get(), nullptr);
      return out.host();
    };
    Placement batch(step, c.tables);
    const std::vector<float> fitted = run(batch, dq.get(), 16), widest = run(batch, dq.get(), gpu::kMaxDecodeSplits);
    EXPECT_EQ(fitted, widest) << "window " << window;
    std::vector<float> want(fitted.size());
    cpu::paged_attention(want.data(), q.data(), c.host_view(), batch.host(), nq, q_per_kv, window, 0.125f);
    EXPECT_LE(rel_error(fitted, want), kHalfTol) << "window " << window;
    for (size_t t = 0; t < step.size(); ++t) {
      Placement alone({step[t]}, c.tables);
      const int visible = std::min(step[t].second + 1, window > 0 ? window : 1 << 30);
      const std::vector<float> got = run(alone, dq.get() + t * row, (visible + min_keys - 1) / min_keys);
      EXPECT_TRUE(std::equal(got.begin(), got.end(), fitted.begin() + t * row))
          << "token " << t << " window " << window;
    }
  }
}

TEST(GpuPagedAttention, DecodeSplitsFollowTheContext) {
  EXPECT_EQ(gpu::decode_splits(0, 0), 1);
  EXPECT_EQ(gpu::decode_splits(127, 0), 1);
  EXPECT_EQ(gpu::decode_splits(128, 0), 2);
  EXPECT_EQ(gpu::decode_splits(1023, 0), 8);
  EXPECT_EQ(gpu::decode_splits(1 << 20, 0), gpu::kMaxDecodeSplits);
  // A sliding window bounds the keys, whatever the position.
  EXPECT_EQ(gpu::decode_splits(1 << 20, 128), 1);
  EXPECT_EQ(gpu::decode_splits(1 << 20, 1024), 8);
  EXPECT_EQ(gpu::decode_splits(100, 1024), 1);
  EXPECT_EQ(gpu::split_decode_scratch_floats(3, 4, 64, 1), 0u);
  EXPECT_EQ(gpu::split_decode_scratch_floats(3, 4, 64, 5), size_t(3 * 4 * 5 * 66));
}

TEST(GpuKernels, IndexSelectBlocksMatchesCpu) {
  REQUIRE_GPU();
  const int hd = 32;
  PagedCase c(1, hd, true, KvLayout::kSeparate, KvOrder::kTokenMajor, Storage::kF32);
  Placement all(all_positions(), c.tables);
  std::vector<float> k = random_vec(all.n() * hd, 40);
  cpu::paged_kv_write(c.host_view(), all.host(), k.data(), hd, nullptr, 0, 1);
  Dev<float> dk(k);
  gpu::paged_kv_write(c.dev_view(), all.dev(), dk.get(), hd, nullptr, 0, 1, nullptr);
  std::vector<float> qi = random_vec(all.n() * hd, 41);
  Dev<float> dqi(qi);
  const int mask_stride = 8;
  for (int top_k : {1, 3, 100}) {
    std::vector<uint8_t> want(all.n() * mask_stride);
    cpu::index_select_blocks(want.data(), mask_stride, qi.data(), c.host_view(), all.host(), top_k);
    Dev<uint8_t> dmask(all.n() * mask_stride);
    gpu::index_select_blocks(dmask.get(), mask_stride, dqi.get(), c.dev_view(), all.dev(), top_k, nullptr);
    EXPECT_EQ(dmask.host(), want) << "top_k " << top_k;
  }
}

// Padding (a negative position, kernels/abi.h), as a recorded step's unused rows: the decode
// path's kernels write no K or V for it, select no block for it and give it zero attention
// output, and the real tokens beside it compute the same bits as without it.
TEST(GpuKernels, PaddingTokensWriteNoKvAndAttendNothing) {
  REQUIRE_GPU();
  const int kv_heads = 2, q_per_kv = 2, hd = 64, nq = kv_heads * q_per_kv;
  const int64_t kvw = kv_heads * hd, qw = nq * hd, width = qw + 2 * kvw;
  PagedCase c(kv_heads, hd, false, KvLayout::kSeparate, KvOrder::kTokenMajor, Storage::kBF16);
  Placement all(all_positions(), c.tables);
  Dev<float> dk(random_vec(all.n() * kvw, 90)), dv(random_vec(all.n() * kvw, 91));
  gpu::paged_kv_write(c.dev_view(), all.dev(), dk.get(), kvw, dv.get(), kvw, kv_heads, nullptr);
  const std::vector<uint8_t> cache = c.dev_arena->host();

  // Writes of padding only leave the cache as it was.
  Placement pads({{0, -1}, {1, -1}, {2, -1}}, c.tables);
  Dev<float> rows(random_vec(pads.n() * width, 92)), q_out(pads.n() * qw);
  gpu::paged_kv_write(c.dev_view(), pads.dev(), rows.get(), width, rows.get() + kvw, width, kv_heads, nullptr);
  const engine::RopeFrequencies table = engine::rope_frequencies({}, 10000.0f, hd, 512);
  Dev<float> dfreq(table.inv_freq);
  const kernels::QkvRows qkv{rows.get(), rows.get() + qw, rows.get() + qw + kvw, width, width, width, nq, kv_heads};
  gpu::qkv_rope_write(q_out.get(), qkv, {dfreq.get(), 1.0f, true}, c.dev_view(), pads.dev(), nullptr);
  EXPECT_EQ(c.dev_arena->host(), cache) << "padding wrote K or V";

  // Attention: two real tokens, each followed by a padding row; against the two alone.
  Placement real({{1, 100}, {0, 50}}, c.tables), padded({{1, 100}, {0, -1}, {0, 50}, {2, -1}}, c.tables);
  const std::vector<float> q = random_vec(padded.n() * qw, 93);
  std::vector<float> q_real(2 * qw);
  std::copy_n(q.begin(), qw, q_real.begin());
  std::copy_n(q.begin() + 2 * qw, qw, q_real.begin() + qw);
  Dev<float> dq(q), dq_real(q_real);
  auto attend = [&](const Placement& pl, const float* q_dev, int splits) {
    Dev<float> out(pl.n() * qw), scratch(std::max<size_t>(1, gpu::split_decode_scratch_floats(pl.n(), nq, hd, splits)));
    if (splits == 0) {
      gpu::paged_attention(out.get(), q_dev, c.dev_view(), pl.dev(), nq, q_per_kv, 0, 0.125f, nullptr);
    } else {
      gpu::split_decode_attention(out.get(), q_dev, c.dev_view(), pl.dev(), nq, q_per_kv, 0, 0.125f, splits, 16,
                                  scratch.get(), nullptr);
    }
    return out.host();
  };
  for (int splits : {0, 1, 4}) {  // 0: the unsplit decode kernel.
    const std::vector<float> want = attend(real, dq_real.get(), splits), got = attend(padded, dq.get(), splits);
    EXPECT_TRUE(std::equal(want.begin(), want.begin() + qw, got.begin())) << splits << " splits";
    EXPECT_TRUE(std::equal(want.begin() + qw, want.end(), got.begin() + 2 * qw)) << splits << " splits";
    for (int pad : {1, 3})
      EXPECT_TRUE(std::all_of(got.begin() + pad * qw, got.begin() + (pad + 1) * qw, [](float x) { return x == 0.0f; }))
          << splits << " splits, padding row " << pad;
  }

  // Block selection: no block for padding, the real tokens' as alone.
  const int mask_stride = 8;
  Dev<float> dqi(random_vec(padded.n() * hd, 94));
  Dev<uint8_t> mask_real(real.n() * mask_stride), mask_padded(padded.n() * mask_stride);
  PagedCase index(1, hd, true, KvLayout::kSeparate, KvOrder::kTokenMajor, Storage::kF32);
  Dev<float> dik(random_vec(all.n() * hd, 95));
  gpu::paged_kv_write(index.dev_view(), all.dev(), dik.get(), hd, nullptr, 0, 1, nullptr);
  gpu::index_select_blocks(mask_padded.get(), mask_stride, dqi.get(), index.dev_view(), padded.dev(), 2, nullptr);
  Dev<float> dqi_real(2 * hd);
  ASSERT_EQ(gpuMemcpy(dqi_real.get(), dqi.get(), hd * sizeof(float), gpuMemcpyDeviceToDevice), gpuSuccess);
  ASSERT_EQ(gpuMemcpy(dqi_real.get() + hd, dqi.get() + 2 * hd, hd * sizeof(float), gpuMemcpyDeviceToDevice),
            gpuSuccess);
  gpu::index_select_blocks(mask_real.get(), mask_stride, dqi_real.get(), index.dev_view(), real.dev(), 2, nullptr);
  const std::vector<uint8_t> got = mask_padded.host(), want = mask_real.host();
  const std::vector<uint8_t> none(mask_stride, 0);
  EXPECT_TRUE(std::equal(want.begin(), want.begin() + mask_stride, got.begin()));
  EXPECT_TRUE(std::equal(none.begin(), none.end(), got.begin() + mask_stride));
  EXPECT_TRUE(std::equal(want.begin() + mask_stride, want.end(), got.begin() + 2 * mask_stride));
  EXPECT_TRUE(std::equal(none.begin(), none.end(), got.begin() + 3 * mask_stride));
}

TEST(GpuKernels, PackThenUnpackConvertsLayouts) {
  REQUIRE_GPU();
  const int kv_heads = 2, hd = 32;
  PagedCase src(kv_heads, hd, false, KvLayout::kSeparate, KvOrder::kTokenMajor, Storage::kF32);
  PagedCase dst(kv_heads, hd, false, KvLayout::kInterleaved, KvOrder::kHeadMajor, Storage::kF32);
  Placement all(all_positions(), src.tables);
  std::vector<float> k = random_vec(all.n() * kv_heads * hd, 50), v = random_vec(all.n() * kv_heads * hd, 51);
  Dev<float> dk(k), dv(v);
  gpu::paged_kv_write(src.dev_view(), all.dev(), dk.get(), kv_heads * hd, dv.get(), kv_heads * hd, kv_heads, nullptr);
  // The destination holds the reference: the same tokens written straight into its layout.
  cpu::paged_kv_write(dst.host_view(), all.host(), k.data(), kv_heads * hd, v.data(), kv_heads * hd, kv_heads);
  std::vector<int> ids(src.blocks);
  std::iota(ids.begin(), ids.end(), 0);
  Dev<int> dids(ids);
  Dev<uint8_t> packed(gpu::packed_block_bytes(src.dev_view(), kv_heads) * ids.size());
  gpu::pack_blocks(packed.get(), src.dev_view(), dids.get(), ids.size(), 0, kv_heads, nullptr);
  gpu::unpack_blocks(dst.dev_view(), packed.get(), dids.get(), ids.size(), 0, kv_heads, nullptr);
  EXPECT_EQ(dst.dev_as_host_layout(), dst.host_arena);
}

}  // namespace
}  // namespace pdserve::kernels
