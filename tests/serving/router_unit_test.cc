// Unit tests of the router's pure parts: placement and admission policies, the admission
// queue, Prometheus formatting, the OpenAI request/response mapping, and bench statistics.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fstream>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <cmath>
#include <thread>

#include "common/tcp_state.h"
#include "router/admission_queue.h"
#include "router/api_keys.h"
#include "router/bounded_task_queue.h"
#include "router/kv_index_metrics.h"
#include "router/metrics.h"
#include "router/openai_request.h"
#include "router/openai_response.h"
#include "router/policy.h"
#include "tools/bench_command.h"

namespace pdserve::router {
namespace {

WorkerLoad load(int index, bool up, int free_blocks, int running, int64_t queued = 0, int num_blocks = 100) {
  WorkerLoad l;
  l.index = index;
  l.up = up;
  l.free_blocks = free_blocks;
  l.num_blocks = num_blocks;
  l.running = running;
  l.queued_prefill_tokens = queued;
  return l;
}

WorkerLoad chosen(WorkerLoad l, uint64_t last_chosen) {
  l.last_chosen = last_chosen;
  return l;
}

WorkerLoad paired(WorkerLoad l, uint64_t last_paired) {
  l.last_paired = last_paired;
  return l;
}

TEST(RouterPolicy, PickPrefillTable) {
  struct Case {
    const char* name;
    std::vector<WorkerLoad> workers;
    std::vector<int> exclude;
    int want;
  } cases[] = {
      {"none", {}, {}, -1},
      {"all down", {load(0, false, 0, 0), load(1, false, 0, 0)}, {}, -1},
      {"fewest queued tokens", {load(0, true, 0, 0, 500), load(1, true, 0, 5, 100), load(2, true, 0, 0, 300)}, {}, 1},
      {"tie: fewest running", {load(0, true, 0, 3, 100), load(1, true, 0, 1, 100)}, {}, 1},
      {"tie: lowest index", {load(3, true, 0, 1, 100), load(1, true, 0, 1, 100)}, {}, 1},
      {"tie: least recently chosen", {chosen(load(0, true, 0, 1, 100), 7), chosen(load(1, true, 0, 1, 100), 3)}, {}, 1},
      {"never chosen before chosen", {chosen(load(0, true, 0, 1, 100), 1), load(1, true, 0, 1, 100)}, {}, 1},
      {"fewer queued beats less recent", {chosen(load(0, true, 0, 1, 50), 9), load(1, true, 0, 1, 100)}, {}, 0},
      {"skips down", {load(0, false, 0, 0, 0), load(1, true, 0, 0, 900)}, {}, 1},
      {"skips excluded", {load(0, true, 0, 0, 0), load(1, true, 0, 0, 900)}, {0}, 1},
      {"only excluded", {load(0, true, 0, 0, 0)}, {0}, -1},
  };
  for (const Case& c : cases) EXPECT_EQ(pick_prefill(c.workers, c.exclude), c.want) << c.name;
}

TEST(RouterPolicy, PickDecodeTable) {
  struct Case {
    const char* name;
    std::vector<WorkerLoad> workers;
    int need;
    std::vector<int> exclude;
    int want;
  } cases[] = {
      {"none", {}, 1, {}, -1},
      {"fewest running with room", {load(0, true, 50, 4), load(1, true, 50, 2), load(2, true, 50, 3)}, 10, {}, 1},
      {"tie: least recently chosen", {chosen(load(0, true, 50, 2), 5), chosen(load(1, true, 50, 2), 4)}, 10, {}, 1},
      {"fewer running beats less recent", {chosen(load(0, true, 50, 1), 5), load(1, true, 50, 2)}, 10, {}, 0},
      {"no room, tie: least recently chosen",
       {chosen(load(0, true, 5, 0), 2), chosen(load(1, true, 5, 0), 1)},
       10,
       {},
       1},
      {"tie: least recently paired first",
       {paired(chosen(load(0, true, 50, 2), 1), 8), paired(chosen(load(1, true, 50, 2), 9), 7)},
       10,
       {},
       1},
      {"tie: never paired first", {paired(load(0, true, 50, 2), 3), chosen(load(1, true, 50, 2), 9)}, 10, {}, 1},
      {"room beats fewer running", {load(0, true, 5, 0), load(1, true, 50, 9)}, 10, {}, 1},
      {"no room: most free", {load(0, true, 5, 0), load(1, true, 8, 9)}, 10, {}, 1},
      {"never fits: skipped", {load(0, true, 100, 0, 0, 8), load(1, true, 20, 3)}, 10, {}, 1},
      {"never fits anywhere", {load(0, true, 8, 0, 0, 8)}, 10, {}, -1},
      {"down skipped", {load(0, false, 100, 0), load(1, true, 20, 30)}, 10, {}, 1},
      {"excluded skipped", {load(0, true, 100, 0), load(1, true, 20, 30)}, 10, {0}, 1},
  };
  for (const Case& c : cases) EXPECT_EQ(pick_decode(c.workers, c.need, c.exclude), c.want) << c.name;
}

WorkerLoad labelled(WorkerLoad l, std::string kv_compat, uint64_t compat_hash = 7) {
  l.kv_compat = std::move(kv_compat);
  l.compat_hash = compat_hash;
  return l;
}

// A rolling upgrade: generation "old" and "new" workers side by side pair only within their own
// generation, and a label or geometry no decode worker shares leaves the prefill worker unused.
TEST(RouterPolicy, PairsPrefillAndDecodeOnlyWithinAKvCompatGeneration) {
  const WorkerLoad p_old = labelled(load(0, true, 0, 0, /*queued=*/0), "old");
  const WorkerLoad p_new = labelled(load(1, true, 0, 0, /*queued=*/500), "new");
  const WorkerLoad d_old = labelled(load(5, true, 90, 0), "old");
  const WorkerLoad d_new = labelled(load(6, true, 50, 0), "new");
  EXPECT_TRUE(kv_pairable(p_old, d_old));
  EXPECT_FALSE(kv_pairable(p_old, d_new));
  EXPECT_FALSE(kv_pairable(labelled(p_old, "old", 8), d_old)) << "same label, other KV geometry";
  EXPECT_TRUE(kv_pairable(labelled(p_old, ""), labelled(d_old, ""))) << "unlabelled workers pair";

  // Both generations have a decode worker: the least loaded prefill worker wins, as without labels.
  EXPECT_EQ(pick_prefill({p_old, p_new}, {}, {d_old, d_new}, 10, {}), 0);
  // The old decode worker is gone (excluded, down, or too small): only the new prefill worker can be paired.
  EXPECT_EQ(pick_prefill({p_old, p_new}, {}, {d_old, d_new}, 10, {5}), 1);
  EXPECT_EQ(pick_prefill({p_old, p_new}, {}, {load(5, false, 90, 0), d_new}, 10, {}), 1);
  EXPECT_EQ(pick_prefill({p_old, p_new}, {}, {labelled(load(5, true, 90, 0, 0, /*num_blocks=*/5), "old"), d_new}, 10, {}),
            1);
  // No decode worker shares any prefill worker's label.
  EXPECT_EQ(pick_prefill({p_old}, {}, {d_new}, 10, {}), -1);

  // The decode worker chosen is of the prefill worker's generation even when another has more room.
  EXPECT_EQ(pick_decode({d_old, d_new}, 10, {}, &p_new), 6);
  EXPECT_EQ(pick_decode({d_old, d_new}, 10, {}, &p_old), 5);
  EXPECT_EQ(pick_decode({d_new}, 10, {}, &p_old), -1);
  EXPECT_EQ(pick_decode({d_old, d_new}, 10, {}), 5) << "without a pair, any decode worker";
}

// A sample's preferred workers (where its prompt was just computed) win over less loaded ones
// whenever they could take it, and never when they could not (router/prompt_affinity.h).
TEST(RouterPolicy, PreferredWorkersWinWhenEligible) {
  const std::vector<WorkerLoad> prefill = {load(0, true, 0, 0, /*queued=*/0), load(1, true, 0, 4, /*queued=*/900),
                                           load(2, false, 0, 0)};
  const std::vector<WorkerLoad> decode = {load(5, true, 90, 0), load(6, true, 50, 7), load(7, true, 5, 0)};
  EXPECT_EQ(pick_prefill(prefill, {}, decode, 10, {}), 0) << "no preference: by load";
  EXPECT_EQ(pick_prefill(prefill, {}, decode, 10, {}, 1), 1) << "preferred, though busier";
  EXPECT_EQ(pick_prefill(prefill, {1}, decode, 10, {}, 1), 0) << "preferred but failed for this request";
  EXPECT_EQ(pick_prefill(prefill, {}, decode, 10, {}, 2), 0) << "preferred but down";
  EXPECT_EQ(pick_prefill(prefill, {}, decode, 10, {}, 9), 0) << "preferred but gone from the registry";
  EXPECT_EQ(pick_prefill(prefill, {}, {load(5, true, 90, 0, 0, 5)}, 10, {}, 1), -1) << "preferred but unpairable";

  EXPECT_EQ(pick_decode(decode, 10, {}), 5) << "no preference: by load";
  EXPECT_EQ(pick_decode(decode, 10, {}, nullptr, 6), 6) << "preferred with room, though busier";
  EXPECT_EQ(pick_decode(decode, 10, {}, nullptr, 7), 5) << "preferred without room: another with room";
  EXPECT_EQ(pick_decode({load(5, true, 6, 0), load(7, true, 5, 0)}, 10, {}, nullptr, 7), 7)
      << "none with room: the preferred one queues it";
  EXPECT_EQ(pick_decode(decode, 10, {6}, nullptr, 6), 5) << "preferred but excluded";

  const std::vector<std::string> addresses = {"a:1", "b:2", "c:3", "", "", "d:5", "e:6", "f:7"};
  auto address_of = [&](int i) -> const std::string& { return addresses[size_t(i)]; };
  EXPECT_EQ(index_of(decode, "e:6", address_of), 6);
  EXPECT_EQ(index_of(decode, "a:1", address_of), -1) << "another role's worker";
  EXPECT_EQ(index_of(decode, "", address_of), -1);
}

// Cache placement (docs/router.md, "Placement"): a worker's cached prefix weighs against its load.
WorkerLoad cached(WorkerLoad l, int blocks, int block_size = 16) {
  l.cached_blocks = blocks;
  l.block_size = block_size;
  return l;
}

TEST(RouterPolicy, CachePlacementCosts) {
  CacheTerms t;
  t.prompt_blocks = 20;
  // prefill_cost = max(queued_blocks + n - credit, 0); queued tokens round up to blocks.
  EXPECT_EQ(queued_prefill_blocks(cached(load(0, true, 0, 0, /*queued=*/33), 0)), 3);
  EXPECT_EQ(prefill_cost(cached(load(0, true, 0, 0, 0), 20), 0, t), 0);
  EXPECT_EQ(prefill_cost(cached(load(0, true, 0, 0, 16 * 5), 8), 0, t), 5 + 20 - 8);
  EXPECT_EQ(prefill_cost(cached(load(0, true, 0, 0, 0), 50), 0, t), 0) << "credit is capped to the prompt";
  // The guard: no credit above min_load + 64 AND above 1.5 x min_load.
  EXPECT_EQ(prefill_cost(cached(load(0, true, 0, 0, 16 * 100), 20), 30, t), 100 + 20) << "100 > 94 and > 45";
  EXPECT_EQ(prefill_cost(cached(load(0, true, 0, 0, 16 * 100), 20), 70, t), 100) << "100 > 1.5 x 70 fails: credit";
  EXPECT_EQ(prefill_cost(cached(load(0, true, 0, 0, 16 * 60), 20), 0, t), 60) << "60 <= 0 + 64: credit";
  // decode_cost = used + (blocks_needed - credit) + tau (n - credit).
  t.transfer_weight = 0.5;
  EXPECT_DOUBLE_EQ(decode_cost(cached(load(0, true, 70, 0), 12), 25, 0, t), 30 + 13 + 0.5 * 8);
  EXPECT_DOUBLE_EQ(decode_cost(cached(load(0, true, 100, 0), 0), 25, 0, t), 0 + 25 + 0.5 * 20);
  EXPECT_DOUBLE_EQ(decode_cost(cached(load(0, true, 0, 0, 0, 200), 20), 25, 100, t), 200 + 25 + 0.5 * 20)
      << "guarded: 200 > 164 and > 150";
  // What a dispatch queues until the next poll: the full blocks it must compute.
  EXPECT_EQ(dispatched_prefill_tokens(330, cached(load(0, true, 0, 0), 12), &t), (20 - 12) * 16);
  EXPECT_EQ(dispatched_prefill_tokens(330, cached(load(0, true, 0, 0), 12), nullptr), 330);
}

TEST(RouterPolicy, PickByCacheTable) {
  CacheTerms t;
  t.prompt_blocks = 20;
  const std::vector<WorkerLoad> decode = {load(5, true, 90, 0)};
  struct Row {
    std::vector<WorkerLoad> prefill;
    int want;
    const char* why;
  };
  const std::vector<Row> prefill_rows = {
      {{cached(load(0, true, 0, 0, 0), 0), cached(load(1, true, 0, 0, 0), 20)}, 1, "the cached one, loads equal"},
      {{cached(load(0, true, 0, 0, 0), 0), cached(load(1, true, 0, 0, 16 * 10), 20)}, 1, "10 queued < 20 to compute"},
      {{cached(load(0, true, 0, 0, 0), 0), cached(load(1, true, 0, 0, 16 * 30), 20)}, 0, "30 queued > 20 to compute"},
      {{cached(load(0, true, 0, 0, 16 * 5), 0), cached(load(1, true, 0, 0, 16 * 25), 20)}, 1,
       "costs 25 and 25: the larger credit"},
      {{cached(load(0, true, 0, 0, 0), 5), cached(load(1, true, 0, 0, 0), 5)}, 0, "equal: the lower index"},
      {{cached(load(0, false, 0, 0, 0), 0), cached(load(1, true, 0, 0, 0), 0)}, 1, "down"},
  };
  for (const Row& r : prefill_rows) EXPECT_EQ(pick_prefill(r.prefill, {}, decode, 10, {}, -1, &t), r.want) << r.why;
  // The per-candidate guard, where the credit would decide: n = 100.
  CacheTerms big = t;
  big.prompt_blocks = 100;
  EXPECT_EQ(pick_prefill({cached(load(0, true, 0, 0, 0), 0), cached(load(1, true, 0, 0, 16 * 60), 100)}, {}, decode,
                         10, {}, -1, &big),
            1)
      << "60 <= 0 + 64: credit, cost 60 < 100";
  EXPECT_EQ(pick_prefill({cached(load(0, true, 0, 0, 0), 0), cached(load(1, true, 0, 0, 16 * 65), 100)}, {}, decode,
                         10, {}, -1, &big),
            0)
      << "65 > 0 + 64 and > 0: no credit, cost 165 > 100";
  EXPECT_EQ(pick_prefill({cached(load(0, true, 0, 0, 16 * 200), 0), cached(load(1, true, 0, 0, 16 * 270), 100)}, {},
                         decode, 10, {}, -1, &big),
            1)
      << "270 > 200 + 64 but not > 1.5 x 200: credit, cost 270 < 300";
  // Load alone ignores the cache.
  EXPECT_EQ(pick_prefill(prefill_rows[1].prefill, {}, decode, 10, {}), 0);
  // A preferred eligible worker still wins.
  EXPECT_EQ(pick_prefill(prefill_rows[0].prefill, {}, decode, 10, {}, 0, &t), 0);

  const std::vector<Row> decode_rows = {
      {{cached(load(5, true, 90, 0), 0), cached(load(6, true, 80, 3), 20)}, 6, "cost 10+25+20 vs 20+5+0"},
      {{cached(load(5, true, 90, 0), 0), cached(load(6, true, 30, 0), 20)}, 5, "cost 10+25+20 vs 70+5+0"},
      {{cached(load(5, true, 90, 0), 0), cached(load(6, true, 20, 0), 20)}, 5, "no room on the cached one"},
  };
  for (const Row& r : decode_rows) EXPECT_EQ(pick_decode(r.prefill, 25, {}, nullptr, -1, &t), r.want) << r.why;
  EXPECT_EQ(pick_decode({cached(load(5, true, 200, 0, 0, 200), 0), cached(load(6, true, 140, 0, 0, 200), 100)}, 110,
                        {}, nullptr, -1, &big),
            6)
      << "60 used <= 0 + 64: credit, cost 60+10+0 < 0+110+100";
  EXPECT_EQ(pick_decode({cached(load(5, true, 200, 0, 0, 200), 0), cached(load(6, true, 130, 0, 0, 200), 100)}, 110,
                        {}, nullptr, -1, &big),
            5)
      << "70 used > 64 and > 0: no credit, cost 70+110+100 > 210";
  EXPECT_EQ(pick_decode(decode_rows[0].prefill, 25, {}), 5) << "by load: fewer running";
  EXPECT_EQ(pick_decode(decode_rows[0].prefill, 25, {}, nullptr, 5, &t), 5) << "preferred with room wins";
}

TEST(RouterPolicy, BlocksNeeded) {
  EXPECT_EQ(blocks_needed(10, 6, 512, 16), 1);
  EXPECT_EQ(blocks_needed(10, 7, 512, 16), 2);
  EXPECT_EQ(blocks_needed(500, 100, 512, 16), 32);  // Capped to the context.
  EXPECT_EQ(blocks_needed(1, 1, 512, 0), 0);
}

TEST(RouterPolicy, AdmitTable) {
  struct Case {
    int running, waiting, max_running, max_waiting;
    Admission want;
  } cases[] = {
      {0, 0, 1, 0, Admission::kRun},    {1, 0, 1, 0, Admission::kReject}, {1, 0, 1, 1, Admission::kWait},
      {0, 1, 2, 5, Admission::kWait},   // Someone waits already: no overtaking.
      {2, 5, 2, 5, Admission::kReject}, {3, 0, 4, 0, Admission::kRun},
  };
  for (const Case& c : cases)
    EXPECT_EQ(admit(c.running, c.waiting, c.max_running, c.max_waiting), c.want)
        << c.running << " " << c.waiting << " " << c.max_running << " " << c.max_waiting;
}

TEST(AdmissionQueue, RejectsBeyondTheQueueAndServesWaitersInOrder) {
  AdmissionQueue q(1, 1);
  ASSERT_TRUE(q.acquire(nullptr).ok());
  std::atomic<bool> second_in{false};
  std::thread waiter([&] {
    EXPECT_TRUE(q.acquire(nullptr).ok());
    second_in = true;
  });
  while (q.waiting() != 1) std::this_thread::yield();
  Status third = q.acquire(nullptr);
  EXPECT_TRUE(absl::IsResourceExhausted(third)) << third;
  EXPECT_NE(third.message().find("overloaded"), std::string_view::npos);
  EXPECT_FALSE(second_in);
  q.release();
  waiter.join();
  EXPECT_TRUE(second_in);
  EXPECT_EQ(q.running(), 1);
  q.release();
  EXPECT_EQ(q.running(), 0);
}

TEST(AdmissionQueue, AWaiterStopsWhenItsCheckFails) {
  AdmissionQueue q(1, 4);
  ASSERT_TRUE(q.acquire(nullptr).ok());
  std::atomic<bool> cancel{false};
  Status s;
  std::thread waiter([&] {
    s = q.acquire([&] { return cancel ? absl::CancelledError("gone") : absl::OkStatus(); });
  });
  while (q.waiting() != 1) std::this_thread::yield();
  cancel = true;
  waiter.join();
  EXPECT_TRUE(absl::IsCancelled(s));
  EXPECT_EQ(q.waiting(), 0);
  EXPECT_EQ(q.running(), 1);
}

TEST(AdmissionQueue, ARequestStoppedBeforeItCameTakesNoSlot) {
  AdmissionQueue q(1, 1);
  const Status s = q.acquire([] { return absl::CancelledError("aborted"); });
  EXPECT_TRUE(absl::IsCancelled(s)) << s;
  EXPECT_EQ(q.running(), 0);
  EXPECT_EQ(q.waiting(), 0);
}

// Two threads and one queue slot: two connections run, one waits, the fourth is served at once
// on the overflow pool (where the handlers answer 429), and none is lost.
TEST(BoundedTaskQueue, BeyondThreadsAndQueueTasksRunOnTheOverflowPool) {
  std::mutex mu;
  std::condition_variable cv;
  bool release = false;
  std::atomic<int> ran{0}, overflowed{0};
  auto blocking = [&] {
    if (BoundedTaskQueue::in_overflow()) ++overflowed;
    std::unique_lock lock(mu);
    cv.wait(lock, [&] { return release; });
    ++ran;
  };
  {
    BoundedTaskQueue q(/*threads=*/2, /*max_queued=*/1);
    for (int i = 0; i < 3; ++i) q.enqueue(blocking);
    std::atomic<bool> overflow_seen{false};
    q.enqueue([&] {
      overflow_seen = BoundedTaskQueue::in_overflow();
      ++ran;
    });
    for (int i = 0; i < 1000 && ran < 1; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    EXPECT_EQ(ran.load(), 1) << "the fourth task waited behind the busy threads";
    EXPECT_TRUE(overflow_seen);
    {
      std::lock_guard lock(mu);
      release = true;
    }
    cv.notify_all();
    q.shutdown();
  }
  EXPECT_EQ(ran.load(), 4);
  EXPECT_EQ(overflowed.load(), 0) << "tasks within threads + queue run on the main pool";
}

TEST(RouterMetricsFormat, LabelsAndValues) {
  EXPECT_EQ(format_labels({}), "");
  EXPECT_EQ(format_labels({{"worker", "127.0.0.1:5"}, {"role", "decode"}}), "{worker=\"127.0.0.1:5\",role=\"decode\"}");
  EXPECT_EQ(format_labels({{"a", "x\"y\\z\nw"}}), "{a=\"x\\\"y\\\\z\\nw\"}");
  EXPECT_EQ(format_value(3), "3");
  EXPECT_EQ(format_value(0.25), "0.25");
  EXPECT_EQ(format_value(INFINITY), "+Inf");
  EXPECT_EQ(format_value(NAN), "NaN");
}

TEST(RouterMetricsFormat, KvIndexStatePerWorkerAndEventHealth) {
  KvIndexStats stats;
  stats.applied_batches = 12;
  stats.gaps = 2;
  stats.replays_succeeded = 3;
  stats.replays_failed = 1;
  stats.last_lag_seconds = 0.25;
  std::string out;
  append_kv_index_metrics(out, stats,
                          {{"a:1", WorkerKvState::kExact, 40}, {"b:2", WorkerKvState::kDegraded, 7}, {"c:3", {}, 0}});
  const char* want[] = {
      "pdserve:kv_index_state{worker=\"a:1\",state=\"exact\"} 1\n",
      "pdserve:kv_index_state{worker=\"a:1\",state=\"recovering\"} 0\n",
      "pdserve:kv_index_state{worker=\"b:2\",state=\"exact\"} 0\n",
      "pdserve:kv_index_state{worker=\"b:2\",state=\"degraded\"} 1\n",
      "pdserve:kv_index_blocks{worker=\"a:1\"} 40\n",
      "pdserve:kv_index_blocks{worker=\"b:2\"} 7\n",
      "pdserve:kv_events_batches_total 12\n",
      "pdserve:kv_events_gaps_total 2\n",
      "pdserve:kv_events_replays_total{result=\"succeeded\"} 3\n",
      "pdserve:kv_events_replays_total{result=\"failed\"} 1\n",
      "pdserve:kv_events_lag_seconds{stat=\"last\"} 0.25\n",
      "# TYPE pdserve:kv_events_gaps_total counter\n",
  };
  for (const char* line : want) EXPECT_NE(out.find(line), std::string::npos) << line << "\nin:\n" << out;
  EXPECT_EQ(out.find("worker=\"c:3\""), std::string::npos) << "a worker without KV events has no index series";
}

TEST(RouterMetricsFormat, HistogramIsCumulative) {
  Histogram h({0.1, 1.0});
  h.observe(0.05);
  h.observe(0.5);
  h.observe(0.5);
  h.observe(7);
  std::string out;
  append_histogram(out, "x", {{"w", "a"}}, h);
  EXPECT_EQ(out,
            "x_bucket{w=\"a\",le=\"0.1\"} 1\n"
            "x_bucket{w=\"a\",le=\"1\"} 3\n"
            "x_bucket{w=\"a\",le=\"+Inf\"} 4\n"
            "x_sum{w=\"a\"} 8.05\n"
            "x_count{w=\"a\"} 4\n");
}

TEST(RouterMetricsFormat, RenderHasVllmNamesAndPerWorkerLabels) {
  RouterMetrics m;
  m.observe_request("length", 0.02, 0.005, 0.5, 10, 20);
  m.observe_kv_transfer("p:1", "d:2", 4096, 0.001);
  WorkerGauges w;
  w.worker = "d:2";
  w.role = "decode";
  w.up = true;
  w.num_blocks = 100;
  w.free_blocks = 75;
  w.kv_memory = "host";
  w.kv_transfer_requests = 7;
  w.kv_transfer_refused = 2;
  w.kv_transfer_seconds = 0.5;
  WorkerGauges aggregated;  // No kvtransfer: no kvtransfer counters.
  aggregated.worker = "a:3";
  aggregated.role = "aggregated";
  // Tiers: the host's under tier="host" (capacity in blocks), the disk's under tier="disk" (bytes,
  // drops, evictions, corrupt files); a worker without a tier has no tier samples.
  aggregated.host = {true, 400, 390, 120, 512, 130, 60};
  aggregated.disk = {true, 0, 0, 64, 256, 96, 32, 1 << 20, 16, 8, 1, 0.25, 2, 5};
  const std::string text = m.render(3, 2, {w, aggregated});
  EXPECT_EQ(text.find("pdserve:worker_kv_transfer_requests_total{worker=\"a:3\""), std::string::npos) << text;
  EXPECT_EQ(text.find("{worker=\"d:2\",role=\"decode\",tier="), std::string::npos) << text;
  EXPECT_EQ(text.find("pdserve:worker_kv_tier_blocks{worker=\"a:3\",role=\"aggregated\",tier=\"disk\"}"),
            std::string::npos) << "the disk tier's capacity is in bytes\n" << text;
  EXPECT_EQ(text.find("pdserve:worker_kv_tier_bytes{worker=\"a:3\",role=\"aggregated\",tier=\"host\"}"),
            std::string::npos) << text;
  for (const char* want : {"pdserve:worker_kv_tier_blocks{worker=\"a:3\",role=\"aggregated\",tier=\"host\"} 400",
                           "pdserve:worker_kv_tier_cached_blocks{worker=\"a:3\",role=\"aggregated\",tier=\"host\"} 120",
                           "pdserve:worker_kv_tier_free_blocks{worker=\"a:3\",role=\"aggregated\",tier=\"host\"} 390",
                           "pdserve:worker_kv_tier_loaded_blocks_total{worker=\"a:3\",role=\"aggregated\",tier=\"host\"} 60",
                           "pdserve:worker_kv_tier_cached_blocks{worker=\"a:3\",role=\"aggregated\",tier=\"disk\"} 64",
                           "pdserve:worker_kv_tier_hit_tokens_total{worker=\"a:3\",role=\"aggregated\",tier=\"disk\"} 256",
                           "pdserve:worker_kv_tier_bytes{worker=\"a:3\",role=\"aggregated\",tier=\"disk\"} 1048576",
                           "pdserve:worker_kv_tier_dropped_blocks_total{worker=\"a:3\",role=\"aggregated\",tier=\"disk\"} 16",
                           "pdserve:worker_kv_tier_evicted_blocks_total{worker=\"a:3\",role=\"aggregated\",tier=\"disk\"} 8",
                           "pdserve:worker_kv_tier_corrupt_files_total{worker=\"a:3\",role=\"aggregated\",tier=\"disk\"} 1",
                           "pdserve:worker_kv_tier_load_seconds_total{worker=\"a:3\",role=\"aggregated\",tier=\"disk\"} 0.25",
                           "pdserve:worker_kv_tier_load_timeouts_total{worker=\"a:3\",role=\"aggregated\",tier=\"disk\"} 2",
                           "pdserve:worker_kv_tier_pending_loads_total{worker=\"a:3\",role=\"aggregated\",tier=\"disk\"} 5",
                           "# TYPE pdserve:worker_kv_tier_bytes gauge"})
    EXPECT_NE(text.find(want), std::string::npos) << want << "\n" << text;
  for (const char* want : {"pdserve:num_requests_running 3", "pdserve:num_requests_waiting 2",
                           "pdserve:time_to_first_token_seconds_count 1", "pdserve:time_per_output_token_seconds_count 1",
                           "pdserve:e2e_request_latency_seconds_count 1",
                           "pdserve:kv_cache_usage_perc{worker=\"d:2\",role=\"decode\"} 0.25",
                           "pdserve:kv_cache_free_blocks{worker=\"d:2\",role=\"decode\"} 75",
                           "pdserve:kv_cache_total_blocks{worker=\"d:2\",role=\"decode\"} 100",
                           "pdserve:kv_transfer_bytes_total{prefill=\"p:1\",decode=\"d:2\"} 4096",
                           "pdserve:kv_transfer_seconds_count{prefill=\"p:1\",decode=\"d:2\"} 1",
                           "pdserve:request_success_total{finished_reason=\"length\"} 1",
                           "pdserve:worker_kv_transfer_requests_total{worker=\"d:2\",role=\"decode\"} 7",
                           "pdserve:worker_kv_transfer_refused_total{worker=\"d:2\",role=\"decode\"} 2",
                           "pdserve:worker_kv_transfer_seconds_total{worker=\"d:2\",role=\"decode\"} 0.5",
                           "# TYPE pdserve:worker_kv_transfer_failures_total counter",
                           "# TYPE pdserve:time_to_first_token_seconds histogram"})
    EXPECT_NE(text.find(want), std::string::npos) << want << "\n" << text;
}

TEST(OpenAiApi, ChatMessagesUseTheModelsChatTemplate) {
  const std::string body = R"({"messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Hi"}]})";
  auto plain = parse_openai_request(body, true);
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ(plain->request.text(), "system: Be brief.\nuser: Hi\nassistant:");
  const auto chatml = engine::ChatTemplate::from_tokenizer_config(R"({"chat_template":
      "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"})");
  auto rendered = parse_openai_request(body, true, chatml);
  ASSERT_TRUE(rendered.ok()) << rendered.status();
  EXPECT_EQ(rendered->request.text(),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  auto empty = parse_openai_request(R"({"messages":[{"role":"user","content":""}]})", true);
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_EQ(empty->request.text(), "user: \nassistant:");
}

// Fields a request leaves out: the model's defaults first, then OpenAI's temperature 1; what
// the request gives wins over both. vLLM's repetition_penalty is read.
TEST(OpenAiApi, DefaultsAreTheModelsThenOpenAis) {
  v1::SamplingDefaults model;
  model.set_temperature(0.6f);
  model.set_top_p(0.9f);
  model.set_repetition_penalty(1.2f);
  struct Case {
    const char* body;
    v1::SamplingDefaults defaults;
    float temperature, top_p, repetition_penalty;
  };
  const std::vector<Case> cases = {
      {R"({"prompt":"x"})", {}, 1.0f, 1.0f, 1.0f},
      {R"({"prompt":"x"})", model, 0.6f, 0.9f, 1.2f},
      {R"({"prompt":"x","temperature":0,"top_p":0.5,"repetition_penalty":1.0})", model, 0.0f, 0.5f, 1.0f},
      {R"({"prompt":"x","repetition_penalty":1.3})", {}, 1.0f, 1.0f, 1.3f},
  };
  for (const Case& c : cases) {
    auto r = parse_openai_request(c.body, false);
    ASSERT_TRUE(r.ok()) << r.status();
    v1::SamplingParams s = r->request.sampling();
    apply_openai_defaults(c.defaults, &s);
    EXPECT_FLOAT_EQ(s.temperature(), c.temperature) << c.body;
    EXPECT_FLOAT_EQ(s.has_top_p() ? s.top_p() : 1.0f, c.top_p) << c.body;
    EXPECT_FLOAT_EQ(s.has_repetition_penalty() ? s.repetition_penalty() : 1.0f, c.repetition_penalty) << c.body;
  }
  EXPECT_FALSE(parse_openai_request(R"({"prompt":"x","repetition_penalty":"high"})", false).ok());
  // vLLM's cache_salt: a string, carried to GenerateRequest.cache_salt.
  auto salted = parse_openai_request(R"({"prompt":"x","cache_salt":"tenant-a"})", false);
  ASSERT_TRUE(salted.ok()) << salted.status();
  EXPECT_EQ(salted->request.cache_salt(), "tenant-a");
  EXPECT_FALSE(parse_openai_request(R"({"prompt":"x","cache_salt":7})", false).ok());
}

// Tools, tool calls (arguments parsed from their JSON string, keys in the order sent),
// add_generation_prompt and chat_template_kwargs reach the template.
TEST(OpenAiApi, ChatTemplateInputsReachTheTemplate) {
  const auto t = engine::ChatTemplate::from_tokenizer_config(R"({"chat_template":
      "{{ tools | tojson }}|{% for m in messages %}{{ m.role }}{% for c in m.tool_calls | default([]) %} {{ c.id }} {{ c.function.name }} {{ c.function.arguments | tojson }}{% endfor %}{% if m.tool_call_id is defined %} {{ m.tool_call_id }}{% endif %};{% endfor %}{{ add_generation_prompt }}|{{ enable_thinking }}"})");
  auto r = parse_openai_request(R"({"messages":[
      {"role":"user","content":[{"type":"text","text":"weather?"}]},
      {"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"get","arguments":"{\"z\": 1, \"a\": \"x\"}"}}]},
      {"role":"tool","tool_call_id":"c1","content":"sunny"}],
    "tools":[{"type":"function","function":{"name":"get","parameters":{"type":"object"}}}],
    "add_generation_prompt":false,"chat_template_kwargs":{"enable_thinking":false}})",
                                true, t);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->request.text(),
            "[{\"type\": \"function\", \"function\": {\"name\": \"get\", \"parameters\": {\"type\": \"object\"}}}]|"
            "user;assistant c1 get {\"z\": 1, \"a\": \"x\"};tool c1;False|False");
}

