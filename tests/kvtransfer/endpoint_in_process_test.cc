// Two KvRankEndpoints in this process, their arenas allocated by their transports, driven by the
// test thread: over shared memory the consumer maps the producer's arena and copies a pulled
// request inside pull() itself, a batch that ends within its own call and so signals nothing
// (Transport::set_activity_callback). The consumer's next progress() must still step it at
// once rather than wait out its timeout first.
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>

#include <gtest/gtest.h>

#include "kvtransfer/kv_endpoint.h"
#include "tests/kvtransfer/kv_fill.h"

namespace pdserve::kvtransfer {
namespace {

using namespace std::chrono_literals;

engine::KvCacheSpec small_spec() {
  engine::KvCacheSpec spec;
  spec.block_size = 4;
  engine::LayerKvSpec layer;
  layer.num_kv_heads = 2;
  layer.head_dim = 16;
  layer.v_head_dim = 16;
  layer.dtype = engine::DType::kF32;
  layer.layout = engine::KvLayout::kSeparate;
  spec.layers.assign(3, layer);
  return spec;
}

// Sets an environment variable for its lifetime. UCX reads UCX_TLS when a transport is created.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    setenv(name, value, 1);
  }
  ~ScopedEnv() {
    if (old_) {
      setenv(name_, old_->c_str(), 1);
    } else {
      unsetenv(name_);
    }
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

std::unique_ptr<KvRankEndpoint> make(SessionSide side) {
  // Shared memory only, which is what this test is about: with every transport, UCX 1.13's tcp
  // wireup between two workers of one process aborted once under a parallel ctest (an assertion
  // in ucp_request_send_state_ff after "connect() failed: Connection refused").
  const ScopedEnv tls("UCX_TLS", "sm,self");
  KvEndpointOptions o;
  o.spec = small_spec();
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
}

}  // namespace
}  // namespace pdserve::kvtransfer
