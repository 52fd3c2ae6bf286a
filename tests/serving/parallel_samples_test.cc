// router/parallel_samples.h over a fake generate function: the samples' requests (seed + i,
// ids), concurrent runs whose responses are tagged with their index and emitted one at a time,
// and cancellation (a failing sample, a gone client) reaching every sample.
#include "router/parallel_samples.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <thread>

namespace pdserve::router {
namespace {

v1::GenerateRequest seeded(const std::string& id, int64_t seed, int n) {
  v1::GenerateRequest r;
  r.set_request_id(id);
  r.set_text("Once");
  r.mutable_sampling()->set_seed(seed);
  r.mutable_sampling()->set_max_tokens(4);
  r.mutable_sampling()->set_n(n);
  return r;
}

// seed + i past the largest seed wraps to 0 (no signed overflow); a negative seed is kept for
// validation to refuse, not dropped (which would make the samples silently random).
TEST(ParallelSamples, SeedsWrapPastTheLargestAndNegativeOnesAreKept) {
  const auto top = sample_requests(seeded("req", INT64_MAX, 2), 2);
  ASSERT_EQ(top.size(), 2u);
  EXPECT_EQ(top[0].sampling().seed(), INT64_MAX);
  EXPECT_EQ(top[1].sampling().seed(), 0);
  const auto negative = sample_requests(seeded("req", -2, 2), 2);
  ASSERT_EQ(negative.size(), 2u);
  for (const auto& r : negative) {
    EXPECT_TRUE(r.sampling().has_seed());
    EXPECT_EQ(r.sampling().seed(), -2);
  }
}

TEST(ParallelSamples, SampleRequestsGetSeedPlusIndexAndTheirOwnIds) {
  const auto reqs = sample_requests(seeded("req", 7, 3), 3);
  ASSERT_EQ(reqs.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(reqs[size_t(i)].sampling().seed(), 7 + i);
    EXPECT_EQ(reqs[size_t(i)].sampling().n(), 0);
    EXPECT_EQ(reqs[size_t(i)].request_id(), "req-" + std::to_string(i));
    EXPECT_EQ(reqs[size_t(i)].text(), "Once");
    EXPECT_EQ(reqs[size_t(i)].sampling().max_tokens(), 4);
  }
  v1::GenerateRequest unseeded;
  unseeded.set_text("x");
  const auto u = sample_requests(unseeded, 2);
  ASSERT_EQ(u.size(), 2u);
  EXPECT_FALSE(u[1].sampling().has_seed());  // Random: each sample its own.
  EXPECT_TRUE(u[1].request_id().empty());    // The router names each.
}

// A generate that emits `steps` messages carrying its seed (3 tokens each, the last finished),
// reporting its prompt computed "on" the workers named by its seed at the first.
struct FakeRouter {
  std::atomic<int> calls{0};
  int steps = 3;
  std::mutex mu;
  std::map<int64_t, PromptPlacement> preferred;  // By seed: the placement each call was asked for.
  Status operator()(const v1::GenerateRequest& r, const PromptAffinity& affinity, const std::function<bool()>&,
                    const SampleEmit& emit) {
    ++calls;
    {
      std::lock_guard lock(mu);
      preferred[r.sampling().seed()] = affinity.prefer;
    }
    for (int s = 0; s < steps; ++s) {
      if (s == 0 && affinity.on_prompt_computed) {
        const std::string at = std::to_string(r.sampling().seed());
        affinity.on_prompt_computed({"p" + at, "d" + at});
      }
      v1::GenerateResponse m;
      m.set_request_id(r.request_id());
      m.add_token_ids(int(r.sampling().seed()));
      m.set_text(std::to_string(r.sampling().seed()));
      m.set_finished(s + 1 == steps);
      const bool ok = emit(m);
      if (!ok) return absl::CancelledError("client gone");
    }
    return absl::OkStatus();
  }
};

TEST(ParallelSamples, RunsEverySampleAndTagsItsIndex) {
  FakeRouter fake;
  std::map<int, std::string> text;
  std::map<int, int> finished;
  std::atomic<int> in_emit{0};  // The client's emits never overlap (the samples' threads race).
  std::atomic<bool> overlapped{false};
  const Status s = generate_samples(
      seeded("r", 100, 4), [&](auto& r, auto& a, auto& gone, auto& emit) { return fake(r, a, gone, emit); }, [] { return false; },
      [&](const v1::GenerateResponse& m) {
        if (in_emit.fetch_add(1) != 0) overlapped = true;
        std::this_thread::yield();  // Widens the window another emit would need.
        in_emit.fetch_sub(1);
        text[m.index()] += m.text();
        finished[m.index()] += m.finished();
        return true;
      });
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(fake.calls, 4);
  EXPECT_FALSE(overlapped);
  ASSERT_EQ(text.size(), 4u);
  for (int i = 0; i < 4; ++i) {
    const std::string seed = std::to_string(100 + i);
    EXPECT_EQ(text[i], seed + seed + seed) << i;  // Sample i ran with seed + i, tagged i.
    EXPECT_EQ(finished[i], 1);
  }
  // Sample 0 was placed by load; the others where sample 0 computed the prompt.
  EXPECT_EQ(fake.preferred[100].prefill_worker, "");
  for (int i = 1; i < 4; ++i) {
    EXPECT_EQ(fake.preferred[100 + i].prefill_worker, "p100") << i;
    EXPECT_EQ(fake.preferred[100 + i].decode_worker, "d100") << i;
  }
}

// Two prompts of three samples each: each group's followers start only once their own leader
// computed its prompt, and are placed there; the leaders do not wait for each other (leader 0
// computes its prompt only after leader 1 started).
TEST(ParallelSamples, FollowersStartAfterTheirLeadersPromptOnItsWorkers) {
  std::vector<v1::GenerateRequest> requests = sample_requests(seeded("", 10, 3), 3);
  for (v1::GenerateRequest& r : sample_requests(seeded("", 20, 3), 3)) requests.push_back(r);
  std::mutex mu;
  std::condition_variable cv;
  bool leader1_started = false;
  std::map<int64_t, bool> computed;                 // By leader seed: its prompt was reported.
  std::map<int64_t, PromptPlacement> preferred;     // By seed.
  std::map<int64_t, bool> started_after_leader;     // By follower seed.
  const Status s = run_parallel(
      requests, {}, 3,
      [&](const v1::GenerateRequest& r, const PromptAffinity& a, const std::function<bool()>&,
          const SampleEmit& emit) -> Status {
        const int64_t seed = r.sampling().seed();
        const int64_t leader = seed < 20 ? 10 : 20;
        {
          std::unique_lock lock(mu);
          preferred[seed] = a.prefer;
          if (seed == leader) {
            if (seed == 20) leader1_started = true;
            cv.notify_all();
            if (seed == 10 && !cv.wait_for(lock, std::chrono::seconds(20), [&] { return leader1_started; }))
              return absl::DeadlineExceededError("leader 1 never started");
          } else {
            started_after_leader[seed] = computed[leader];
          }
        }
        if (a.on_prompt_computed) {
          {
            std::lock_guard lock(mu);
            computed[seed] = true;
          }
          a.on_prompt_computed({"p" + std::to_string(seed), "d" + std::to_string(seed)});
        }
        v1::GenerateResponse m;
        m.set_finished(true);
        return emit(m) ? absl::OkStatus() : absl::CancelledError("gone");
      },
      [] { return false; }, [](const v1::GenerateResponse&) { return true; });
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(preferred[10].prefill_worker, "");
  EXPECT_EQ(preferred[20].prefill_worker, "");
  for (int64_t seed : {11, 12, 21, 22}) {
    const std::string leader = seed < 20 ? "10" : "20";
    EXPECT_TRUE(started_after_leader[seed]) << seed;
    EXPECT_EQ(preferred[seed].prefill_worker, "p" + leader) << seed;
    EXPECT_EQ(preferred[seed].decode_worker, "d" + leader) << seed;
  }
}

// A leader that fails before its prompt is computed fails the request; its followers never run.
// One that ends without output but well lets them run, placed by load.
TEST(ParallelSamples, ALeaderEndingBeforeItsPromptReleasesItsFollowers) {
  std::atomic<int> follower_calls{0};
  const Status failed = run_parallel(
      sample_requests(seeded("", 1, 3), 3), {}, 3,
      [&](const v1::GenerateRequest& r, const PromptAffinity&, const std::function<bool()>&, const SampleEmit&) {
        if (r.sampling().seed() != 1) ++follower_calls;
        return absl::UnavailableError("worker died");
      },
      [] { return false; }, [](const v1::GenerateResponse&) { return true; });
  EXPECT_TRUE(absl::IsUnavailable(failed)) << failed;
  EXPECT_EQ(follower_calls, 0);

  std::mutex mu;
  std::map<int64_t, PromptPlacement> preferred;
  const Status quiet = run_parallel(
      sample_requests(seeded("", 1, 3), 3), {}, 3,
      [&](const v1::GenerateRequest& r, const PromptAffinity& a, const std::function<bool()>&, const SampleEmit&) {
        std::lock_guard lock(mu);
        preferred[r.sampling().seed()] = a.prefer;
        return absl::OkStatus();
      },
      [] { return false; }, [](const v1::GenerateResponse&) { return true; });
  ASSERT_TRUE(quiet.ok()) << quiet;
  ASSERT_EQ(preferred.size(), 3u);
  for (const auto& [seed, p] : preferred) EXPECT_EQ(p.prefill_worker, "") << seed;
}

TEST(ParallelSamples, SingleSampleIsOnePlainCall) {
  std::vector<v1::GenerateRequest> seen;
  const Status s = generate_samples(
      seeded("keep", 3, 1),
      [&](const v1::GenerateRequest& r, const PromptAffinity&, auto&, const SampleEmit& emit) {
        seen.push_back(r);
        v1::GenerateResponse m;
        m.set_index(0);
        return emit(m) ? absl::OkStatus() : absl::CancelledError("");
      },
      [] { return false; }, [](const v1::GenerateResponse&) { return true; });
  ASSERT_TRUE(s.ok());
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0].request_id(), "keep");  // Not renamed.
  EXPECT_EQ(seen[0].sampling().seed(), 3);
  EXPECT_EQ(seen[0].sampling().n(), 0);
}

