// Parallel samples at the front end: the n samples of one GenerateRequest (SamplingParams.n,
// or the best_of of a completions request), and the prompts of a batched completions request,
// run as concurrent single-sample router requests whose responses reach one client stream
// tagged with GenerateResponse.index. Used by the gRPC Generation service and the HTTP server.
// Sample i of a seeded request runs with seed + i (vLLM's rule), so it equals a single request
// with that seed. The samples of one prompt compute it once: the first runs at once, the
// others when its prompt is computed, on the workers that hold it in their prefix cache
// (router/prompt_affinity.h). Kept over a generate function rather than the Router so it is
// tested alone.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "common/status.h"
#include "proto/pdserve.pb.h"
#include "router/prompt_affinity.h"

namespace pdserve::router {

// Samples one request may ask for (vLLM has no limit, but each is a concurrent router request
// holding its own blocks for its output, and its prompt's last partial block).
inline constexpr int kMaxSamples = 16;

// Receives a response; false once the client is gone (Router::Emit).
using SampleEmit = std::function<bool(const v1::GenerateResponse&)>;
// Runs one single-sample request to its end (Router::generate with the caller's client and
// the affinity given).
using GenerateFn = std::function<Status(const v1::GenerateRequest&, const PromptAffinity&,
                                        const std::function<bool()>& client_gone, const SampleEmit&)>;

// The `samples` single-sample requests of `request` (n cleared): sample i gets seed + i when
// seeded and, when the request has an id, the id "<id>-<i>" (a client that aborts by id aborts
// each of them, GenerationService::Abort).
std::vector<v1::GenerateRequest> sample_requests(const v1::GenerateRequest& request, int samples);

// Runs `requests` concurrently through `generate` (each on its own thread, the first on the
// caller's) and emits each response of requests[i] with index = indices[i] (i when `indices`
// is empty), one emit at a time. The requests come in groups of `group_size` samples of one
// prompt: a group's first request (its leader) starts at once, the others once the leader's
// prompt is computed (or the leader ended), preferring the leader's workers. A gone client
// (`client_gone`, or `emit` returning false) cancels every request; the first request to fail
// cancels the others and its status is returned. OK when all ended.
Status run_parallel(const std::vector<v1::GenerateRequest>& requests, const std::vector<int>& indices, int group_size,
                    const GenerateFn& generate, const std::function<bool()>& client_gone, const SampleEmit& emit);

// A request with SamplingParams.n samples (the gRPC API): one plain generate when n <= 1
// (index 0), else run_parallel over sample_requests.
Status generate_samples(const v1::GenerateRequest& request, const GenerateFn& generate,
                        const std::function<bool()>& client_gone, const SampleEmit& emit);

}  // namespace pdserve::router
