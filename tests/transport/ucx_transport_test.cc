// Single-process tests of the UCX transport: two transports in one process exchange bytes over
// whatever UCX_TLS selects; argument validation, handle bookkeeping, counters, disconnect and
// the caller-driven progress mode.
#include <algorithm>
#include <atomic>
#include <cstring>
#include <numeric>
#include <vector>

#include <gtest/gtest.h>

#include "kvtransfer/ucx/stream_copy.h"
#include "kvtransfer/ucx/ucx_transport.h"

namespace pdserve::kvtransfer {
namespace {

using namespace std::chrono_literals;

std::unique_ptr<UcxTransport> make(bool progress_thread) {
  auto t = UcxTransport::create({.progress_thread = progress_thread});
  EXPECT_TRUE(t.ok()) << t.status();
  return std::move(*t);
}

// Initiator (caller-driven progress) and target (progress thread), a source and a destination.
class UcxLoopbackTest : public ::testing::Test {
 protected:
  void SetUp() override {
    initiator_ = make(/*progress_thread=*/false);
    target_ = make(/*progress_thread=*/true);
    src_.resize(1 << 16);
    std::iota(src_.begin(), src_.end(), 0);
    dst_.assign(1 << 16, 0);
    auto src = initiator_->register_region({src_.data(), src_.size()});
    auto dst = target_->register_region({dst_.data(), dst_.size()});
    ASSERT_TRUE(src.ok() && dst.ok());
    src_id_ = src->id;
    auto peer = initiator_->connect(target_->local_address());
    ASSERT_TRUE(peer.ok()) << peer.status();
    peer_ = *peer;
    auto remote = initiator_->load_remote_region(peer_, dst->descriptor);
    ASSERT_TRUE(remote.ok()) << remote.status();
    remote_ = *remote;
  }

  Status run(StatusOr<BatchId> id) {
    if (!id.ok()) return id.status();
    Status s = initiator_->wait(*id, 10s);
    EXPECT_TRUE(initiator_->release_batch(*id).ok());
    return s;
  }

