// router/parallel_samples.h over a fake generate function: the samples' requests (seed + i,
// ids), concurrent runs whose responses are tagged with their index and emitted one at a time,
// and cancellation (a failing sample, a gone client) reaching every sample.
#include "router/parallel_samples.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
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

// A generate that emits `steps` messages carrying its seed (3 tokens each, the last finished).
struct FakeRouter {
  std::atomic<int> calls{0};
  int steps = 3;
  Status operator()(const v1::GenerateRequest& r, const std::function<bool()>&, const SampleEmit& emit) {
    ++calls;
    for (int s = 0; s < steps; ++s) {
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
      seeded("r", 100, 4), [&](auto& r, auto& gone, auto& emit) { return fake(r, gone, emit); }, [] { return false; },
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
}

TEST(ParallelSamples, SingleSampleIsOnePlainCall) {
  std::vector<v1::GenerateRequest> seen;
  const Status s = generate_samples(
      seeded("keep", 3, 1),
      [&](const v1::GenerateRequest& r, auto&, const SampleEmit& emit) {
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
      sample_requests(seeded("", 1, 2), 2), {5, 9},
      [&](auto& r, auto& gone, auto& emit) { return fake(r, gone, emit); }, nullptr,
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
      sample_requests(seeded("", 1, 4), 4), {},
      [&](const v1::GenerateRequest& r, const std::function<bool()>& gone, const SampleEmit&) -> Status {
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
      sample_requests(seeded("", 1, 3), 3), {},
      [&](const v1::GenerateRequest& r, const std::function<bool()>& gone, const SampleEmit&) -> Status {
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
      sample_requests(seeded("", 1, 3), 3), {},
      [&](const v1::GenerateRequest& r, const std::function<bool()>& gone, const SampleEmit& emit) -> Status {
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
