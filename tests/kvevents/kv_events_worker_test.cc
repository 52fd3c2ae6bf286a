// A worker process started with --kv-events-endpoint advertises its KV-event endpoints in
// Worker.Info, and a router-side subscriber reaches EXACT on them from the worker's snapshot.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "proto/worker.grpc.pb.h"
#include "router/kv_event_subscriber.h"
#include "kvevents/wire.h"
#include "router/kv_index.h"
#include "tests/engine/test_model.h"
#include "tests/serving/cluster_process.h"

namespace pdserve {
namespace {

using namespace std::chrono_literals;
using worker::InfoRequest;
using worker::Worker;
using worker::WorkerInfo;

TEST(KvEventsWorker, AdvertisesItsEndpointsAndServesASnapshot) {
  testing::Process worker({std::string(PDSERVE_BINARY_DIR) + "/prefill_worker/pdserve-prefill", "--role", "prefill",
                           "--model", testing::stories_bin(), "--port", "0", "--kv-events-endpoint",
                           "tcp://127.0.0.1:0", "--kv-replay-endpoint", "tcp://127.0.0.1:0", "--kv-events-heartbeat-ms",
                           "50"});
  ASSERT_TRUE(worker.wait_ready(60s)) << worker.log();
  auto stub = Worker::NewStub(grpc::CreateChannel(worker.grpc(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  InfoRequest request;
  WorkerInfo info;
  ASSERT_TRUE(stub->Info(&ctx, request, &info).ok());
  ASSERT_TRUE(info.kv_events_endpoint().starts_with("tcp://127.0.0.1:")) << info.kv_events_endpoint();
  ASSERT_TRUE(info.kv_replay_endpoint().starts_with("tcp://127.0.0.1:")) << info.kv_replay_endpoint();

  // Its key space, as its events carry it: the router adds the worker with it, so a batch of
  // another key space would be rejected (and the worker would never become EXACT).
  ASSERT_EQ(info.kv_key_root().size(), 16u);
  EXPECT_TRUE(info.prefix_caching());
  const router::KvScheme scheme{std::string(kvevents::kKeySchemeV1) + info.kv_key_root(), uint32_t(info.block_size()),
                                info.compat_hash()};
  router::KvIndex index;
  router::KvEventSubscriber subscriber(index);
  ASSERT_TRUE(
      subscriber.add_worker(info.worker_id(), info.kv_events_endpoint(), info.kv_replay_endpoint(), scheme).ok());
  const auto deadline = std::chrono::steady_clock::now() + 5s;
  while (index.state(info.worker_id()) != router::WorkerKvState::kExact && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(1ms);  // Polling interval.
  EXPECT_EQ(index.state(info.worker_id()), router::WorkerKvState::kExact);
  EXPECT_NE(index.epoch(info.worker_id()), 0u);
  EXPECT_EQ(index.stats().snapshots, 1u);
  EXPECT_EQ(index.stats().rejected, 0u);
  // Its heartbeats arrive (on the worker's topic): the subscriber counts live messages.
  while (subscriber.stats().live_messages == 0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(1ms);
  EXPECT_GT(subscriber.stats().live_messages, 0u);
}

}  // namespace
}  // namespace pdserve
