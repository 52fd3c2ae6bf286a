// Two KvRankEndpoints in this process, their arenas allocated by their transports, driven by the
// test thread: over shared memory the consumer maps the producer's arena and copies a pulled
// request inside pull() itself, a batch that ends within its own call and so signals nothing
// (Transport::set_activity_callback). The consumer's next progress() must still step it at
// once rather than wait out its timeout first. The leg-completing notifications (WRITE_DONE,
// RELEASE) between them take the control channel's same-host lane.
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>

#include <gtest/gtest.h>

#include "kvtransfer/kv_endpoint.h"
#include "tests/kvtransfer/kv_fill.h"
#include "tests/kvtransfer/kv_sim.h"
#include "tests/model/test_util.h"

namespace pdserve::kvtransfer {
namespace {

using namespace std::chrono_literals;

struct MakeOptions {
  int tp = 1, rank = 0;
  void* host_arena = nullptr;  // Producer: its host-tier arena (host_blocks blocks).
  int host_blocks = 0;
  bool checksums = false;
};

std::unique_ptr<KvRankEndpoint> make(SessionSide side, bool local_lane = true, const MakeOptions& m = {}) {
  // Shared memory only, which is what this test is about: with every transport, UCX 1.13's tcp
  // wireup between two workers of one process aborted once under a parallel ctest (an assertion
  // in ucp_request_send_state_ff after "connect() failed: Connection refused").
  const engine::testing::ScopedEnv tls("UCX_TLS", "sm,self");
  KvEndpointOptions o;
  o.spec = testing::mixed_spec();
  o.local_lane = local_lane;
  o.model_id = "in-process";
  o.side = side;
  o.allocate_arena = true;
  o.num_blocks = 8;
  o.tp = m.tp;
  o.rank = m.rank;
  o.host_arena = m.host_arena;
  o.host_num_blocks = m.host_blocks;
  o.checksums = m.checksums;
  o.name = side == SessionSide::kProducer ? "producer" : "consumer";
  auto endpoint = KvRankEndpoint::create(std::move(o));
  EXPECT_TRUE(endpoint.ok()) << endpoint.status();
  return endpoint.ok() ? std::move(*endpoint) : nullptr;
}

// Steps both sides in turn (short waits) until the consumer reports `id`.
KvTransferEvent pump_until_consumer_reports(KvRankEndpoint& producer, KvRankEndpoint& consumer,
                                            const std::string& id) {
  const auto deadline = std::chrono::steady_clock::now() + 30s;
  while (std::chrono::steady_clock::now() < deadline) {
    (void)producer.progress(1ms);
    for (KvTransferEvent& e : consumer.progress(1ms)) {
      if (e.request_id == id) return e;
    }
  }
  return {id, KvTransferEvent::Kind::kFailed, absl::DeadlineExceededError("no outcome")};
}

TEST(EndpointInProcess, PullCopiedInsideItsCallIsSteppedWithoutWaiting) {
  auto producer = make(SessionSide::kProducer);
  auto consumer = make(SessionSide::kConsumer);
  ASSERT_TRUE(producer && consumer);
  const std::vector<int> blocks{1, 4, 6};
  auto pull = [&](const std::string& id) {
    testing::fill_request(producer->layout(), producer->arena(), blocks, testing::request_salt(id), 1);
    EXPECT_TRUE(producer->hold({id, blocks, /*consumer_tp=*/1, 60s}).ok());
    return consumer->pull({id, 1, {producer->control_endpoint()}, blocks, blocks, 60s});
  };
  // The first pull dials the producer; its gets are posted when the dial ends, inside progress().
  ASSERT_TRUE(pull("first").ok());
  const KvTransferEvent first = pump_until_consumer_reports(*producer, *consumer, "first");
  ASSERT_EQ(first.kind, KvTransferEvent::Kind::kReady) << first.error;

  // The second finds the peer connected: pull() posts, and the copy ends, before it returns.
  ASSERT_TRUE(pull("second").ok());
  const auto start = std::chrono::steady_clock::now();
  const std::vector<KvTransferEvent> events = consumer->progress(20s);
  const auto waited = std::chrono::steady_clock::now() - start;
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].kind, KvTransferEvent::Kind::kReady) << events[0].error;
  EXPECT_LT(waited, 10s) << "progress() waited for a signal the inline copy never sends";
  EXPECT_EQ(testing::count_wrong(consumer->layout(), consumer->arena(), blocks,
                                 testing::request_salt("second"), 1),
            0);
  EXPECT_GT(consumer->transport().counters().ops_copied_directly, 0u);  // Copied, not posted.
  EXPECT_EQ(consumer->counters().notifications_on_lane, 2u) << "each pull's RELEASE";
}

