// The GPU sampling kernel's device code (kernels/gpu/sampling_kernel.h) run on the CPU by the
// SIMT emulator, against the reference sampler (kernels/cpu/sampling.h): the same token for
// every row — greedy with ties, NaN and -inf, temperatures, top-k, top-p and both, rows full of
// equal probabilities, plain and TP-gathered rows — at two block sizes, with the block's
// threads run in both orders. Built without a GPU, so CI checks the kernel's logic; the GPU
// suite runs the same comparison on the device (GpuKernels.SamplingMatchesCpuReference).
#include "tests/gpu/simt_emulator.h"
// The kernel after the emulator's definitions of the CUDA names.
#include "kernels/gpu/sampling_kernel.h"

#include <gtest/gtest.h>

#include <random>
#include <vector>

namespace pdserve::kernels::gpu {
namespace {

struct Case {
  int vocab, shards;
  unsigned block;
};

// Rows with every combination of the parameters, at random draws, and the logits to go with them.
struct Rows {
  std::vector<cpu::SampleRow> params;
  std::vector<float> plain;  // [rows][vocab]
};

Rows make_rows(int vocab, uint32_t seed) {
  Rows rows;
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  for (float t : {0.0f, 0.7f, 1.5f})
    for (int k : {0, 1, 3, 50})
      for (float p : {1.0f, 0.9f, 0.3f}) rows.params.push_back({t, k, p, uniform(rng)});
  rows.params.push_back({1.0f, 0, 1.0f, 0.0});           // The draw's first candidate.
  rows.params.push_back({1.0f, 0, 1.0f, 1.0 - 1e-12});   // Its last.
  rows.params.push_back({1.0f, 4, 1.0f, 1.0 - 1e-12});
  const int leading_gap = int(rows.params.size());
  rows.params.push_back({1.0f, 0, 1.0f, 0.0});  // The first candidate, after a run of -inf.
  const int n = int(rows.params.size());
  std::normal_distribution<float> normal(0.0f, 2.0f);
  rows.plain.resize(size_t(n) * vocab);
  for (float& x : rows.plain) x = normal(rng);
  for (int r = 0; r < n; ++r) {
    float* row = rows.plain.data() + int64_t(r) * vocab;
    if (r % 3 == 0)  // Steps of 0.5: equal probabilities at every cut.
      for (int i = 0; i < vocab; ++i) row[i] = std::round(row[i] * 2.0f) / 2.0f;
    if (r % 4 == 1) row[r % vocab] = std::nanf("");
    if (r % 5 == 2)
      for (int i = 1; i < vocab; i += 2) row[i] = -INFINITY;
    if (r == 7)  // Everything NaN but one -inf: the reference takes index 0.
      for (int i = 0; i < vocab; ++i) row[i] = i == vocab / 2 ? -INFINITY : std::nanf("");
    if (r == leading_gap)
      for (int i = 0; i < vocab * 3 / 5; ++i) row[i] = -INFINITY;
  }
  return rows;
}

TEST(SamplingKernel, EmulatedBlockPicksTheReferenceToken) {
  for (const Case c : {Case{1, 1, 32}, Case{2, 1, 32}, Case{7, 3, 64}, Case{100, 3, 32}, Case{1000, 1, 64},
                       Case{3001, 3, 32}}) {
    const Rows rows = make_rows(c.vocab, 40 + c.vocab);
    const int n = int(rows.params.size());
    cpu::ShardedLogits logits{nullptr, n, c.vocab, c.shards};
    std::vector<float> gathered(size_t(c.shards) * n * logits.shard_stride(), 0.0f);
    logits.data = gathered.data();
    for (int s = 0; s < c.shards; ++s)
      for (int r = 0; r < n; ++r)
        for (int i = logits.shard_begin(s); i < logits.shard_begin(s + 1); ++i)
          const_cast<float*>(logits.row_of_shard(s, r))[i - logits.shard_begin(s)] = rows.plain[int64_t(r) * c.vocab + i];
    std::vector<int> want(n);
    cpu::SampleScratch scratch;
    cpu::sample_rows(want.data(), logits, rows.params.data(), &scratch);
    for (bool reverse : {false, true}) {
      std::vector<int> got(n, -1);
      std::vector<float> kernel_scratch(size_t(n) * c.vocab);
      testing::simt::launch(sampling_detail::sample_kernel, unsigned(n), c.block, reverse, got.data(), logits,
                            rows.params.data(), kernel_scratch.data());
      for (int r = 0; r < n; ++r) {
        const cpu::SampleRow& p = rows.params[r];
        EXPECT_EQ(got[r], want[r]) << "vocab " << c.vocab << ", " << c.shards << " shards, block " << c.block
                                   << (reverse ? " reversed" : "") << ", row " << r << ": temperature "
                                   << p.temperature << " top_k " << p.top_k << " top_p " << p.top_p << " u " << p.u;
      }
    }
  }
}

}  // namespace
}  // namespace pdserve::kernels::gpu