  std::unique_ptr<UcxTransport> initiator_, target_;
  std::vector<uint8_t> src_, dst_;
  RegionId src_id_ = 0;
  PeerId peer_ = 0;
  RemoteRegionId remote_ = 0;
};

TEST_F(UcxLoopbackTest, PutFlushGetRoundTrip) {
  TransferBatch put{peer_, {{OpCode::kPut, src_id_, 0, remote_, 1024, 4096},
                            {OpCode::kPut, src_id_, 8192, remote_, 0, 1024}}};
  ASSERT_TRUE(run(initiator_->post(put)).ok());
  ASSERT_TRUE(run(initiator_->flush(peer_)).ok());
  EXPECT_TRUE(std::equal(src_.begin(), src_.begin() + 4096, dst_.begin() + 1024));
  EXPECT_TRUE(std::equal(src_.begin() + 8192, src_.begin() + 9216, dst_.begin()));

  std::vector<uint8_t> back(5120, 0);
  auto back_region = initiator_->register_region({back.data(), back.size()});
  ASSERT_TRUE(back_region.ok());
  TransferBatch get{peer_, {{OpCode::kGet, back_region->id, 0, remote_, 0, 5120}}};
  ASSERT_TRUE(run(initiator_->post(get)).ok());
  EXPECT_TRUE(std::equal(back.begin(), back.end(), dst_.begin()));

  const TransportCounters c = initiator_->counters();
  EXPECT_EQ(c.bytes_put, 5120u);
  EXPECT_EQ(c.bytes_got, 5120u);
  EXPECT_EQ(c.ops_posted, 3u);
  EXPECT_EQ(c.ops_completed, 3u);
  EXPECT_EQ(c.ops_failed, 0u);
  EXPECT_EQ(c.flushes, 1u);
  EXPECT_TRUE(initiator_->deregister_region(back_region->id).ok());
  EXPECT_TRUE(initiator_->endpoint_info(peer_).ok());
}

TEST_F(UcxLoopbackTest, EveryEndedBatchRunsTheActivityCallback) {
  std::atomic<int> calls{0};
  initiator_->set_activity_callback([&] { ++calls; });
  TransferBatch put{peer_, {{OpCode::kPut, src_id_, 0, remote_, 0, 4096}}};
  ASSERT_TRUE(run(initiator_->post(put)).ok());
  EXPECT_EQ(calls.load(), 1);
  ASSERT_TRUE(run(initiator_->flush(peer_)).ok());
  EXPECT_EQ(calls.load(), 2);
  // A failed batch counts too: the owner must look at it as soon as it failed.
  ASSERT_TRUE(initiator_->disconnect(peer_, "test").ok());
  EXPECT_FALSE(run(initiator_->post(put)).ok());
  EXPECT_GE(calls.load(), 2);
  initiator_->set_activity_callback(nullptr);
}

TEST_F(UcxLoopbackTest, EmptyBatchIsDoneAtOnce) {
  auto id = initiator_->post({peer_, {}});
  ASSERT_TRUE(id.ok());
  auto status = initiator_->batch_status(*id);
  ASSERT_TRUE(status.ok());
  EXPECT_EQ(status->state, BatchState::kDone);
  EXPECT_TRUE(initiator_->release_batch(*id).ok());
  EXPECT_EQ(initiator_->release_batch(*id).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(initiator_->batch_status(*id).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(UcxLoopbackTest, InvalidOpsAreRejectedBeforeAnythingIsPosted) {
  const std::vector<TransferOp> bad = {
      {OpCode::kPut, src_id_, 0, remote_, (1 << 16) - 10, 11},   // Past the remote end.
      {OpCode::kPut, src_id_, (1 << 16) - 10, remote_, 0, 11},   // Past the local end.
      {OpCode::kPut, src_id_, 0, remote_, ~0ull, 2},             // Offset overflow.
      {OpCode::kPut, src_id_, 0, remote_, 0, 0},                 // Empty.
      {OpCode::kPut, 999999, 0, remote_, 0, 8},                  // Unknown local region.
      {OpCode::kGet, src_id_, 0, 999999, 0, 8},                  // Unknown remote region.
  };
  for (const TransferOp& op : bad) {
    TransferBatch batch{peer_, {{OpCode::kPut, src_id_, 0, remote_, 0, 8}, op}};
    EXPECT_FALSE(initiator_->post(batch).ok());
  }
  EXPECT_EQ(initiator_->post({999999, {}}).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(initiator_->counters().ops_posted, 0u);
}

TEST_F(UcxLoopbackTest, ConnectIsIdempotentPerAddress) {
  auto again = initiator_->connect(target_->local_address());
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, peer_);
}

TEST_F(UcxLoopbackTest, DisconnectFailsThePeerAndCallsBack) {
  std::atomic<int> calls{0};
  initiator_->set_peer_error_callback([&](PeerId peer, const Status& error) {
    EXPECT_EQ(peer, peer_);
    EXPECT_EQ(error.code(), absl::StatusCode::kCancelled);
    ++calls;
  });
  ASSERT_TRUE(initiator_->disconnect(peer_, "heartbeat lost").ok());
  EXPECT_EQ(calls.load(), 1);
  auto post = initiator_->post({peer_, {{OpCode::kPut, src_id_, 0, remote_, 0, 8}}});
  EXPECT_EQ(post.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(post.status().message().find("heartbeat lost"), absl::string_view::npos);
  EXPECT_EQ(initiator_->flush(peer_).status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(initiator_->counters().peer_failures, 1u);
  // A fresh connect replaces the failed endpoint.
  auto again = initiator_->connect(target_->local_address());
  ASSERT_TRUE(again.ok());
  EXPECT_NE(*again, peer_);
}

// Regions the transport allocated: a put into the target's lands there, a get from it into
// the initiator's allocated region brings it back, and deregister_region frees them. Over
// shared memory the target's region is mapped into the initiator, which then copies by itself
// (direct_copy) — or posts a UCX request per op when told not to; the bytes are the same.
class AllocatedRegionsTest : public ::testing::TestWithParam<bool> {};

TEST_P(AllocatedRegionsTest, TakePutsAndGets) {
  const bool direct_copy = GetParam();
  auto made = UcxTransport::create({.progress_thread = false, .direct_copy = direct_copy});
  ASSERT_TRUE(made.ok()) << made.status();
  auto initiator = std::move(*made);
  auto target = make(/*progress_thread=*/true);
  constexpr size_t kBytes = (1 << 20) + 123;  // Not a multiple of the page size.
  auto dst = target->allocate_region(kBytes, MemoryKind::kHost);
  ASSERT_TRUE(dst.ok()) << dst.status();
  ASSERT_NE(dst->addr, nullptr);
  std::memset(dst->addr, 0, kBytes);
  auto src = initiator->allocate_region(kBytes, MemoryKind::kHost);
  ASSERT_TRUE(src.ok()) << src.status();
  auto* s = static_cast<uint8_t*>(src->addr);
  for (size_t i = 0; i < kBytes; ++i) s[i] = static_cast<uint8_t>(i * 7 + 1);

  auto peer = initiator->connect(target->local_address());
  ASSERT_TRUE(peer.ok()) << peer.status();
  auto remote = initiator->load_remote_region(*peer, dst->descriptor);
  ASSERT_TRUE(remote.ok()) << remote.status();
  auto run = [&](StatusOr<BatchId> id) {
    if (!id.ok()) return id.status();
    Status st = initiator->wait(*id, 10s);
    EXPECT_TRUE(initiator->release_batch(*id).ok());
    return st;
  };
  std::atomic<int> signals{0};
  initiator->set_activity_callback([&] { ++signals; });
  // The whole region in one op, then the last byte alone (bounds are the requested length).
  StatusOr<BatchId> put = initiator->post({*peer, {{OpCode::kPut, src->id, 0, *remote, 0, kBytes}}});
  ASSERT_TRUE(put.ok()) << put.status();
  const bool ended_in_post = initiator->batch_status(*put)->state == BatchState::kDone;
  EXPECT_TRUE(ended_in_post || !direct_copy);  // A direct copy is done when post() returns.
  ASSERT_TRUE(run(put).ok());
  // post()'s caller finds such a batch done: it wakes nobody. One that ends later signals once.
  EXPECT_EQ(signals.load(), ended_in_post ? 0 : 1);
  initiator->set_activity_callback(nullptr);
  ASSERT_TRUE(run(initiator->flush(*peer)).ok());
  EXPECT_EQ(std::memcmp(dst->addr, src->addr, kBytes), 0);
  EXPECT_FALSE(initiator->post({*peer, {{OpCode::kPut, src->id, 0, *remote, 1, kBytes}}}).ok());

  std::memset(src->addr, 0, kBytes);
  ASSERT_TRUE(run(initiator->post({*peer, {{OpCode::kGet, src->id, 4096, *remote, 4096, 65536}}})).ok());
  auto* d = static_cast<uint8_t*>(dst->addr);
  EXPECT_EQ(std::memcmp(s + 4096, d + 4096, 65536), 0);
  EXPECT_EQ(s[4095], 0);
  EXPECT_EQ(initiator->counters().bytes_got, 65536u);
  // Both ops went one way or the other (UCX_TLS here includes shared memory, "sm").
  EXPECT_EQ(initiator->counters().ops_copied_directly, direct_copy ? 2u : 0u);
  EXPECT_EQ(initiator->counters().ops_completed, 2u);

  EXPECT_EQ(target->allocate_region(0, MemoryKind::kHost).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(target->allocate_region(64, MemoryKind::kCuda).status().code(),
            absl::StatusCode::kUnimplemented);
  EXPECT_TRUE(initiator->deregister_region(src->id).ok());
  EXPECT_TRUE(target->deregister_region(dst->id).ok());
  EXPECT_EQ(target->deregister_region(dst->id).code(), absl::StatusCode::kNotFound);
}

INSTANTIATE_TEST_SUITE_P(UcxTransportTest, AllocatedRegionsTest, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "direct" : "per_op"; });

// stream_copy (direct copies into a peer's mapping) equals memcpy for every length around its
// 16-byte store width and 256-byte threshold, at every destination alignment, and writes
// nothing outside the destination.
TEST(StreamCopyTest, EqualsMemcpyAtEveryLengthAndAlignment) {
  std::vector<uint8_t> src(70000 + 64);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i * 31 + 7);
  std::vector<uint8_t> dst(src.size() + 64);
  for (size_t length : {0, 1, 15, 16, 17, 63, 64, 65, 255, 256, 257, 300, 4095, 4096, 4097, 70000}) {
    for (size_t dst_at = 0; dst_at < 17; ++dst_at) {
      for (size_t src_at : {0, 1, 8}) {
        std::fill(dst.begin(), dst.end(), 0xAA);
        stream_copy(dst.data() + 8 + dst_at, src.data() + src_at, length);
        stream_fence();
        const auto at = dst.begin() + 8 + dst_at;
        ASSERT_TRUE(std::equal(at, at + length, src.begin() + src_at))
            << length << " bytes, dst +" << dst_at << ", src +" << src_at;
        ASSERT_TRUE(std::all_of(dst.begin(), at, [](uint8_t b) { return b == 0xAA; }));
        ASSERT_TRUE(std::all_of(at + length, dst.end(), [](uint8_t b) { return b == 0xAA; }));
      }
    }
  }
}

TEST(UcxTransportTest, RegistrationChecks) {
  auto t = make(false);
  EXPECT_EQ(t->register_region({nullptr, 16}).status().code(),
            absl::StatusCode::kInvalidArgument);
  std::vector<uint8_t> buf(64);
  EXPECT_EQ(t->register_region({buf.data(), 0}).status().code(),
            absl::StatusCode::kInvalidArgument);
  // This UCX build has no GPU support: device memory must be refused, not mis-registered.
  auto device = t->register_region({buf.data(), buf.size(), MemoryKind::kCuda});
  EXPECT_EQ(device.status().code(), absl::StatusCode::kUnimplemented) << device.status();
  EXPECT_EQ(t->deregister_region(12345).code(), absl::StatusCode::kNotFound);
  EXPECT_FALSE(t->local_address().empty());
  EXPECT_NE(t->describe().find("ucx"), std::string::npos);
}

TEST(UcxTransportTest, BadDescriptorsAreRefused) {
  auto a = make(false);
  auto b = make(true);
  auto peer = a->connect(b->local_address());
  ASSERT_TRUE(peer.ok());
  std::vector<uint8_t> buf(64);
  auto region = b->register_region({buf.data(), buf.size()});
  ASSERT_TRUE(region.ok());
  const std::string& good = region->descriptor;
  for (std::string bad : {std::string(), std::string("PDKR"), good.substr(0, good.size() - 1),
                          good + "x", "XXXX" + good.substr(4)}) {
    EXPECT_EQ(a->load_remote_region(*peer, bad).status().code(),
              absl::StatusCode::kInvalidArgument);
  }
  EXPECT_TRUE(a->load_remote_region(*peer, good).ok());
  EXPECT_EQ(a->load_remote_region(777, good).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(a->connect("").status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace pdserve::kvtransfer