TEST(ParallelSamples, ExplicitIndices) {
  FakeRouter fake;
  std::map<int, int> count;
  const Status s = run_parallel(
      sample_requests(seeded("", 1, 2), 2), {5, 9}, 2,
      [&](auto& r, auto& a, auto& gone, auto& emit) { return fake(r, a, gone, emit); }, nullptr,
      [&](const v1::GenerateResponse& m) {
        ++count[m.index()];
        return true;
      });
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(count, (std::map<int, int>{{5, 3}, {9, 3}}));
}

// A sample that waits, bounded, until it is told the client is gone.
Status wait_for_cancel(const std::function<bool()>& gone) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (!gone()) {
    if (std::chrono::steady_clock::now() > deadline) return absl::DeadlineExceededError("never cancelled");
    std::this_thread::yield();
  }
  return absl::CancelledError("cancelled");
}

TEST(ParallelSamples, OneFailureFailsTheRequestAndCancelsTheRest) {
  std::atomic<int> cancelled{0};
  const Status s = run_parallel(
      sample_requests(seeded("", 1, 4), 4), {}, 1,
      [&](const v1::GenerateRequest& r, const PromptAffinity&, const std::function<bool()>& gone,
          const SampleEmit&) -> Status {
        if (r.sampling().seed() == 3) return absl::UnavailableError("worker died");
        Status w = wait_for_cancel(gone);
        if (absl::IsCancelled(w)) ++cancelled;
        return w;
      },
      [] { return false; }, [](const v1::GenerateResponse&) { return true; });
  EXPECT_TRUE(absl::IsUnavailable(s)) << s;  // The failure, not the cancels it caused.
  EXPECT_EQ(cancelled, 3);
}

