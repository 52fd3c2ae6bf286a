// KvIndex's consumer state machine, fed batches by hand: contiguous apply, gaps (by seq and by
// heartbeat), replays that overlap buffered live batches, snapshots, new epochs, failures
// leading to DEGRADED, drift, and the prefix match.
#include "router/kv_index.h"

#include <gtest/gtest.h>

#include "kvevents/wire.h"

namespace pdserve::router {
namespace {

namespace kv = pdserve::kvevents;
using engine::BlockKey;
using engine::KvTier;

BlockKey key(uint8_t n) {
  BlockKey k;
  k.bytes[0] = n;
  k.bytes[15] = 0xa5;
  return k;
}

kv::KvEventBatch batch(uint64_t epoch, uint64_t seq) {
  kv::KvEventBatch b;
  b.set_epoch(epoch);
  b.set_seq(seq);
  b.set_worker_id("w");
  return b;
}

kv::KvEventBatch stored(uint64_t epoch, uint64_t seq, std::vector<uint8_t> keys) {
  auto b = batch(epoch, seq);
  auto* s = b.add_events()->mutable_stored();
  s->set_tier(kv::TIER_DEVICE);
  for (uint8_t k : keys) s->add_keys(kv::key_bytes(key(k)));
  return b;
}

kv::KvEventBatch removed(uint64_t epoch, uint64_t seq, std::vector<uint8_t> keys) {
  auto b = batch(epoch, seq);
  auto* r = b.add_events()->mutable_removed();
  r->set_tier(kv::TIER_DEVICE);
  for (uint8_t k : keys) r->add_keys(kv::key_bytes(key(k)));
  return b;
}

kv::KvEventBatch heartbeat(uint64_t epoch, uint64_t last_seq, uint64_t device_keys) {
  auto b = batch(epoch, 0);
  auto* hb = b.add_events()->mutable_heartbeat();
  hb->set_last_seq(last_seq);
  hb->set_num_keys_device(device_keys);
  return b;
}

kv::KvEventBatch snapshot(uint64_t epoch, uint64_t snapshot_seq, std::vector<uint8_t> keys) {
  auto b = stored(epoch, 0, std::move(keys));
  b.set_snapshot(true);
  b.set_snapshot_seq(snapshot_seq);
  return b;
}

std::vector<BlockKey> keys_of(std::vector<uint8_t> ns) {
  std::vector<BlockKey> out;
  for (uint8_t n : ns) out.push_back(key(n));
  std::sort(out.begin(), out.end());
  return out;
}

constexpr ReplayRequest kSnapshot{0, 0};

// A worker brought to EXACT at (epoch 7, seq 2) holding keys {1, 2}.
class KvIndexTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(*index_.add_worker("w"), kSnapshot);
    EXPECT_EQ(index_.state("w"), WorkerKvState::kRecovering);
    index_.on_replay_batch("w", snapshot(7, 2, {1, 2}));
    EXPECT_EQ(index_.on_replay_end("w"), std::nullopt);
    ASSERT_EQ(index_.state("w"), WorkerKvState::kExact);
  }
  KvIndex index_;
};

TEST_F(KvIndexTest, SnapshotThenContiguousBatchesApply) {
  EXPECT_EQ(index_.keys("w", KvTier::kDevice), keys_of({1, 2}));
  EXPECT_EQ(index_.on_live("w", stored(7, 3, {3})), std::nullopt);
  EXPECT_EQ(index_.on_live("w", removed(7, 4, {1})), std::nullopt);
  EXPECT_EQ(index_.keys("w", KvTier::kDevice), keys_of({2, 3}));
  EXPECT_EQ(index_.last_seq("w"), 4u);
  EXPECT_EQ(index_.stats().snapshots, 1u);
  // A duplicate (an overlapped replay) changes nothing.
  EXPECT_EQ(index_.on_live("w", stored(7, 3, {3})), std::nullopt);
  EXPECT_EQ(index_.keys("w", KvTier::kDevice), keys_of({2, 3}));
}

TEST_F(KvIndexTest, SeqGapRequestsReplayAndBuffersLiveBatches) {
  EXPECT_EQ(index_.on_live("w", stored(7, 4, {4})), (ReplayRequest{7, 3}));
  EXPECT_EQ(index_.state("w"), WorkerKvState::kRecovering);
  EXPECT_EQ(index_.stats().gaps, 1u);
  EXPECT_EQ(index_.on_live("w", stored(7, 5, {5})), std::nullopt);  // Buffered, no second request.
  EXPECT_EQ(index_.keys("w", KvTier::kDevice), keys_of({1, 2}));
  // The reply covers 3..4, overlapping the buffered 4; 5 follows from the buffer.
  index_.on_replay_batch("w", stored(7, 3, {3}));
  index_.on_replay_batch("w", stored(7, 4, {4}));
  EXPECT_EQ(index_.on_replay_end("w"), std::nullopt);
  EXPECT_EQ(index_.state("w"), WorkerKvState::kExact);
  EXPECT_EQ(index_.last_seq("w"), 5u);
  EXPECT_EQ(index_.keys("w", KvTier::kDevice), keys_of({1, 2, 3, 4, 5}));
}