TEST(OpenAiApi, ChatTemplateFailuresAreBadRequests) {
  const auto t = engine::ChatTemplate::from_tokenizer_config(
      R"({"chat_template": "{% if messages[0].role == 'tool' %}{{ raise_exception('no tool first') }}{% endif %}ok"})");
  auto r = parse_openai_request(R"({"messages":[{"role":"tool","content":"x"}]})", true, t);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(http_error(r.status()).status, 400);
  EXPECT_NE(r.status().message().find("no tool first"), std::string::npos) << r.status();
  for (const char* bad : {R"({"messages":[{"role":"user","content":"x"}],"tools":{}})",
                          R"({"messages":[{"role":"assistant","tool_calls":[{"function":{}}]}]})",
                          R"({"messages":[{"role":"user","content":"x"}],"chat_template_kwargs":[]})",
                          R"({"messages":[{"role":"user","content":"x"}],"add_generation_prompt":"yes"})"}) {
    auto e = parse_openai_request(bad, true, t);
    ASSERT_FALSE(e.ok()) << bad;
    EXPECT_EQ(e.status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
}

TEST(OpenAiApi, ParsesCompletionFields) {
  auto r = parse_openai_request(
      R"({"model":"m","prompt":"Once","max_tokens":5,"temperature":0,"top_p":0.5,"top_k":-1,"seed":7,
          "stop":["a","b"],"stream":true,"stream_options":{"include_usage":true},"ignore_eos":true})",
      false);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->request.model(), "m");
  EXPECT_EQ(r->request.text(), "Once");
  const v1::SamplingParams& s = r->request.sampling();
  EXPECT_EQ(s.max_tokens(), 5);
  EXPECT_EQ(s.temperature(), 0);
  EXPECT_FLOAT_EQ(s.top_p(), 0.5f);
  EXPECT_EQ(s.top_k(), 0);
  EXPECT_EQ(s.seed(), 7);
  EXPECT_EQ(s.stop_size(), 2);
  EXPECT_TRUE(s.ignore_eos());
  EXPECT_TRUE(r->stream);
  EXPECT_TRUE(r->include_usage);
  EXPECT_TRUE(r->max_tokens_given);

  auto ids = parse_openai_request(R"({"prompt":[1,2,3]})", false);
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(ids->request.token_ids().ids_size(), 3);
  EXPECT_EQ(ids->request.sampling().max_tokens(), 16);  // OpenAI's default.
  EXPECT_FALSE(ids->request.sampling().has_temperature());  // apply_openai_defaults decides.
  EXPECT_FALSE(ids->request.sampling().has_top_k());
  EXPECT_FALSE(ids->request.sampling().has_repetition_penalty());

  auto chat = parse_openai_request(R"({"messages":[{"role":"user","content":"Hi"}]})", true);
  ASSERT_TRUE(chat.ok());
  EXPECT_EQ(chat->request.text(), "user: Hi\nassistant:");
  EXPECT_FALSE(chat->max_tokens_given);
}