TEST(ParallelSamples, GoneClientCancelsEverySample) {
  // The client goes away: client_gone turns true.
  std::atomic<bool> client_left{false};
  std::atomic<int> cancelled{0};
  const Status s = run_parallel(
      sample_requests(seeded("", 1, 3), 3), {}, 1,
      [&](const v1::GenerateRequest& r, const PromptAffinity&, const std::function<bool()>& gone,
          const SampleEmit&) -> Status {
        if (r.sampling().seed() == 2) client_left = true;
        Status w = wait_for_cancel(gone);
        if (absl::IsCancelled(w)) ++cancelled;
        return w;
      },
      [&] { return client_left.load(); }, [](const v1::GenerateResponse&) { return true; });
  EXPECT_TRUE(absl::IsCancelled(s)) << s;
  EXPECT_EQ(cancelled, 3);

  // An emit that fails (the stream's write did) cancels the others too.
  std::atomic<int> cancelled2{0};
  const Status s2 = run_parallel(
      sample_requests(seeded("", 1, 3), 3), {}, 1,
      [&](const v1::GenerateRequest& r, const PromptAffinity&, const std::function<bool()>& gone,
          const SampleEmit& emit) -> Status {
        if (r.sampling().seed() == 1 && !emit(v1::GenerateResponse())) return absl::CancelledError("gone");
        Status w = wait_for_cancel(gone);
        if (absl::IsCancelled(w)) ++cancelled2;
        return w;
      },
      [] { return false; }, [](const v1::GenerateResponse&) { return false; });
  EXPECT_TRUE(absl::IsCancelled(s2)) << s2;
  EXPECT_EQ(cancelled2, 2);
}

}  // namespace
}  // namespace pdserve::router