TEST_F(KvIndexTest, HeartbeatRevealsLossOfTheLastBatch) {
  EXPECT_EQ(index_.on_live("w", heartbeat(7, 2, 2)), std::nullopt);
  EXPECT_EQ(index_.on_live("w", heartbeat(7, 3, 3)), (ReplayRequest{7, 3}));
  EXPECT_EQ(index_.stats().gaps, 1u);
  index_.on_replay_batch("w", stored(7, 3, {3}));
  EXPECT_EQ(index_.on_replay_end("w"), std::nullopt);
  EXPECT_EQ(index_.keys("w", KvTier::kDevice), keys_of({1, 2, 3}));
}

TEST_F(KvIndexTest, HeartbeatKeyCountDriftRequestsSnapshot) {
  EXPECT_EQ(index_.on_live("w", heartbeat(7, 2, 5)), kSnapshot);
  EXPECT_EQ(index_.stats().drifts, 1u);
}

TEST_F(KvIndexTest, NewEpochClearsTheWorkerAndAsksForASnapshot) {
  EXPECT_EQ(index_.on_live("w", stored(9, 1, {8})), kSnapshot);
  EXPECT_TRUE(index_.keys("w", KvTier::kDevice).empty());
  EXPECT_EQ(index_.stats().epochs, 1u);
  // The snapshot includes seq 1 (S = 1): the buffered seq 1 is not applied twice; seq 2 is.
  EXPECT_EQ(index_.on_live("w", removed(9, 2, {8})), std::nullopt);
  index_.on_replay_batch("w", snapshot(9, 1, {8}));
  EXPECT_EQ(index_.on_replay_end("w"), std::nullopt);
  EXPECT_EQ(index_.epoch("w"), 9u);
  EXPECT_EQ(index_.last_seq("w"), 2u);
  EXPECT_TRUE(index_.keys("w", KvTier::kDevice).empty());
}

TEST_F(KvIndexTest, SnapshotReplacesStateAndLiveAfterItApplies) {
  ASSERT_EQ(index_.on_live("w", stored(7, 10, {10})), (ReplayRequest{7, 3}));
  EXPECT_EQ(index_.on_live("w", stored(7, 11, {11})), std::nullopt);
  // The ring no longer held seq 3: the publisher answers with a snapshot at S = 10.
  index_.on_replay_batch("w", snapshot(7, 10, {2, 10}));
  EXPECT_EQ(index_.on_replay_end("w"), std::nullopt);
  EXPECT_EQ(index_.keys("w", KvTier::kDevice), keys_of({2, 10, 11}));
  EXPECT_EQ(index_.state("w"), WorkerKvState::kExact);
}

TEST_F(KvIndexTest, ReplayThatLeavesAGapAsksAgain) {
  ASSERT_EQ(index_.on_live("w", stored(7, 6, {6})), (ReplayRequest{7, 3}));
  index_.on_replay_batch("w", stored(7, 3, {3}));  // The reply stops at 3 (it raced the publisher).
  EXPECT_EQ(index_.on_replay_end("w"), (ReplayRequest{7, 4}));
  EXPECT_EQ(index_.state("w"), WorkerKvState::kRecovering);
}

TEST_F(KvIndexTest, ThreeFailedReplaysDegradeUntilOneSucceeds) {
  ASSERT_EQ(index_.on_live("w", heartbeat(7, 5, 5)), (ReplayRequest{7, 3}));
  EXPECT_EQ(index_.on_replay_failed("w"), (ReplayRequest{7, 3}));
  EXPECT_EQ(index_.on_replay_failed("w"), (ReplayRequest{7, 3}));
  EXPECT_EQ(index_.state("w"), WorkerKvState::kRecovering);
  EXPECT_EQ(index_.on_replay_failed("w"), (ReplayRequest{7, 3}));
  EXPECT_EQ(index_.state("w"), WorkerKvState::kDegraded);
  index_.on_replay_batch("w", snapshot(7, 5, {1}));
  EXPECT_EQ(index_.on_replay_end("w"), std::nullopt);
  EXPECT_EQ(index_.state("w"), WorkerKvState::kExact);
  EXPECT_EQ(index_.keys("w", KvTier::kDevice), keys_of({1}));
}

