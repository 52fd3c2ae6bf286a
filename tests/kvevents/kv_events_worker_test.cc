// A worker process started with --kv-events-endpoint advertises its KV-event endpoints in
// Worker.Info, and a router-side subscriber reaches EXACT on them from the worker's snapshot.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "proto/worker.grpc.pb.h"
#include "router/kv_event_subscriber.h"
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

  router::KvIndex index;
  router::KvEventSubscriber subscriber(index);
  ASSERT_TRUE(subscriber.add_worker(info.worker_id(), info.kv_events_endpoint(), info.kv_replay_endpoint()).ok());
  const auto deadline = std::chrono::steady_clock::now() + 5s;
  while (index.state(info.worker_id()) != router::WorkerKvState::kExact && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(1ms);  // Polling interval.
  EXPECT_EQ(index.state(info.worker_id()), router::WorkerKvState::kExact);
  EXPECT_NE(index.epoch(info.worker_id()), 0u);
  EXPECT_EQ(index.stats().snapshots, 1u);
  // Its heartbeats arrive (on the worker's topic): the subscriber counts live messages.
  while (subscriber.stats().live_messages == 0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(1ms);
  EXPECT_GT(subscriber.stats().live_messages, 0u);
}

}  // namespace
}  // namespace pdserve