TEST(OpenAiApi, RejectsBadBodiesNamingTheField) {
  struct Case {
    const char* body;
    bool chat;
    const char* mentions;
  } cases[] = {
      {"{not json", false, "not valid JSON"},
      {"[1,2]", false, "JSON object"},
      {R"({"max_tokens":5})", false, "'prompt'"},
      {R"({"prompt":"x","max_tokens":"5"})", false, "'max_tokens'"},
      {R"({"prompt":"x","max_tokens":1.5})", false, "'max_tokens'"},
      {R"({"prompt":"x","temperature":"hot"})", false, "'temperature'"},
      {R"({"prompt":"x","stop":5})", false, "'stop'"},
      {R"({"prompt":"x","n":-1})", false, "'n'"},
      {R"({"prompt":"x","logprobs":30})", false, "'logprobs'"},
      {R"({"prompt":"x","stream":"yes"})", false, "'stream'"},
      {R"({"prompt":["a",1]})", false, "'prompt'"},
      {R"({"prompt":[1,-2]})", false, "'prompt'"},
      {R"({"prompt":"x","model":3})", false, "'model'"},
      {R"({"messages":[]})", true, "'messages'"},
      {R"({"messages":[{"content":"x"}]})", true, "role"},
      {R"({"messages":[{"role":"user","content":5}]})", true, "content"},
      // Numbers out of their field's range are refused, never wrapped or made infinite.
      {R"({"prompt":"x","max_tokens":18446744073709551615})", false, "'max_tokens' is out of range"},
      {R"({"prompt":"x","max_tokens":4294967297})", false, "'max_tokens' is out of range"},
      {R"({"prompt":"x","temperature":1e300})", false, "'temperature' is out of range"},
      {R"({"prompt":"x","stop_token_ids":[4294967296]})", false, "'stop_token_ids'"},
      {R"({"prompt":"x","request_id":7})", false, "'request_id'"},
  };
  for (const Case& c : cases) {
    auto r = parse_openai_request(c.body, c.chat);
    ASSERT_FALSE(r.ok()) << c.body;
    EXPECT_TRUE(absl::IsInvalidArgument(r.status())) << c.body;
    EXPECT_NE(r.status().message().find(c.mentions), std::string_view::npos) << c.body << ": " << r.status();
  }
}

