// KV events end to end over real ZeroMQ on loopback: a randomized cache workload drives a
// KvEventPublisher through the engine::KvEventSink interface while a model keeps the key set
// (set semantics); a KvEventSubscriber feeds a KvIndex. With 1 % of live messages dropped, a
// publisher restart (new epoch, same or new port) and a router restart, the index must equal
// the model exactly within 1 s of quiescence.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <random>
#include <set>
#include <thread>

#include "absl/container/flat_hash_set.h"
#include "kvevents/kv_event_publisher.h"
#include "router/kv_event_subscriber.h"
#include "router/kv_index.h"

namespace pdserve {
namespace {

using engine::BlockKey;
using engine::KvTier;
using kvevents::KvEventPublisher;
using kvevents::KvEventPublisherOptions;
using router::KvEventSubscriber;
using router::KvEventSubscriberOptions;
using router::KvIndex;
using router::WorkerKvState;
using Ms = std::chrono::milliseconds;

constexpr auto kConvergence = std::chrono::seconds(1);

// Drops each live batch with probability p, and the next `n` batches when told (tail loss).
class TestDrops final : public kvevents::PubDropPolicy {
 public:
  TestDrops(double p, uint32_t seed) : p_(p), rng_(seed) {}
  bool drop(uint64_t, bool heartbeat) override {
    if (heartbeat) return false;
    if (next_ > 0) {
      --next_;
      return true;
    }
    return std::uniform_real_distribution<double>(0, 1)(rng_) < p_;
  }
  void drop_next(int n) { next_ = n; }
  void set_probability(double p) { p_ = p; }

 private:
  std::atomic<double> p_;
  std::mt19937 rng_;
  std::atomic<int> next_{0};
};

// The engine cache's key set as the workload changes it, and the sink calls each change makes.
class ModelCache {
 public:
  explicit ModelCache(uint32_t seed) : rng_(seed) {}

  // One engine step of random set transitions, reported to `sink`.
  void step(engine::KvEventSink& sink) {
    const int ops = std::uniform_int_distribution<int>(0, 6)(rng_);
    for (int i = 0; i < ops; ++i) {
      const int r = std::uniform_int_distribution<int>(0, 999)(rng_);
      const KvTier tier = r % 5 == 0 ? KvTier::kHost : KvTier::kDevice;
      auto& set = sets_[tier == KvTier::kDevice ? 0 : 1];
      if (r < 2) {
        set.clear();
        sink.cleared(tier);
      } else if (r < 600 || set.size() < 50) {
        // A chain of new blocks, some continuing a present one.
        const int n = std::uniform_int_distribution<int>(1, 40)(rng_);
        std::vector<BlockKey> keys;
        for (int j = 0; j < n; ++j) keys.push_back(fresh_key());
        std::optional<BlockKey> parent;
        if (!set.empty() && r % 2 == 0) parent = *set.begin();
        set.insert(keys.begin(), keys.end());
        sink.stored(tier, parent, keys, parent ? 3 : 0, {});
      } else {
        std::vector<BlockKey> victims;
        const size_t n = std::uniform_int_distribution<size_t>(1, std::min<size_t>(30, set.size()))(rng_);
        for (auto it = set.begin(); victims.size() < n; ++it) victims.push_back(*it);
        for (const auto& k : victims) set.erase(k);
        sink.removed(tier, victims);
      }
    }
    sink.step_end();
  }
  std::vector<BlockKey> keys(KvTier tier) const {
    const auto& s = sets_[tier == KvTier::kDevice ? 0 : 1];
    std::vector<BlockKey> out(s.begin(), s.end());
    std::sort(out.begin(), out.end());
    return out;
  }
  // A new engine: its cache starts empty.
  void reset() { sets_ = {}; }

