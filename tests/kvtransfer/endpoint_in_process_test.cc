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

std::unique_ptr<KvRankEndpoint> make(SessionSide side, bool local_lane = true) {
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