TEST(OpenAiApi, ErrorsMapToHttpStatuses) {
  EXPECT_EQ(http_error(absl::InvalidArgumentError("x")).status, 400);
  EXPECT_EQ(http_error(absl::NotFoundError("x")).status, 404);
  EXPECT_EQ(http_error(absl::ResourceExhaustedError("overloaded")).status, 429);
  EXPECT_EQ(http_error(absl::UnavailableError("x")).status, 503);
  EXPECT_EQ(http_error(absl::DeadlineExceededError("x")).status, 504);
  const HttpError e = http_error(absl::InvalidArgumentError("bad top_p"));
  EXPECT_EQ(e.body["error"]["message"], "bad top_p");
  EXPECT_EQ(e.body["error"]["type"], "invalid_request_error");
  EXPECT_EQ(http_error(absl::NotFoundError("m")).body["error"]["code"], "model_not_found");
}

TEST(ApiKeys, AllowsOnlyBearerKeysItKnows) {
  const ApiKeys none;
  EXPECT_FALSE(none.required());
  EXPECT_TRUE(none.allows(""));
  const std::string file = ::testing::TempDir() + "/api_keys";
  {
    std::ofstream out(file);
    out << "# keys\n\n  from-file  \n";
  }
  auto keys = ApiKeys::load({"k1"}, file, " from-env\n");
  ASSERT_TRUE(keys.ok()) << keys.status();
  EXPECT_TRUE(keys->required());
  EXPECT_EQ(keys->size(), 3u);
  struct Case {
    const char* authorization;
    bool allowed;
  } cases[] = {
      {"Bearer k1", true},         {"bearer k1", true},      {"BEARER  k1 ", true}, {"Bearer from-file", true},
      {"Bearer from-env", true},   {"", false},              {"k1", false},         {"Bearer", false},
      {"Bearer ", false},          {"Bearer k", false},      {"Bearer k11", false}, {"Basic k1", false},
      {"Bearer # keys", false},    {"Bearer K1", false},
  };
  for (const Case& c : cases) EXPECT_EQ(keys->allows(c.authorization), c.allowed) << "'" << c.authorization << "'";
  EXPECT_FALSE(ApiKeys::load({" "}, "", nullptr).ok());
  EXPECT_FALSE(ApiKeys::load({}, file + ".missing", nullptr).ok());
  {
    std::ofstream out(file);
    out << "# only a comment\n";
  }
  EXPECT_FALSE(ApiKeys::load({}, file, nullptr).ok());
  EXPECT_FALSE(ApiKeys::load({}, "", "").value().required());
}

