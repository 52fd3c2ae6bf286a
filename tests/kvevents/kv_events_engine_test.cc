// KV events from the real engine: its prefix cache reports every set transition to a
// KvEventPublisher (1 % of live messages dropped), and a router KvIndex fed over ZeroMQ must
// hold exactly the engine's cached keys once the engine is quiet — under a cache small enough
// that multi-turn conversations keep evicting, so removals and descendant invalidations flow;
// the host tier's keys and the filesystem tier's (files written, evicted over a small cap) too.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <thread>

#include "engine/engine.h"
#include "kvevents/kv_event_publisher.h"
#include "router/kv_event_subscriber.h"
#include "router/kv_index.h"
#include "tests/engine/temp_files.h"
#include "tests/engine/test_model.h"

namespace pdserve {
namespace {

using engine::KvTier;

class OnePercent final : public kvevents::PubDropPolicy {
 public:
  bool drop(uint64_t, bool heartbeat) override { return !heartbeat && rng_() % 100 == 0; }

 private:
  std::mt19937 rng_{5};
};

TEST(KvEventsFromTheEngine, TheIndexEqualsTheEnginesCachedKeys) {
  kvevents::KvEventPublisherOptions po;
  po.pub_endpoint = po.replay_endpoint = "tcp://127.0.0.1:0";
  po.heartbeat_interval = std::chrono::milliseconds(50);
  po.drop_policy = std::make_shared<OnePercent>();
  auto publisher = kvevents::KvEventPublisher::create(std::move(po));
  ASSERT_TRUE(publisher.ok()) << publisher.status();
  auto model = engine::load_model({pdserve::testing::stories_bin()});
  ASSERT_TRUE(model.ok());
  engine::EngineOptions eo;
  eo.kv_cache_bytes = 48 * 16 * 1280;  // 48 blocks: conversations evict each other.
  eo.host_kv_bytes = 96 * 16 * 1280;   // And from the host tier too, which reports as TIER_HOST.
  // And the filesystem tier's files (two blocks each, ~20 of them at most), as TIER_DISK.
  eo.kv_offload_dir = testing::fresh_dir("kv-events-disk");
  eo.kv_offload_chunk_blocks = 2;
  eo.kv_offload_dir_bytes = 20 * (2 * 20480 + 2 * 4096);
  eo.prefix_cache.event_sink = publisher->get();
  auto eng = engine::Engine::create(std::move(*model), eo);
  ASSERT_TRUE(eng.ok()) << eng.status();
  ASSERT_TRUE((*publisher)->start({.worker_id = "w", .block_size = 16, .key_root = (*eng)->kv_key_root()}).ok());
  router::KvIndex index;
  router::KvEventSubscriber subscriber(index, {});
  ASSERT_TRUE(subscriber.add_worker("w", (*publisher)->pub_endpoint(), (*publisher)->replay_endpoint()).ok());

  std::mt19937 rng(3);
  std::vector<std::vector<int>> convs(6);
  for (auto& c : convs) c = {1};
  for (int turn = 0; turn < 6; ++turn) {
    for (size_t i = 0; i < convs.size(); ++i) {
      for (int k = int(5 + rng() % 30); k > 0; --k) convs[i].push_back(int(3 + rng() % 500));
      if (convs[i].size() > 400) convs[i].resize(1);
      engine::SamplingParams p;
      p.max_tokens = 20;
      p.ignore_eos = true;
      ASSERT_TRUE((*eng)
                      ->add_request({std::to_string(i), convs[i], p},
                                    [&, i](const engine::TokenEvent& ev) {
                                      if (ev.token >= 0) convs[i].push_back(ev.token);
                                    })
                      .ok());
    }
    ASSERT_TRUE((*eng)->run_until_idle().ok());
  }
  (*eng)->flush_disk_writes();  // The files' events are sent by the time it returns.
  (*publisher)->flush();
  std::vector<engine::BlockKey> want = (*eng)->cached_keys(), want_host = (*eng)->cached_keys(KvTier::kHost);
  std::sort(want.begin(), want.end());
  std::sort(want_host.begin(), want_host.end());
  ASSERT_FALSE(want.empty());
  ASSERT_FALSE(want_host.empty());
  std::vector<engine::BlockKey> want_disk = (*eng)->cached_keys(KvTier::kDisk);
  std::sort(want_disk.begin(), want_disk.end());
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (std::chrono::steady_clock::now() < deadline &&
         !(index.state("w") == router::WorkerKvState::kExact && index.keys("w", KvTier::kDevice) == want &&
           index.keys("w", KvTier::kHost) == want_host && index.keys("w", KvTier::kDisk) == want_disk))
    std::this_thread::sleep_for(std::chrono::milliseconds(1));  // Polling, not waiting for time.
  EXPECT_EQ(index.keys("w", KvTier::kDevice), want);
  EXPECT_EQ(index.keys("w", KvTier::kHost), want_host);
  EXPECT_FALSE(want_disk.empty());
  EXPECT_EQ(index.keys("w", KvTier::kDisk), want_disk);
  EXPECT_GT((*eng)->stats().disk_evicted_files, 0u);
  EXPECT_GT((*eng)->stats().host_hit_tokens, 0u);
  EXPECT_GT((*publisher)->stats().dropped, 0u);
  EXPECT_GT((*eng)->stats().prefix_hit_tokens, 0u);
}

}  // namespace
}  // namespace pdserve
