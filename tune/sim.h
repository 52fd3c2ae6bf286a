// The tuner's discrete-event simulator: a topology served request by request on virtual time
// (a FakeClock advanced to each next event, so a run is exact and repeatable, and 10⁵ requests
// take well under a second), with the router's own admission and placement decisions
// (router/policy.h: admit, pick_prefill, pick_decode, blocks_needed) taken on WorkerLoad
// snapshots of the simulated workers, and every engine step timed by the profile's fitted laws.
// It re-scores the analytic model's best candidates (research/tune.md §6.4) and gives the
// report its per-request TTFT breakdown.
//
// What is simulated (pdserve's semantics):
// - Router: at most max_running requests out at the workers, at most max_waiting waiting FCFS,
//   the rest refused at once (refused requests are not good). A running slot is held until the
//   request's last token.
// - P/D: at placement the prefill worker is pick_prefill's (fewest queued prompt tokens) and the
//   decode worker pick_decode's, whose KV for prompt + max_tokens is reserved then (a request no
//   decode worker could ever hold is refused). Ties go to the lowest index: the router's
//   least-recently-chosen order only picks among engines whose loads are equal, which the
//   timing does not tell apart. A prefill engine computes prompts FCFS in steps
//   of at most max_batch_tokens tokens (long prompts in chunks, short ones sharing a step). The
//   first token is the prefill's answer; the KV transfer (KvLaw) and Profile::handoff_s follow,
//   then the sequence waits in the decode engine until it has a slot (max_running) and its
//   reservation fits the KV; each decode step (DecodeLaw at B running, ΣK context tokens) gives
//   every running sequence one token. New work joins an engine at step boundaries.
// - Aggregated: one engine per worker admits a request (slot and reservation) on arrival, and
//   each step carries every decoding sequence (one token each) plus prompt chunks FCFS up to
//   max_batch_tokens − B; a mixed step takes DecodeLaw(B, ΣK) + PrefillLaw(C) − PrefillLaw.a
//   (tune/analytic.h's assumption, so both models share it).
// - Arrivals: Poisson or gamma(cv) gaps at `rate` from SimOptions::seed; kClosed runs
//   Workload::concurrency clients, each sending its next request when its last one ends or is
//   refused (`rate` is then ignored and Prediction::rate is the achieved throughput). Lengths are
//   drawn from the Workload's distributions with Workload::seed, so every rate and topology sees
//   the same requests. Outputs are exactly max_tokens long.
// - Measured: the requests after the first `warmup`, in arrival order. TTFT = router wait +
//   prefill wait + prefill + router_overhead_s; TPOT = (e2e − TTFT)/(output − 1) (0 for a
//   one-token output); Prediction's percentiles and means are over them (percentiles over the
//   served ones), attainment is the fraction good (both SLOs met, refused counted not good),
//   prefill_utilization the busy fraction of the prefill engines (aggregated: of time in steps
//   carrying a prompt chunk), decode_batch the time average of B over decode steps, and
//   kv_occupancy the time average of the engines' reserved fraction of KV. `stable` is false
//   when the queues grow over the run (the last quarter's mean wait is more than twice the
//   second quarter's plus one mean prefill).
#pragma once

#include <cstdint>
#include <vector>

#include "common/status.h"
#include "tune/analytic.h"
#include "tune/types.h"

namespace pdserve::tune {

struct SimOptions {
  int requests = 20000;  // In all, warmup included.
  int warmup = 1000;     // The first requests, not measured.
  uint64_t seed = 1;     // Of the arrival gaps.
  int max_running = 0;   // Router admission; 0 = unlimited.
  int max_waiting = 0;   // 0 = unlimited.
};

// One measured request, times in seconds from the run's start.
struct RequestRecord {
  double arrival_s = 0;
  int input_tokens = 0, output_tokens = 0;
  bool refused = false;  // By router admission (or no decode worker could hold it).
  bool good = false;
  double ttft_s = 0, tpot_s = 0, e2e_s = 0;
  // TTFT's terms, and what happens between the first and second tokens.
  double router_wait_s = 0, prefill_wait_s = 0, prefill_s = 0, overhead_s = 0;
  double kv_transfer_s = 0, handoff_s = 0, decode_wait_s = 0;
};

struct SimResult {
  Prediction prediction;
  std::vector<RequestRecord> requests;  // The measured ones, in arrival order.
};

// NotFound / InvalidArgument as predict_analytic, and InvalidArgument for options with no
// measured request, a non-positive open-loop rate or a closed loop without clients.
StatusOr<SimResult> simulate(const Profile& profile, const Topology& topology, const Workload& workload,
                             const Slo& slo, double rate, const SimOptions& options);

// goodput() over simulate() with these options (fixed seeds, so deterministic). InvalidArgument
// for a closed-loop workload, whose rate is not an input.
StatusOr<double> simulated_goodput(const Profile& profile, const Topology& topology, const Workload& workload,
                                   const Slo& slo, const SimOptions& options, const GoodputSearch& search = {});

}  // namespace pdserve::tune