// How the HTTP server sees a non-streaming client hang up: the kernel's state of the connection
// by its address pair, from the server's side.
TEST(TcpConnectionState, EstablishedUntilTheClientClosesOrResets) {
  auto port_of = [](int fd) {
    sockaddr_in a{};
    socklen_t len = sizeof a;
    getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
    return int(ntohs(a.sin_port));
  };
  const int listener = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ASSERT_EQ(listen(listener, 4), 0);
  addr.sin_port = htons(uint16_t(port_of(listener)));
  for (bool reset : {false, true}) {
    const int client = socket(AF_INET, SOCK_STREAM, 0);
    ASSERT_EQ(connect(client, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
    const int served = accept(listener, nullptr, nullptr);
    ASSERT_GE(served, 0);
    auto state = [&] { return tcp_connection_state("127.0.0.1", port_of(listener), "127.0.0.1", port_of(client)); };
    ASSERT_TRUE(state().ok()) << state().status();
    EXPECT_EQ(*state(), TcpConnectionState::kEstablished);
    if (reset) {
      linger abort_on_close{1, 0};  // close() sends RST.
      setsockopt(client, SOL_SOCKET, SO_LINGER, &abort_on_close, sizeof abort_on_close);
    }
    const int client_port = port_of(client);
    close(client);
    StatusOr<TcpConnectionState> after = absl::UnknownError("not asked");
    for (int i = 0; i < 200; ++i) {  // The FIN or RST arrives asynchronously (loopback: at once).
      after = tcp_connection_state("127.0.0.1", port_of(listener), "127.0.0.1", client_port);
      if (after.ok() && *after != TcpConnectionState::kEstablished) break;
      usleep(1000);
    }
    ASSERT_TRUE(after.ok()) << after.status();
    EXPECT_NE(*after, TcpConnectionState::kEstablished) << (reset ? "reset" : "closed");
    close(served);
  }
  // The kernel's lookup falls back to the listener for an unknown peer: that is not the connection.
  auto listener_only = tcp_connection_state("127.0.0.1", port_of(listener), "127.0.0.1", 9);
  ASSERT_TRUE(listener_only.ok()) << listener_only.status();
  EXPECT_EQ(*listener_only, TcpConnectionState::kNotFound);
  close(listener);
  // No such connection at all. Not an address: refused.
  auto none = tcp_connection_state("127.0.0.1", 1, "127.0.0.1", 2);
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_EQ(*none, TcpConnectionState::kNotFound);
  EXPECT_TRUE(absl::IsInvalidArgument(tcp_connection_state("localhost", 1, "127.0.0.1", 2).status()));
}

}  // namespace
}  // namespace pdserve::router