// pull-host: a producer TP2 whose ranks hold a request in their host-tier arenas (other block
// ids, another block count than their KV arenas, whose same ids hold another request's bytes);
// a consumer TP1 reads both ranks' heads from there, verified by the debug checksums and by the
// values themselves. A producer without a host tier refuses such a hold, and a pull from it fails.
TEST(EndpointInProcess, PullHostReadsTheProducersHostTierArena) {
  constexpr int kHostBlocks = 12;
  std::vector<std::vector<uint8_t>> host(2);
  std::vector<std::unique_ptr<KvRankEndpoint>> producers;
  for (int r = 0; r < 2; ++r) {
    auto layout = engine::KvCacheLayout::create(testing::mixed_spec(), r, 2, kHostBlocks);
    ASSERT_TRUE(layout.ok()) << layout.status();
    host[size_t(r)].assign(layout->total_bytes(), 0);
    producers.push_back(make(SessionSide::kProducer, true,
                             {2, r, host[size_t(r)].data(), kHostBlocks, /*checksums=*/true}));
    ASSERT_TRUE(producers.back());
  }
  auto consumer = make(SessionSide::kConsumer, true, {1, 0, nullptr, 0, /*checksums=*/true});
  ASSERT_TRUE(consumer);
  const std::vector<int> slots{9, 3, 11}, device{1, 3, 5}, consumer_blocks{0, 6, 2};
  const std::string id = "via-host";
  for (int r = 0; r < 2; ++r) {
    KvRankEndpoint& p = *producers[size_t(r)];
    auto host_layout = engine::KvCacheLayout::create(testing::mixed_spec(), r, 2, kHostBlocks);
    testing::fill_request(*host_layout, host[size_t(r)].data(), slots, testing::request_salt(id), 1);
    testing::fill_request(p.layout(), p.arena(), device, testing::request_salt("another"), 1);
    HoldRequest hold{id, slots, /*consumer_tp=*/1, 60s};
    hold.region = KvRegion::kHost;
    ASSERT_TRUE(p.hold(hold).ok());
  }
  PullRequest pull{id, 2, {producers[0]->control_endpoint(), producers[1]->control_endpoint()}, slots,
                   consumer_blocks, 60s};
  pull.region = KvRegion::kHost;
  ASSERT_TRUE(consumer->pull(pull).ok());
  std::optional<KvTransferEvent> ready;
  std::vector<int> completed(2, 0);
  for (auto deadline = std::chrono::steady_clock::now() + 30s;
       (!ready || completed[0] + completed[1] < 2) && std::chrono::steady_clock::now() < deadline;) {
    for (int r = 0; r < 2; ++r)
      for (const KvTransferEvent& e : producers[size_t(r)]->progress(1ms))
        if (e.request_id == id) completed[size_t(r)] += e.kind == KvTransferEvent::Kind::kComplete;
    for (KvTransferEvent& e : consumer->progress(1ms))
      if (e.request_id == id) ready = e;
  }
  ASSERT_TRUE(ready);
  ASSERT_EQ(ready->kind, KvTransferEvent::Kind::kReady) << ready->error;
  EXPECT_EQ(completed, (std::vector<int>{1, 1})) << "each producer rank released its host slots";
  EXPECT_EQ(testing::count_wrong(consumer->layout(), consumer->arena(), consumer_blocks, testing::request_salt(id), 1),
            0);

  // No host tier: the hold is refused, and a pull naming the host region fails.
  auto plain = make(SessionSide::kProducer);
  ASSERT_TRUE(plain);
  HoldRequest hold{"no-host", {1}, 1, 60s};
  hold.region = KvRegion::kHost;
  EXPECT_EQ(plain->hold(hold).code(), absl::StatusCode::kFailedPrecondition);
  hold.region = KvRegion::kDevice;
  ASSERT_TRUE(plain->hold(hold).ok());
  PullRequest from_plain{"no-host", 1, {plain->control_endpoint()}, {1}, {3}, 60s};
  from_plain.region = KvRegion::kHost;
  Status pulled = consumer->pull(from_plain);
  std::optional<KvTransferEvent> failed;
  for (auto deadline = std::chrono::steady_clock::now() + 30s;
       pulled.ok() && !failed && std::chrono::steady_clock::now() < deadline;) {
    (void)plain->progress(1ms);
    for (KvTransferEvent& e : consumer->progress(1ms))
      if (e.request_id == "no-host") failed = e;
  }
  if (pulled.ok()) {
    ASSERT_TRUE(failed);
    EXPECT_EQ(failed->kind, KvTransferEvent::Kind::kFailed);
    pulled = failed->error;
  }
  EXPECT_NE(pulled.message().find("host-tier"), std::string_view::npos) << pulled;
}

// A push's WRITE_DONE goes on the same-host lane, and the request is ready with the bytes right;
// with the lane off on either side it goes through ZeroMQ, with the same outcome.
TEST(EndpointInProcess, PushWriteDoneTakesTheSameHostLaneUnlessOff) {
  for (const auto& [producer_lane, consumer_lane] : {std::pair{true, true}, {true, false}, {false, true}}) {
    SCOPED_TRACE(::testing::Message() << "producer lane " << producer_lane << ", consumer lane " << consumer_lane);
    auto producer = make(SessionSide::kProducer, producer_lane);
    auto consumer = make(SessionSide::kConsumer, consumer_lane);
    ASSERT_TRUE(producer && consumer);
    const std::vector<int> blocks{2, 5, 7};
    for (const std::string id : {"one", "two"}) {
      testing::fill_request(producer->layout(), producer->arena(), blocks, testing::request_salt(id), 1);
      ASSERT_TRUE(consumer->expect_push({id, 1, blocks, {producer->control_endpoint()}, 60s}).ok());
      ASSERT_TRUE(producer->begin_push({id, 1, {consumer->control_endpoint()}, blocks, blocks, 60s}).ok());
      for (int l = 0; l < producer->layout().num_layers(); ++l) ASSERT_TRUE(producer->layer_ready(id, l).ok());
      ASSERT_TRUE(producer->seal(id, 7).ok());
      const KvTransferEvent ready = pump_until_consumer_reports(*producer, *consumer, id);
      ASSERT_EQ(ready.kind, KvTransferEvent::Kind::kReady) << ready.error;
      EXPECT_EQ(ready.first_token, 7);
      EXPECT_EQ(testing::count_wrong(consumer->layout(), consumer->arena(), blocks, testing::request_salt(id), 1), 0);
    }
    EXPECT_EQ(producer->counters().notifications_on_lane, producer_lane && consumer_lane ? 2u : 0u);
  }
}

}  // namespace
}  // namespace pdserve::kvtransfer
