// The tuner's per-topology correctness gate (docs/tune.md §6.5). Before any timing, a topology
// started by `pdserve up` must serve the golden prompt set exactly as the in-process aggregated
// TP1 engine does: every prompt through the router, concurrently, in rounds until every
// (prefill, decode) pair of the topology has served one (proven from the final responses'
// prefill_worker / decode_worker), every output compared with the reference under the policy,
// no request failed, and after the drain every worker's KV blocks free again. It talks to an
// already running router and workers by address; starting and stopping them is the caller's.
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/status.h"
#include "tune/gate_checks.h"
#include "tune/golden_prompts.h"

namespace pdserve::tune {

// The reference: `prompts` greedy on the in-process aggregated TP1 engine over the model at
// `model_path`, run as one batch (on the CPU backend the greedy output is batch-invariant).
StatusOr<Reference> compute_reference(const std::string& model_path, const std::vector<GoldenPrompt>& prompts);

struct GateOptions {
  std::string router;                // Its gRPC HOST:PORT.
  std::vector<std::string> workers;  // Every worker's gRPC HOST:PORT, as the router knows them.
  GatePolicy policy = GatePolicy::kExact;
  int prefix_tokens = 16;  // kPrefix: the tokens that must match.
  // n_p·n_d (or n_a, aggregated): the pairs `workers` must make, so that a worker left out of the
  // list is an error rather than a pair never looked for; 0: not checked.
  int expected_pairs = 0;
  int max_rounds = 8;  // Rounds of the whole set before an unseen pair fails the gate.
  Duration connect_timeout = std::chrono::seconds(10);
  Duration request_timeout = std::chrono::seconds(120);  // One request, streamed to the end.
  Duration drain_timeout = std::chrono::seconds(30);     // For each worker's blocks to come back.
  const Clock* clock = &RealClock::instance();
  // Between two Info polls of a draining worker; empty: sleep 50 ms.
  std::function<void()> pause;
};

struct GateResult {
  bool pass = false;
  std::string reason;  // Why it failed (the first failure found); empty when it passed.
  int prompts = 0;     // Requests sent, over all rounds.
  int rounds = 0;
  std::set<WorkerPair> pairs_seen;
  std::optional<Divergence> divergence;
  int failed_requests = 0;
  std::map<std::string, int> leaked_blocks;  // Worker → blocks still in use after the drain.
};

// Runs the gate over `prompts` against `reference` (indexed like them). A gate verdict, pass
// or fail, is a GateResult; an error status means the gate could not run (the router or a
// worker did not answer, the workers do not make `expected_pairs` pairs, no prompts).
StatusOr<GateResult> run_gate(const GateOptions& options, const std::vector<GoldenPrompt>& prompts,
                              const Reference& reference);

}  // namespace pdserve::tune
