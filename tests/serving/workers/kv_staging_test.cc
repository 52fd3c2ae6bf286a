// KvStaging copies exactly a request's blocks (one layer, or all) between a device arena and its
// host mirror, for every KV layout and order of the mixed-geometry spec; the CPU backend stands
// in for the device (its copies are the same calls a GPU backend queues).
#include "worker/kv_staging.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "engine/engine.h"
#include "tests/engine/guarded_backend.h"
#include "tests/engine/kv_copy.h"
#include "tests/engine/test_model.h"
#include "tests/kvtransfer/kv_sim.h"

namespace pdserve::worker {
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
    auto layout = KvCacheLayout::create(kvtransfer::testing::mixed_spec(), /*rank=*/1, /*tp=*/2, /*num_blocks=*/12);
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
}  // namespace pdserve::worker

// The hand-off through host mirrors with a "device" that the host cannot touch (the guarded
// backend): a prefill on it stages each layer of its request to a mirror from the layer hook,
// as the prefill worker does, and a CPU engine decodes from the copy; the other way, a CPU
// prefill lands in a device engine's mirror and is staged in before the device decodes. Both
// give the undivided run's tokens.
namespace pdserve::worker {
namespace {

std::unique_ptr<engine::Engine> stories_engine(bool device, bool pinnable = true) {
  auto model = engine::load_model({pdserve::testing::stories_bin()});
  EXPECT_TRUE(model.ok()) << model.status();
  engine::EngineOptions o;
  o.kv_cache_bytes = 8 << 20;
  o.max_batch_tokens = 32;  // The prompt prefills in chunks over several steps.
  if (device)
    o.backend_factory = [pinnable](int) -> StatusOr<std::unique_ptr<engine::Backend>> {
      return pdserve::testing::make_guarded_backend(size_t(1) << 30, "guarded:0", pinnable);
    };
  auto e = engine::Engine::create(std::move(*model), o);
  EXPECT_TRUE(e.ok()) << e.status();
  return std::move(*e);
}

struct HandoffCase {
  std::vector<int> prompt;
  engine::SamplingParams params;
  std::vector<int> whole;  // The undivided run's tokens.
};

HandoffCase handoff_case() {
  HandoffCase c;
  c.prompt = {1};
  for (int i = 0; i < 70; ++i) c.prompt.push_back(3 + (i * 37) % 500);
  c.params.max_tokens = 40;
  c.params.ignore_eos = true;
  c.whole = stories_engine(false)->generate(c.prompt, c.params)->token_ids;
  return c;
}

TEST(KvStagingEngine, DevicePrefillStagedLayerByLayerDecodesOnTheCpu) {
  const HandoffCase c = handoff_case();
  auto prefill = stories_engine(true), decode = stories_engine(false);
  const engine::KvCacheLayout& layout = prefill->kv_layout(0);
  std::vector<uint8_t> mirror(layout.total_bytes());
  auto staging = KvStaging::create(layout, prefill->kv_arena(0), mirror.data(), &prefill->backend(0));
  ASSERT_TRUE(staging.ok()) << staging.status();
  EXPECT_TRUE((*staging)->pinned());
  std::vector<int> blocks;
  int staged_layers = 0;
  prefill->set_layer_hook([&](int, int layer, const std::vector<std::string>& completed) {
    if (std::find(completed.begin(), completed.end(), "r") == completed.end()) return;
    EXPECT_TRUE((*staging)->to_host(blocks, layer).ok());
    ++staged_layers;
  });
  engine::GenerationRequest req{"r", c.prompt, c.params};
  req.handoff.prefill_only = true;
  req.handoff.on_admitted = [&](const std::vector<int>& b) { blocks = b; };
  int first = -1;
  std::vector<int> handed;
  ASSERT_TRUE(prefill->add_request(req, [&](const engine::TokenEvent& ev) {
    if (ev.token >= 0) first = ev.token;
    if (ev.finished) handed = ev.blocks;
  }).ok());
  ASSERT_TRUE(prefill->run_until_idle().ok());
  EXPECT_EQ(staged_layers, layout.num_layers());
  ASSERT_EQ(handed, blocks);
  const int prompt_blocks = int((c.prompt.size() + 15) / 16);
  auto reserved = decode->reserve_cached_blocks({}, "", int(c.prompt.size()) + c.params.max_tokens);
  ASSERT_TRUE(reserved.ok());
  pdserve::testing::copy_kv_arena(layout, mirror.data(), handed, decode->kv_layout(0), decode->kv_arena(0), reserved->blocks,
                                  prompt_blocks);
  EXPECT_EQ(pdserve::testing::decode_preloaded(*decode, c.prompt, c.params, reserved->blocks, first), c.whole);
  EXPECT_TRUE(prefill->release_blocks(handed).ok());
}

// The device's driver will not pin this mirror: staging still works, unpinned.
TEST(KvStagingEngine, CpuPrefillStagedIntoADeviceDecodes) {
  const HandoffCase c = handoff_case();
  auto prefill = stories_engine(false), decode = stories_engine(true, /*pinnable=*/false);
  const auto [first, handed] = pdserve::testing::run_prefill_only(*prefill, c.prompt, c.params);
  ASSERT_GE(first, 0);
  const engine::KvCacheLayout& layout = decode->kv_layout(0);
  std::vector<uint8_t> mirror(layout.total_bytes());
  auto staging = KvStaging::create(layout, decode->kv_arena(0), mirror.data(), &decode->backend(0));
  ASSERT_TRUE(staging.ok()) << staging.status();
  EXPECT_FALSE((*staging)->pinned());
  const int prompt_blocks = int((c.prompt.size() + 15) / 16);
  auto reserved = decode->reserve_cached_blocks({}, "", int(c.prompt.size()) + c.params.max_tokens);
  ASSERT_TRUE(reserved.ok());
  pdserve::testing::copy_kv_arena(prefill->kv_layout(0), prefill->kv_arena(0), handed, layout, mirror.data(),
                                  reserved->blocks, prompt_blocks);
  const std::vector<int> prompt_part(reserved->blocks.begin(), reserved->blocks.begin() + prompt_blocks);
  ASSERT_TRUE((*staging)->to_device(prompt_part).ok());
  EXPECT_EQ(pdserve::testing::decode_preloaded(*decode, c.prompt, c.params, reserved->blocks, first), c.whole);
  EXPECT_TRUE(prefill->release_blocks(handed).ok());
  EXPECT_EQ(decode->stats().free_blocks, decode->stats().num_blocks);
}

}  // namespace
}  // namespace pdserve::worker