TEST_F(KvIndexTest, FailedPartialSnapshotAsksForAWholeOne) {
  ASSERT_EQ(index_.on_live("w", stored(9, 1, {1})), kSnapshot);
  index_.on_replay_batch("w", snapshot(9, 1, {1}));
  EXPECT_EQ(index_.on_replay_failed("w"), kSnapshot);
  EXPECT_NE(index_.state("w"), WorkerKvState::kExact);
}

TEST_F(KvIndexTest, RemoveWorkerDropsItsKeys) {
  ASSERT_TRUE(index_.add_worker("v").ok());
  index_.on_replay_batch("v", snapshot(3, 0, {2, 9}));
  index_.on_replay_end("v");
  EXPECT_EQ(index_.num_keys(KvTier::kDevice), 3u);  // {1, 2} ∪ {2, 9}
  index_.remove_worker("w");
  EXPECT_EQ(index_.num_keys(KvTier::kDevice), 2u);
  EXPECT_EQ(index_.state("w"), std::nullopt);
  EXPECT_EQ(index_.keys("v", KvTier::kDevice), keys_of({2, 9}));
}

TEST_F(KvIndexTest, MatchGivesEachWorkersLongestPresentPrefix) {
  ASSERT_TRUE(index_.add_worker("v").ok());
  index_.on_replay_batch("v", snapshot(3, 0, {1, 2, 3}));
  index_.on_replay_end("v");
  ASSERT_TRUE(index_.add_worker("u").ok());  // No snapshot yet: RECOVERING, nothing.
  const std::vector<BlockKey> chain = {key(1), key(2), key(3), key(4)};
  std::map<std::string, size_t> blocks;
  for (const auto& m : index_.match(chain)) blocks[m.worker_id] = m.blocks;
  EXPECT_EQ(blocks, (std::map<std::string, size_t>{{"u", 0}, {"v", 3}, {"w", 2}}));
  // A hole ends the prefix even though later keys are present.
  const std::vector<BlockKey> holed = {key(1), key(5), key(2)};
  for (const auto& m : index_.match(holed)) EXPECT_EQ(m.blocks, m.worker_id == "u" ? 0u : 1u) << m.worker_id;
  EXPECT_TRUE(index_.match({}, KvTier::kHost).size() == 3);
}

TEST(KvIndexSlots, AtMost64Workers) {
  KvIndex index;
  for (int i = 0; i < KvIndex::kMaxWorkers; ++i) ASSERT_TRUE(index.add_worker("w" + std::to_string(i)).ok());
  EXPECT_EQ(index.add_worker("one-too-many").status().code(), absl::StatusCode::kResourceExhausted);
  index.remove_worker("w5");
  EXPECT_TRUE(index.add_worker("one-too-many").ok());
}

}  // namespace
}  // namespace pdserve::router

namespace pdserve::router {
namespace {

// Batches must carry the key space the worker's Info advertised: any other scheme (key root),
// block size or compat hash is rejected, counted, and never applied.
TEST(KvIndex, RejectsBatchesOfAnotherKeySpace) {
  const KvScheme scheme{std::string(kv::kKeySchemeV1) + kv::key_bytes(key(99)), 16, 7};
  auto with = [&](kv::KvEventBatch b, KvScheme s) {
    b.set_key_scheme(s.key_scheme);
    b.set_block_size(s.block_size);
    b.set_compat_hash(s.compat_hash);
    return b;
  };
  KvIndex index;
  ASSERT_TRUE(index.add_worker("w", scheme).ok());
  KvScheme other_root = scheme, other_size = scheme, other_hash = scheme;
  other_root.key_scheme = std::string(kv::kKeySchemeV1) + kv::key_bytes(key(98));
  other_size.block_size = 32;
  other_hash.compat_hash = 8;
  for (const KvScheme& bad : {other_root, other_size, other_hash})
    index.on_replay_batch("w", with(snapshot(5, 0, {1}), bad));
  EXPECT_EQ(index.on_replay_end("w"), std::nullopt) << "asking again would get the same";
  EXPECT_EQ(index.state("w"), WorkerKvState::kDegraded);
  EXPECT_EQ(index.stats().rejected, 3u);
  index.on_replay_batch("w", with(snapshot(5, 0, {1}), scheme));
  EXPECT_EQ(index.on_replay_end("w"), std::nullopt);
  ASSERT_EQ(index.state("w"), WorkerKvState::kExact);
  EXPECT_EQ(index.on_live("w", with(stored(5, 1, {2}), other_size)), std::nullopt);
  EXPECT_EQ(index.keys("w", KvTier::kDevice), keys_of({1}));
  EXPECT_EQ(index.on_live("w", with(stored(5, 1, {2}), scheme)), std::nullopt);
  EXPECT_EQ(index.keys("w", KvTier::kDevice), keys_of({1, 2}));
  EXPECT_EQ(index.stats().rejected, 4u);
}

}  // namespace
}  // namespace pdserve::router
