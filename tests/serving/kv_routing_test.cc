// KvRouting: the router's view of its workers' prefix caches for placement. Predicted entries
// keep a burst of one prefix on one prefill worker before any KV event (on a FakeClock, so the
// 2 s TTL runs out without sleeping); a worker's real KV events (a publisher on loopback ZeroMQ)
// are followed, and those of another key space rejected.
#include "router/kv_routing.h"

#include <gtest/gtest.h>

#include <thread>

#include "kvevents/kv_event_publisher.h"
#include "kvevents/wire.h"
#include "router/policy.h"

namespace pdserve::router {
namespace {

using namespace std::chrono_literals;

constexpr int kBlockSize = 16;

engine::BlockKey test_root() { return engine::key_root({.kv_spec_fingerprint = 42, .block_size = kBlockSize}); }

worker::WorkerInfo info_of(const std::string& id, const std::string& pub = "", const std::string& replay = "") {
  worker::WorkerInfo info;
  info.set_worker_id(id);
  info.set_block_size(kBlockSize);
  info.set_prefix_caching(true);
  info.set_kv_key_root(kvevents::key_bytes(test_root()));
  info.set_kv_events_endpoint(pub);
  info.set_kv_replay_endpoint(replay);
  return info;
}

std::vector<int> prompt_of(int n, int seed) {
  std::vector<int> p;
  for (int i = 0; i < n; ++i) p.push_back(1 + (i * 7 + seed * 13) % 500);
  return p;
}

WorkerLoad idle(int index) {
  WorkerLoad l;
  l.index = index;
  l.up = true;
  l.num_blocks = l.free_blocks = 100;
  l.block_size = kBlockSize;
  return l;
}

// A burst of `n` requests with `prompt`, placed as the router does before any event or poll:
// each dispatch queues its uncached blocks and (with `predict`) predicts its keys.
std::vector<int> place_burst(KvRouting& kv, const std::vector<int>& prompt, int n, bool predict) {
  const std::vector<std::string> addresses = {"p0:1", "p1:2"};
  std::vector<WorkerLoad> loads = {idle(0), idle(1)};
  const std::vector<WorkerLoad> decode = {idle(5)};
  std::vector<int> chosen;
  for (int i = 0; i < n; ++i) {
    const std::vector<int> cached = kv.cached_blocks(addresses, KvRouting::PromptKeys(prompt, ""));
    for (size_t w = 0; w < loads.size(); ++w) loads[w].cached_blocks = cached[w];
    CacheTerms terms;
    terms.prompt_blocks = int(prompt.size()) / kBlockSize;
    const int p = pick_prefill(loads, {}, decode, 10, {}, -1, &terms);
    chosen.push_back(p);
    loads[size_t(p)].queued_prefill_tokens += dispatched_prefill_tokens(int(prompt.size()), loads[size_t(p)], &terms);
    if (predict) kv.predict(addresses[size_t(p)], KvRouting::PromptKeys(prompt, ""));
  }
  return chosen;
}

TEST(KvRouting, ABurstOfOnePrefixBeforeAnyEventLandsOnOnePrefillWorker) {
  FakeClock clock;
  KvRouting kv(clock);
  kv.on_worker_info("p0:1", info_of("prefill@p0"));
  kv.on_worker_info("p1:2", info_of("prefill@p1"));
  const std::vector<int> prompt = prompt_of(200, 1);
  const std::vector<int> burst = place_burst(kv, prompt, 4, /*predict=*/true);
  EXPECT_EQ(burst, std::vector<int>(4, burst[0]));
  // Without predicted entries the same burst spreads over both workers, by load.
  FakeClock other_clock;
  KvRouting blind(other_clock);
  blind.on_worker_info("p0:1", info_of("prefill@p0"));
  blind.on_worker_info("p1:2", info_of("prefill@p1"));
  const std::vector<int> spread = place_burst(blind, prompt, 4, /*predict=*/false);
  EXPECT_NE(spread, std::vector<int>(4, spread[0]));

  // The prediction covers the prompt's full blocks, in its namespace only, for 2 s.
  const int p = burst[0];
  const std::string address = p == 0 ? "p0:1" : "p1:2";
  EXPECT_EQ(kv.cached_blocks({address}, KvRouting::PromptKeys(prompt, ""))[0], 200 / kBlockSize);
  std::vector<int> longer = prompt;
  longer.insert(longer.end(), {9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9});
  EXPECT_EQ(kv.cached_blocks({address}, KvRouting::PromptKeys(longer, ""))[0], 200 / kBlockSize)
      << "a longer prompt shares the prefix";
  EXPECT_EQ(kv.cached_blocks({address}, KvRouting::PromptKeys(prompt, "tenant-b"))[0], 0) << "another cache salt";
  EXPECT_EQ(kv.cached_blocks({address}, KvRouting::PromptKeys(prompt_of(200, 2), ""))[0], 0);
  clock.advance(1900ms);
  EXPECT_EQ(kv.cached_blocks({address}, KvRouting::PromptKeys(prompt, ""))[0], 200 / kBlockSize);
  clock.advance(200ms);
  EXPECT_EQ(kv.cached_blocks({address}, KvRouting::PromptKeys(prompt, ""))[0], 0) << "expired";
}

TEST(KvRouting, AWorkerWithoutPrefixCachingGetsNoCredit) {
  FakeClock clock;
  KvRouting kv(clock);
  worker::WorkerInfo off = info_of("prefill@p0");
  off.set_prefix_caching(false);
  kv.on_worker_info("p0:1", off);
  const std::vector<int> prompt = prompt_of(100, 3);
  kv.predict("p0:1", KvRouting::PromptKeys(prompt, ""));
  EXPECT_EQ(kv.cached_blocks({"p0:1", "unknown:9"}, KvRouting::PromptKeys(prompt, "")), std::vector<int>({0, 0}));
}

// Polls `done` for up to 10 s (the subscriber's thread applies events asynchronously).
template <typename F>
bool eventually(F done) {
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while (std::chrono::steady_clock::now() < deadline) {
    if (done()) return true;
    std::this_thread::sleep_for(10ms);
  }
  return done();
}

std::unique_ptr<kvevents::KvEventPublisher> publisher_for(const std::string& id, uint32_t block_size) {
  kvevents::KvEventPublisherOptions o;
  o.pub_endpoint = "tcp://127.0.0.1:0";
  o.replay_endpoint = "tcp://127.0.0.1:0";
  o.heartbeat_interval = 50ms;
  auto p = kvevents::KvEventPublisher::create(o);
  EXPECT_TRUE(p.ok()) << p.status();
  EXPECT_TRUE((*p)->start({.worker_id = id, .block_size = block_size, .key_root = test_root()}).ok());
  return std::move(*p);
}

TEST(KvRouting, FollowsAWorkersEventsAndRejectsAnotherKeySpace) {
  FakeClock clock;
  KvRouting kv(clock);
  const std::vector<int> prompt = prompt_of(160, 4);
  const std::vector<engine::BlockKey> keys =
      engine::block_keys(engine::namespace_root(test_root(), engine::canonical_namespace("")), prompt, kBlockSize);
  ASSERT_EQ(keys.size(), 10u);

  auto good = publisher_for("prefill@p0", kBlockSize);
  kv.on_worker_info("p0:1", info_of("prefill@p0", good->pub_endpoint(), good->replay_endpoint()));
  // Its Info says 16-token blocks, its events say 32: never applied.
  auto bad = publisher_for("prefill@p1", 2 * kBlockSize);
  kv.on_worker_info("p1:2", info_of("prefill@p1", bad->pub_endpoint(), bad->replay_endpoint()));
  ASSERT_TRUE(eventually([&] { return kv.view("p0:1")->state == WorkerKvState::kExact; }));
  for (auto* p : {good.get(), bad.get()}) {
    p->stored(engine::KvTier::kDevice, std::nullopt, std::span(keys).first(6), 0, {});
    p->step_end();
  }
  ASSERT_TRUE(eventually([&] { return kv.cached_blocks({"p0:1"}, KvRouting::PromptKeys(prompt, ""))[0] == 6; }));
  EXPECT_EQ(kv.view("p0:1")->keys.size(), 6u);
  ASSERT_TRUE(eventually([&] { return kv.stats().rejected > 0; }));
  EXPECT_EQ(kv.cached_blocks({"p1:2"}, KvRouting::PromptKeys(prompt, ""))[0], 0);
  EXPECT_NE(kv.view("p1:2")->state, WorkerKvState::kExact);
  EXPECT_TRUE(kv.view("p1:2")->keys.empty());

  // A restart elsewhere (new endpoints in its Info) replaces the subscription.
  auto restarted = publisher_for("prefill@p0", kBlockSize);
  kv.on_worker_info("p0:1", info_of("prefill@p0", restarted->pub_endpoint(), restarted->replay_endpoint()));
  ASSERT_TRUE(eventually([&] { return kv.view("p0:1")->state == WorkerKvState::kExact; }));
  EXPECT_EQ(kv.cached_blocks({"p0:1"}, KvRouting::PromptKeys(prompt, ""))[0], 0) << "the new process's cache is empty";
  kv.on_worker_removed("p0:1");
  EXPECT_FALSE(kv.view("p0:1").has_value());
}

TEST(ApproximateBlocks, RecordsWhatWasSentUpToTheWorkersCapacityLeastRecentFirstOut) {
  ApproximateBlocks a;
  const auto chain = [](int n, int seed) {
    return engine::block_keys(engine::namespace_root(test_root(), engine::canonical_namespace("")),
                              prompt_of(n * kBlockSize, seed), kBlockSize);
  };
  const auto x = chain(4, 1), y = chain(4, 2), z = chain(3, 3);
  a.insert("w", x, 10);
  a.insert("w", y, 10);
  EXPECT_EQ(a.match("w", x), 4u);
  EXPECT_EQ(a.match("w", y), 4u);
  EXPECT_EQ(a.match("v", x), 0u) << "another worker";
  a.insert("w", x, 10);  // x is the most recent again.
  a.insert("w", z, 10);  // 11 keys: y's least recent block goes — its tail, not its head.
  EXPECT_EQ(a.size("w"), 10u);
  EXPECT_EQ(a.match("w", y), 3u);
  EXPECT_EQ(a.match("w", x), 4u);
  EXPECT_EQ(a.match("w", z), 3u);
  a.insert("w", x, 0);  // Unknown capacity: nothing recorded, nothing dropped.
  EXPECT_EQ(a.size("w"), 10u);
  a.remove("w");
  EXPECT_EQ(a.match("w", x), 0u);
}

// A worker whose KV events are lost (its publisher gone: the index never becomes EXACT) keeps
// its conversations by the overlay of what was sent there, after the 2 s predictions expired;
// an EXACT worker is credited only by its events and predictions.
TEST(KvRouting, ANonExactWorkerIsCreditedByTheOverlayOfWhatWasSentThere) {
  FakeClock clock;
  KvRouting kv(clock);
  worker::WorkerInfo lost = info_of("prefill@p0", "tcp://127.0.0.1:1", "tcp://127.0.0.1:1");
  lost.set_num_blocks(1000);
  kv.on_worker_info("p0:1", lost);
  auto live = publisher_for("prefill@p1", kBlockSize);
  worker::WorkerInfo exact = info_of("prefill@p1", live->pub_endpoint(), live->replay_endpoint());
  exact.set_num_blocks(1000);
  kv.on_worker_info("p1:2", exact);
  ASSERT_TRUE(eventually([&] { return kv.view("p1:2")->state == WorkerKvState::kExact; }));
  EXPECT_NE(kv.view("p0:1")->state, WorkerKvState::kExact);
  const std::vector<int> prompt = prompt_of(160, 5);
  kv.predict("p0:1", KvRouting::PromptKeys(prompt, ""));
  kv.predict("p1:2", KvRouting::PromptKeys(prompt, ""));
  clock.advance(10s);  // The predictions expired.
  EXPECT_EQ(kv.cached_blocks({"p0:1", "p1:2"}, KvRouting::PromptKeys(prompt, "")), std::vector<int>({10, 0}));
  // A restart (new Info) forgets the overlay with the cache it described.
  lost.set_kv_events_endpoint("tcp://127.0.0.1:2");
  kv.on_worker_info("p0:1", lost);
  EXPECT_EQ(kv.cached_blocks({"p0:1"}, KvRouting::PromptKeys(prompt, ""))[0], 0);
}

// The peer tier's source: the peer-tier worker whose host tier (TIER_HOST events) holds the
// most of the prompt; device blocks, predictions and workers without a peer tier do not count.
TEST(KvRouting, TheHostHolderIsThePeerTierWorkerWhoseHostTierHoldsTheMost) {
  FakeClock clock;
  KvRouting kv(clock);
  const std::vector<int> prompt = prompt_of(160, 6);
  const std::vector<engine::BlockKey> keys =
      engine::block_keys(engine::namespace_root(test_root(), engine::canonical_namespace("")), prompt, kBlockSize);
  auto peer = [](worker::WorkerInfo info) {
    info.mutable_peer_tier();
    return info;
  };
  auto d0 = publisher_for("decode@d0", kBlockSize), d1 = publisher_for("decode@d1", kBlockSize),
       d2 = publisher_for("decode@d2", kBlockSize);
  kv.on_worker_info("d0:1", peer(info_of("decode@d0", d0->pub_endpoint(), d0->replay_endpoint())));
  kv.on_worker_info("d1:2", peer(info_of("decode@d1", d1->pub_endpoint(), d1->replay_endpoint())));
  kv.on_worker_info("d2:3", info_of("decode@d2", d2->pub_endpoint(), d2->replay_endpoint()));  // No peer tier.
  for (const char* a : {"d0:1", "d1:2", "d2:3"})
    ASSERT_TRUE(eventually([&] { return kv.view(a)->state == WorkerKvState::kExact; }));
  const KvRouting::PromptKeys pk(prompt, "");
  EXPECT_FALSE(kv.host_holder({"d0:1", "d1:2", "d2:3"}, pk).has_value());
  d0->stored(engine::KvTier::kHost, std::nullopt, std::span(keys).first(4), 0, {});
  d0->step_end();
  d1->stored(engine::KvTier::kHost, std::nullopt, std::span(keys).first(7), 0, {});
  d1->stored(engine::KvTier::kDevice, std::nullopt, std::span(keys).first(9), 0, {});
  d1->step_end();
  d2->stored(engine::KvTier::kHost, std::nullopt, std::span(keys).first(10), 0, {});
  d2->step_end();
  // Every worker's events in (each arrives on its own subscription, in any order).
  ASSERT_TRUE(eventually([&] {
    const auto h = kv.host_holder({"d0:1", "d1:2", "d2:3"}, pk);
    const auto h0 = kv.host_holder({"d0:1"}, pk);
    return h && h->blocks == 7 && h0 && h0->blocks == 4 && kv.held_blocks("d2:3", pk) == 10;
  }));
  EXPECT_EQ(kv.host_holder({"d0:1", "d1:2", "d2:3"}, pk)->address, "d1:2");
  EXPECT_EQ(kv.host_holder({"d0:1", "d2:3"}, pk)->blocks, 4);
  EXPECT_FALSE(kv.host_holder({"d1:2"}, KvRouting::PromptKeys(prompt, "tenant-b")).has_value());
  EXPECT_EQ(kv.held_blocks("d1:2", pk), 9) << "device and host tiers";
  EXPECT_EQ(kv.held_blocks("d2:3", pk), 10);
  kv.predict("d0:1", pk);  // A prediction is a guess, not a holding.
  EXPECT_EQ(kv.host_holder({"d0:1"}, pk)->blocks, 4);
}

}  // namespace
}  // namespace pdserve::router
