// The decode graphs' buckets (a pure function, table-tested) and what DecodeGraphs keeps when a
// backend cannot record. Recording and replaying are tested on the GPU backend and its emulation
// (tests/gpu/gpu_backend_test.cc: GpuBackend.RecordedGraph…, Stories.GpuEngineDecodeGraphs…).
#include "engine/decode_graphs.h"

#include <gtest/gtest.h>

namespace pdserve::engine {
namespace {

TEST(DecodeGraphBucket, IsTheSmallestBucketOfAtLeastTheTokens) {
  struct Case {
    int tokens, max_batch, bucket;
  };
  const Case cases[] = {
      {1, 256, 1},     {2, 256, 2},     {3, 256, 4},     {4, 256, 4},   {5, 256, 8},     {8, 256, 8},
      {9, 256, 16},    {17, 256, 24},   {63, 256, 64},   {64, 256, 64}, {65, 256, 80},   {127, 256, 128},
      {129, 256, 160}, {255, 256, 256}, {256, 256, 256}, {257, 256, 0}, {0, 256, 0},     {-1, 256, 0},
      {5, 6, 6},       {6, 6, 6},       {7, 6, 0},       {1, 1, 1},     {100, 100, 100}, {97, 100, 100},
  };
  for (const Case& c : cases)
    EXPECT_EQ(decode_graph_bucket(c.tokens, c.max_batch), c.bucket) << c.tokens << " of " << c.max_batch;
}

TEST(DecodeGraphs, ABackendThatRecordsNothingRefusesTheBucket) {
  auto cpu = make_cpu_backend();
  DecodeGraphs graphs;
  bool ran = false;
  const Status recorded = graphs.record(*cpu, 8, [&] { ran = true; });
  EXPECT_EQ(recorded.code(), absl::StatusCode::kUnimplemented) << recorded;
  EXPECT_FALSE(ran) << "the body ran without a recording";
  EXPECT_TRUE(graphs.refused(8));
  EXPECT_FALSE(graphs.refused(16));
  EXPECT_EQ(graphs.find(8), nullptr);
  graphs.clear();
  EXPECT_TRUE(graphs.refused(8)) << "refusals outlive the graphs";
}

}  // namespace
}  // namespace pdserve::engine
