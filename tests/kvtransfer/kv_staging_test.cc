// KvStaging copies exactly a request's blocks (one layer, or all) between a device arena and its
// host mirror, for every KV layout and order of the mixed-geometry spec; the CPU backend stands
// in for the device (its copies are the same calls a GPU backend queues).
#include "kvtransfer/kv_staging.h"

#include <gtest/gtest.h>

#include "tests/kvtransfer/kv_sim.h"

namespace pdserve::kvtransfer {
namespace {

using engine::ByteRange;
using engine::KvCacheLayout;
using engine::KvPart;

// Which arena bytes belong to `blocks` of `layer` (every layer when layer < 0).
std::vector<char> owned(const KvCacheLayout& L, const std::vector<int>& blocks, int layer) {
  std::vector<char> mask(L.total_bytes(), 0);
  for (int l = 0; l < L.num_layers(); ++l) {
    if (layer >= 0 && l != layer) continue;
    std::vector<ByteRange> ranges;
    for (int b : blocks) {
      L.ranges(l, b, KvPart::kK, 0, L.num_local_heads(l), &ranges);
      if (L.spec().layers[l].has_v()) L.ranges(l, b, KvPart::kV, 0, L.num_local_heads(l), &ranges);
    }
    for (const ByteRange& r : ranges) std::fill_n(mask.begin() + r.offset, r.length, 1);
  }
  return mask;
}

class KvStagingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto layout = KvCacheLayout::create(testing::mixed_spec(), /*rank=*/1, /*tp=*/2, /*num_blocks=*/12);
    ASSERT_TRUE(layout.ok()) << layout.status();
    layout_ = std::make_unique<KvCacheLayout>(*layout);
    backend_ = engine::make_cpu_backend();
    device_.resize(layout_->total_bytes());
    host_.assign(layout_->total_bytes(), 0);
    for (size_t i = 0; i < device_.size(); ++i) device_[i] = uint8_t(i * 131 + 7);
    auto staging = KvStaging::create(*layout_, device_.data(), host_.data(), backend_.get());
    ASSERT_TRUE(staging.ok()) << staging.status();
    staging_ = std::move(*staging);
  }
  std::unique_ptr<KvCacheLayout> layout_;
  std::unique_ptr<engine::Backend> backend_;
  std::vector<uint8_t> device_, host_;
  std::unique_ptr<KvStaging> staging_;
};

TEST_F(KvStagingTest, ToHostCopiesOneLayerOfTheRequestsBlocksAndNothingElse) {
  const std::vector<int> blocks = {2, 3, 4, 9};
  for (int layer = 0; layer < layout_->num_layers(); ++layer) {
    std::fill(host_.begin(), host_.end(), 0);
    ASSERT_TRUE(staging_->to_host(blocks, layer).ok());
    const std::vector<char> mask = owned(*layout_, blocks, layer);
    for (size_t i = 0; i < host_.size(); ++i)
      ASSERT_EQ(host_[i], mask[i] ? device_[i] : 0) << "layer " << layer << " byte " << i;
  }
  uint64_t expected = 0;
  for (int layer = 0; layer < layout_->num_layers(); ++layer)
    for (char c : owned(*layout_, blocks, layer)) expected += c;
  EXPECT_EQ(staging_->bytes_to_host(), expected);
}

TEST_F(KvStagingTest, ToDeviceCopiesEveryLayerOfTheBlocksBack) {
  for (size_t i = 0; i < host_.size(); ++i) host_[i] = uint8_t(255 - i % 251);
  const std::vector<uint8_t> before = device_;
  const std::vector<int> blocks = {5, 11, 0};
  ASSERT_TRUE(staging_->to_device(blocks).ok());
  const std::vector<char> mask = owned(*layout_, blocks, -1);
  for (size_t i = 0; i < device_.size(); ++i) ASSERT_EQ(device_[i], mask[i] ? host_[i] : before[i]) << i;
  EXPECT_GT(staging_->bytes_to_device(), 0u);
}

TEST_F(KvStagingTest, BlocksOrLayersOutsideTheArenaAreRefusedUntouched) {
  const std::vector<uint8_t> before = host_;
  EXPECT_EQ(staging_->to_host({1, 12}).code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(staging_->to_host({-1}).code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(staging_->to_host({1}, layout_->num_layers()).code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(staging_->to_device({40}).code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(host_, before);
  EXPECT_EQ(staging_->bytes_to_host(), 0u);
}

}  // namespace
}  // namespace pdserve::kvtransfer