 private:
  BlockKey fresh_key() {
    BlockKey k;
    const uint64_t n = ++counter_;
    for (int i = 0; i < 8; ++i) k.bytes[size_t(i)] = uint8_t(n >> (8 * i));
    for (size_t i = 8; i < 16; ++i) k.bytes[i] = uint8_t(rng_());
    return k;
  }
  std::mt19937 rng_;
  uint64_t counter_ = 0;
  std::array<absl::flat_hash_set<BlockKey>, 2> sets_;
};

template <typename Pred>
bool eventually(Pred pred, Duration within) {
  const auto deadline = std::chrono::steady_clock::now() + within;
  while (std::chrono::steady_clock::now() < deadline) {
    if (pred()) return true;
    std::this_thread::sleep_for(Ms(1));  // Polling interval, not a wait for something to happen.
  }
  return pred();
}

bool index_equals_model(const KvIndex& index, const ModelCache& model) {
  return index.state("w") == WorkerKvState::kExact && index.keys("w", KvTier::kDevice) == model.keys(KvTier::kDevice) &&
         index.keys("w", KvTier::kHost) == model.keys(KvTier::kHost);
}

KvEventPublisherOptions publisher_options(std::shared_ptr<kvevents::PubDropPolicy> drops,
                                          std::string pub = "tcp://127.0.0.1:0",
                                          std::string replay = "tcp://127.0.0.1:0") {
  KvEventPublisherOptions o;
  o.pub_endpoint = std::move(pub);
  o.replay_endpoint = std::move(replay);
  o.max_batch_events = 64;  // Small, so that steps split into several batches.
  o.heartbeat_interval = Ms(50);
  o.drop_policy = std::move(drops);
  return o;
}

std::unique_ptr<KvEventPublisher> start_publisher(KvEventPublisherOptions options) {
  auto created = KvEventPublisher::create(std::move(options));
  EXPECT_TRUE(created.ok()) << created.status();
  if (!created.ok()) return nullptr;
  EXPECT_TRUE((*created)->start({.worker_id = "w", .block_size = 16}).ok());
  return std::move(*created);
}

KvEventSubscriberOptions subscriber_options() {
  KvEventSubscriberOptions o;
  o.replay_timeout = Ms(300);
  o.retry_backoff = Ms(50);
  o.degraded_retry = Ms(100);
  return o;
}

// Runs `steps` random steps, waits for the publisher to send them and expects the index to
// match the model within kConvergence; returns how long that took. The workload starts once the
// index is EXACT, so that its batches travel the live path.
Duration run_and_converge(ModelCache& model, KvEventPublisher& publisher, const KvIndex& index, int steps) {
  EXPECT_TRUE(eventually([&] { return index.state("w") == WorkerKvState::kExact; }, kConvergence));
  for (int i = 0; i < steps; ++i) model.step(publisher);
  publisher.flush();
  const auto start = std::chrono::steady_clock::now();
  EXPECT_TRUE(eventually([&] { return index_equals_model(index, model); }, kConvergence))
      << "state " << router::to_string(index.state("w").value_or(WorkerKvState::kDegraded)) << ", index "
      << index.keys("w", KvTier::kDevice).size() << " device keys, model " << model.keys(KvTier::kDevice).size();
  return std::chrono::steady_clock::now() - start;
}

void print_stats(const char* phase, const KvIndex& index, const KvEventPublisher& p, Duration converged) {
  const auto s = index.stats();
  const auto ps = p.stats();
  std::printf(
      "[%s] converged in %.1f ms; publisher: seq %lu, batches %lu, dropped %lu, replays %lu, snapshots %lu; "
      "index: gaps %lu, epochs %lu, replays requested %lu ok %lu failed %lu, snapshots %lu, max lag %.2f ms\n",
      phase, std::chrono::duration<double, std::milli>(converged).count(), ps.last_seq, ps.batches, ps.dropped,
      ps.replays, ps.snapshots, s.gaps, s.epochs, s.replays_requested, s.replays_succeeded, s.replays_failed,
      s.snapshots, s.max_lag_seconds * 1e3);
}

TEST(KvEvents, RandomWorkloadWithDropsAndRestartsConvergesExactly) {
  auto drops = std::make_shared<TestDrops>(0.01, 1);
  ModelCache model(42);
  auto publisher = start_publisher(publisher_options(drops));
  const std::string pub = publisher->pub_endpoint(), replay = publisher->replay_endpoint();
  auto index = std::make_unique<KvIndex>();
  auto subscriber = std::make_unique<KvEventSubscriber>(*index, subscriber_options());
  ASSERT_TRUE(subscriber->add_worker("w", pub, replay).ok());

  print_stats("drops", *index, *publisher, run_and_converge(model, *publisher, *index, 3000));
  EXPECT_GT(publisher->stats().dropped, 0u);
  EXPECT_GT(index->stats().gaps, 0u);

  // Publisher restart on the same ports: a new engine (empty cache) and a new epoch.
  const uint64_t old_epoch = publisher->epoch();
  publisher.reset();
  model.reset();
  publisher = start_publisher(publisher_options(drops, pub, replay));
  ASSERT_NE(publisher->epoch(), old_epoch);
  print_stats("publisher restart", *index, *publisher, run_and_converge(model, *publisher, *index, 2000));
  EXPECT_GE(index->stats().epochs, 1u);
  EXPECT_EQ(index->epoch("w"), publisher->epoch());

  // Router restart: a fresh index starts from a snapshot (no cold start).
  subscriber.reset();
  index = std::make_unique<KvIndex>();
  subscriber = std::make_unique<KvEventSubscriber>(*index, subscriber_options());
  ASSERT_TRUE(subscriber->add_worker("w", pub, replay).ok());
  print_stats("router restart", *index, *publisher, run_and_converge(model, *publisher, *index, 2000));
  EXPECT_GE(index->stats().snapshots, 1u);

  // Publisher restart elsewhere (new ports), which the registry tells the subscriber.
  publisher.reset();
  model.reset();
  publisher = start_publisher(publisher_options(drops));
  ASSERT_TRUE(subscriber->add_worker("w", publisher->pub_endpoint(), publisher->replay_endpoint()).ok());
  print_stats("new ports", *index, *publisher, run_and_converge(model, *publisher, *index, 2000));
}

TEST(KvEvents, SmallReplayRingFallsBackToSnapshots) {
  auto drops = std::make_shared<TestDrops>(0.05, 2);
  auto options = publisher_options(drops);
  options.buffer_batches = 4;
  ModelCache model(7);
  auto publisher = start_publisher(options);
  KvIndex index;
  KvEventSubscriber subscriber(index, subscriber_options());
  ASSERT_TRUE(subscriber.add_worker("w", publisher->pub_endpoint(), publisher->replay_endpoint()).ok());
  print_stats("small ring", index, *publisher, run_and_converge(model, *publisher, index, 3000));
  EXPECT_GT(publisher->stats().snapshots, 1u);  // Beyond the first (start) one.
}

TEST(KvEvents, HeartbeatDetectsLossOfTheLastBatch) {
  auto drops = std::make_shared<TestDrops>(0, 3);
  ModelCache model(9);
  auto publisher = start_publisher(publisher_options(drops));
  KvIndex index;
  KvEventSubscriber subscriber(index, subscriber_options());
  ASSERT_TRUE(subscriber.add_worker("w", publisher->pub_endpoint(), publisher->replay_endpoint()).ok());
  run_and_converge(model, *publisher, index, 100);
  const uint64_t gaps = index.stats().gaps;
  drops->drop_next(1);
  while (publisher->stats().dropped == 0) model.step(*publisher);  // Until a step had events.
  publisher->flush();
  const auto start = std::chrono::steady_clock::now();
  // Only a heartbeat can reveal it: no batch follows. Two heartbeat intervals plus a replay.
  EXPECT_TRUE(eventually([&] { return index_equals_model(index, model); }, Ms(2 * 50 + 200)));
  std::printf("[tail loss] recovered in %.1f ms\n",
              std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
  EXPECT_EQ(index.stats().gaps, gaps + 1);
}

TEST(KvEvents, WithoutReplayEndpointTheWorkerIsDegradedNeverExact) {
  auto drops = std::make_shared<TestDrops>(0, 4);
  auto options = publisher_options(drops);
  options.replay_endpoint = "";
  ModelCache model(11);
  auto publisher = start_publisher(options);
  KvIndex index;
  auto sub_options = subscriber_options();
  sub_options.retry_backoff = Ms(10);
  KvEventSubscriber subscriber(index, sub_options);
  ASSERT_TRUE(subscriber.add_worker("w", publisher->pub_endpoint(), "").ok());
  for (int i = 0; i < 100; ++i) model.step(*publisher);
  publisher->flush();
  EXPECT_TRUE(eventually([&] { return index.state("w") == WorkerKvState::kDegraded; }, kConvergence));
  EXPECT_TRUE(index.keys("w", KvTier::kDevice).empty());  // Never claims a partial state.
}

TEST(KvEvents, ThroughputAndLag) {
  auto drops = std::make_shared<TestDrops>(0, 5);
  auto options = publisher_options(drops);
  options.max_batch_events = 4096;
  options.heartbeat_interval = Ms(1000);
  ModelCache model(13);
  auto publisher = start_publisher(options);
  KvIndex index;
  KvEventSubscriber subscriber(index, subscriber_options());
  ASSERT_TRUE(subscriber.add_worker("w", publisher->pub_endpoint(), publisher->replay_endpoint()).ok());
  ASSERT_TRUE(eventually([&] { return index.state("w") == WorkerKvState::kExact; }, kConvergence));
  const auto start = std::chrono::steady_clock::now();
  constexpr int kSteps = 20000;
  for (int i = 0; i < kSteps; ++i) model.step(*publisher);
  publisher->flush();
  const uint64_t events = publisher->stats().events;
  ASSERT_TRUE(eventually([&] { return index_equals_model(index, model); }, std::chrono::seconds(5)));
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf(
      "[throughput] %lu block events in %d steps applied in %.3f s: %.0f events/s; max lag %.2f ms, "
      "gaps %lu\n",
      events, kSteps, seconds, double(events) / seconds, index.stats().max_lag_seconds * 1e3, index.stats().gaps);
}

}  // namespace
}  // namespace pdserve
