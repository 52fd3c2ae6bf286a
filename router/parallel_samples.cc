#include "router/parallel_samples.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <optional>
#include <system_error>
#include <thread>

namespace pdserve::router {

std::vector<v1::GenerateRequest> sample_requests(const v1::GenerateRequest& request, int samples) {
  std::vector<v1::GenerateRequest> out;
  out.reserve(size_t(std::max(samples, 0)));
  for (int i = 0; i < samples; ++i) {
    v1::GenerateRequest r = request;
    r.mutable_sampling()->clear_n();
    // seed + i, modulo 2^63 past the largest seed (no signed overflow; a negative seed stays
    // negative, for validation to refuse).
    if (const int64_t seed = request.sampling().has_seed() ? request.sampling().seed() : -1; seed >= 0)
      r.mutable_sampling()->set_seed(int64_t((uint64_t(seed) + uint64_t(i)) & uint64_t(INT64_MAX)));
    if (!request.request_id().empty()) r.set_request_id(absl::StrCat(request.request_id(), "-", i));
    out.push_back(std::move(r));
  }
  return out;
}

Status run_parallel(const std::vector<v1::GenerateRequest>& requests, const std::vector<int>& indices, int group_size,
                    const GenerateFn& generate, const std::function<bool()>& client_gone, const SampleEmit& emit) {
  if (requests.empty()) return absl::OkStatus();
  group_size = std::max(group_size, 1);
  std::mutex mu;  // Serialises emits and `failure`.
  // Serialises client_gone polls (the front end's per-call state, not made for several
  // watchers). Not `mu`: an emit blocked on a slow client must not hold up the router's
  // watchdog, which polls this.
  std::mutex gone_mu;
  std::atomic<bool> cancel{false};
  std::optional<Status> failure;  // The first request's failure that was not our own cancel.
  // Per group: whether its followers may start, and where the leader's prompt was computed.
  struct Group {
    bool released = false;
    PromptPlacement placement;
  };
  std::vector<Group> groups((requests.size() + size_t(group_size) - 1) / size_t(group_size));
  std::mutex group_mu;
  std::condition_variable group_cv;
  auto release = [&](Group& g, const PromptPlacement& at) {
    std::lock_guard lock(group_mu);
    if (g.released) return;
    g.placement = at;
    g.released = true;
    group_cv.notify_all();
  };
  auto gone = [&] {
    if (cancel.load()) return true;
    std::lock_guard lock(gone_mu);
    if (client_gone && client_gone()) cancel = true;
    return cancel.load();
  };
  auto run_one = [&](size_t i) {
    const int index = indices.empty() ? int(i) : indices[i];
    Group& group = groups[i / size_t(group_size)];
    const bool leader = i % size_t(group_size) == 0;
    PromptAffinity affinity;
    if (leader) {
      affinity.on_prompt_computed = [&](const PromptPlacement& at) { release(group, at); };
    } else {
      std::unique_lock lock(group_mu);
      group_cv.wait(lock, [&] { return group.released || cancel.load(); });
      if (cancel.load()) return;
      affinity.prefer = group.placement;
    }
    Status s = generate(requests[i], affinity, gone, [&, index](const v1::GenerateResponse& r) {
      std::lock_guard lock(mu);
      if (cancel.load()) return false;
      v1::GenerateResponse tagged = r;
      tagged.set_index(index);
      if (!emit(tagged)) cancel = true;
      return !cancel.load();
    });
    if (!s.ok()) {
      std::lock_guard lock(mu);
      if (!cancel.load() && !failure) failure = s;
      cancel = true;
    }
    // A leader that ended without output (a failure, say) still lets its followers go: they
    // see the cancel, or run placed by load.
    if (leader) release(group, {});
  };
  std::vector<std::thread> threads;
  threads.reserve(requests.size() - 1);
  Status started = absl::OkStatus();
  try {
    for (size_t i = 1; i < requests.size(); ++i) threads.emplace_back(run_one, i);
  } catch (const std::system_error& e) {
    // Out of threads: the samples already started are cancelled and joined, not abandoned
    // (followers waiting for a leader that never started are woken by the cancel).
    cancel = true;
    {
      std::lock_guard lock(group_mu);
      group_cv.notify_all();
    }
    started = absl::ResourceExhaustedError(absl::StrCat("cannot start a thread per sample: ", e.what()));
  }
  if (started.ok()) run_one(0);
  for (std::thread& t : threads) t.join();
  if (!started.ok()) return started;
  if (failure) return *failure;
  if (cancel.load()) return absl::CancelledError("the client is gone");
  return absl::OkStatus();
}

Status generate_samples(const v1::GenerateRequest& request, const GenerateFn& generate,
                        const std::function<bool()>& client_gone, const SampleEmit& emit) {
  if (request.sampling().n() <= 1) {
    v1::GenerateRequest single = request;
    single.mutable_sampling()->clear_n();
    return generate(single, {}, client_gone, emit);
  }
  const int n = request.sampling().n();
  return run_parallel(sample_requests(request, n), {}, n, generate, client_gone, emit);
}

}  // namespace pdserve::router
