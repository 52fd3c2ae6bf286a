// The correctness gate's verdicts as pure functions (docs/tune.md §6.5), so each is table-tested
// apart from the cluster: whether an output matches the reference under the gate's policy and
// where it first diverges, which (prefill, decode) worker pairs a topology has, and the drain
// wait that finds leaked KV blocks (time and the pause between polls injected).
#pragma once

#include <functional>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "common/clock.h"
#include "common/status.h"
#include "proto/worker.pb.h"
#include "tune/golden_prompts.h"

namespace pdserve::tune {

// How an output must match the reference.
enum class GatePolicy {
  kExact,   // Every token identical, and as many (CPU / FP32: the engine is deterministic).
  kPrefix,  // The first N tokens identical (bf16 GPUs: rounding may flip a later near-tie).
};

// The expected output tokens of each golden prompt, in the prompts' order.
struct Reference {
  std::vector<std::vector<int>> tokens;
};

// Where an output first breaks the policy.
struct Divergence {
  int prompt = 0;  // Index in the golden set.
  GoldenKind kind = GoldenKind::kOrdinary;
  int prompt_length = 0;
  int position = 0;   // Output token index.
  int expected = -1;  // The reference's token there; -1: the reference had ended.
  int got = -1;       // The output's token there; -1: the output had ended.
};

// The output position of the first token `got` gets wrong against `want`, or nullopt when the
// policy accepts it. kExact: any difference, a missing or an extra token included; kPrefix: a
// difference within the first min(prefix_tokens, |want|) tokens, or an output shorter than that.
std::optional<int> first_mismatch(const std::vector<int>& want, const std::vector<int>& got, GatePolicy policy,
                                  int prefix_tokens);

// The first prompt (in set order) whose output the policy refuses, and where. `outputs` and
// `reference.tokens` are indexed like `prompts`.
std::optional<Divergence> first_divergence(const std::vector<GoldenPrompt>& prompts, const Reference& reference,
                                           const std::vector<std::vector<int>>& outputs, GatePolicy policy,
                                           int prefix_tokens);

// A request's workers as its final GenerateResponse names them (the router's addresses).
using WorkerPair = std::pair<std::string, std::string>;  // (prefill_worker, decode_worker).

// One worker of the topology: the address the router knows it by, and its role.
struct TopologyWorker {
  std::string address;
  worker::Role role = worker::ROLE_AGGREGATED;
};

// Every pair a request can be served by: each prefill worker with each decode worker, and each
// aggregated worker with itself (the router names it as both).
std::set<WorkerPair> topology_pairs(const std::vector<TopologyWorker>& workers);

// A worker's KV blocks, from its Info.
struct BlockCount {
  int num_blocks = 0;
  int free_blocks = 0;
  int in_use() const { return num_blocks - free_blocks; }
};

// Reads a worker's blocks until all are free or `timeout` (on `clock`) passed, calling `pause`
// between reads; the last reading (in_use() > 0: leaked). A failed read is returned at once.
StatusOr<BlockCount> wait_for_free_blocks(const std::function<StatusOr<BlockCount>()>& read, const Clock& clock,
                                          Duration timeout, const std::function<void()>& pause);

}  // namespace pdserve::tune