namespace pdserve::tools {
namespace {

TEST(BenchStats, PercentileInterpolatesLikeNumpy) {
  EXPECT_EQ(percentile({}, 50), 0);
  EXPECT_DOUBLE_EQ(percentile({4, 1, 3, 2}, 50), 2.5);
  EXPECT_DOUBLE_EQ(percentile({1, 2, 3, 4, 5}, 90), 4.6);
  EXPECT_DOUBLE_EQ(percentile({1, 2, 3, 4, 5}, 100), 5);
  EXPECT_DOUBLE_EQ(percentile({7}, 99), 7);
}

TEST(BenchStats, ArrivalTimes) {
  auto all_at_once = arrival_times(5, INFINITY, 1.0, 1);
  EXPECT_EQ(all_at_once, std::vector<double>(5, 0.0));
  auto poisson = arrival_times(2000, 100.0, 1.0, 1);
  EXPECT_EQ(poisson[0], 0);
  EXPECT_TRUE(std::is_sorted(poisson.begin(), poisson.end()));
  EXPECT_NEAR(poisson.back() / 1999, 0.01, 0.001);  // Mean gap 1/rate.
}

TEST(BenchStats, SummarizeComputesVllmKeys) {
  RequestRecord a{true, "", 10, 5, 0.0, 0.1, 0.5, {0.1, 0.1, 0.1, 0.1}};
  RequestRecord b{true, "", 20, 3, 0.2, 0.3, 0.7, {0.2, 0.2}};
  RequestRecord c{true, "", 1, 1, 0.9, 0.1, 0.1, {}};  // Starts after a and b ended.
  RequestRecord failed{false, "boom", 10, 0, 0, 0, 0, {}};
  a.transferred_blocks = 3;
  a.decode_cached_tokens = 16;
  b.decode_local_prefill = true;
  c.transferred_blocks = 1;
  failed.transferred_blocks = 9;  // A failed request counts in none of the sums.
  failed.decode_local_prefill = true;
  auto j = summarize({a, b, c, failed}, 2.0, {50, 99});
  EXPECT_EQ(j["total_transferred_blocks"], 4);
  EXPECT_DOUBLE_EQ(j["mean_transferred_blocks"].get<double>(), 4.0 / 3);
  EXPECT_EQ(j["total_decode_cached_tokens"], 16);
  EXPECT_EQ(j["decode_local_prefills"], 1);
  EXPECT_EQ(j["completed"], 3);
  EXPECT_EQ(j["failed"], 1);
  EXPECT_EQ(j["total_input_tokens"], 31);
  EXPECT_EQ(j["total_output_tokens"], 9);
  EXPECT_DOUBLE_EQ(j["request_throughput"].get<double>(), 1.5);
  EXPECT_DOUBLE_EQ(j["output_throughput"].get<double>(), 4.5);
  EXPECT_DOUBLE_EQ(j["total_token_throughput"].get<double>(), 20.0);
  EXPECT_EQ(j["peak_concurrency"], 2);
  EXPECT_NEAR(j["mean_ttft_ms"].get<double>(), 500.0 / 3, 1e-9);
  EXPECT_NEAR(j["mean_tpot_ms"].get<double>(), 150, 1e-9);  // (0.4/4 + 0.4/2) / 2; c has one token.
  EXPECT_NEAR(j["median_itl_ms"].get<double>(), 100, 1e-9);
  EXPECT_NEAR(j["mean_e2el_ms"].get<double>(), 1300.0 / 3, 1e-9);
  EXPECT_TRUE(j.contains("p99_e2el_ms"));
}

TEST(BenchStats, RequestDetailsListEveryRequestInOrder) {
  RequestRecord a{true, "", 10, 5, 0.0, 0.1, 0.5, {0.1, 0.1, 0.1, 0.1}};
  a.prefill_worker = "10.0.0.1:7001";
  a.decode_worker = "10.0.0.2:7002";
  a.server_prefill_s = 0.05;
  a.migrations = 1;
  a.request_id = "req-1";
  a.transferred_blocks = 2;
  a.decode_local_prefill = true;
  RequestRecord one_token{true, "", 4, 1, 0.3, 0.2, 0.2, {}};
  RequestRecord failed{false, "gone", 7, 0, 0.4, 0, 0.01, {}};
  failed.code = absl::StatusCode::kUnavailable;
  const nlohmann::json d = request_details({a, one_token, failed});
  ASSERT_TRUE(d.is_array());
  ASSERT_EQ(d.size(), 3u);
  EXPECT_EQ(d[0]["ok"], true);
  EXPECT_EQ(d[0]["prompt_tokens"], 10);
  EXPECT_EQ(d[0]["output_tokens"], 5);
  EXPECT_DOUBLE_EQ(d[0]["ttft_s"].get<double>(), 0.1);
  EXPECT_DOUBLE_EQ(d[0]["e2e_s"].get<double>(), 0.5);
  EXPECT_DOUBLE_EQ(d[0]["tpot_s"].get<double>(), 0.1);  // (0.5 - 0.1) / 4.
  EXPECT_EQ(d[0]["itl_s"].size(), 4u);
  EXPECT_DOUBLE_EQ(d[0]["server_prefill_s"].get<double>(), 0.05);
  EXPECT_EQ(d[0]["prefill_worker"], "10.0.0.1:7001");
  EXPECT_EQ(d[0]["decode_worker"], "10.0.0.2:7002");
  EXPECT_EQ(d[0]["migrations"], 1);
  EXPECT_EQ(d[0]["request_id"], "req-1");
  EXPECT_EQ(d[0]["transferred_blocks"], 2);
  EXPECT_EQ(d[0]["decode_local_prefill"], true);
  EXPECT_EQ(d[1]["decode_local_prefill"], false);
  EXPECT_EQ(d[0]["code"], "OK");
  EXPECT_TRUE(d[1]["tpot_s"].is_null());  // One token: no time per output token.
  EXPECT_DOUBLE_EQ(d[1]["start_s"].get<double>(), 0.3);
  EXPECT_EQ(d[2]["ok"], false);
  EXPECT_EQ(d[2]["error"], "gone");
  EXPECT_EQ(d[2]["code"], "UNAVAILABLE");
}

}  // namespace
}  // namespace pdserve::tools
