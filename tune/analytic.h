// The analytic predictor: a topology's latencies, attainment and utilizations at one arrival
// rate from the closed forms (tune/queue_model.h, tune/decode_model.h), in microseconds per
// candidate so the search can rank tens of thousands; and goodput, the largest rate whose
// attainment meets the SLO, by a deterministic bisection over any predictor (this one or the
// DES, tune/sim.h). research/tune.md §6.4.
//
// P/D (per prefill worker λ/n_p, per decode worker λ/n_d; the router's fewest-queued-tokens
// placement is at least as good as this even split, so the waits are upper estimates):
//   TTFT = router wait (0: the closed forms do not model router admission; the DES does)
//        + W_q (Kingman; P-K for Poisson) + S (chunked prefill) + router_overhead_s;
//   TPOT = T_d(B) + (E[T_kv] + handoff_s)/E[OSL − 1], B the decode fixed point.
// Aggregated (per worker λ/n_d, one engine doing both): every step carries the B running
// decodes, and a prompt in progress adds a chunk of C = max_batch_tokens − B tokens. A mixed
// step is modelled as T_d(B, ΣK) + (T_p(C) − T_p.a), the prefill's fixed cost being shared with
// the decode step; a step carries decodes with probability π = 1 − e^−B (Poisson occupancy),
// so a prompt's service is S(l) = Σ_chunks T_p(c) + ⌈l/C⌉·π·(T_d(B) − T_p.a). The prefill share
// of the engine's time is ρ = λ·E[S]; the decode-only steps fill the rest, so a decoding
// sequence sees a mean step of T_step = 1/(λ·E[⌈l/C⌉] + (1 − ρ)/T_d(B)), and
// B = λ·E[OSL − 1]·T_step(B). TTFT = W_q + S + router_overhead_s; TPOT = T_step(B).
//
// Quantiles: TTFT_q = W_q,q (the exponential tail, WaitTail) + the q quantile of S + overhead;
// TPOT_q = TPOT at B_q, the q quantile of Poisson(B). Attainment = P(TTFT ≤ slo) · P(TPOT ≤
// slo), taking the two as independent: the first averages the tail's CDF over the prompt
// lengths, the second is P(Poisson(B) ≤ the largest batch whose TPOT meets the SLO). A rate
// where a queue grows without bound (ρ ≥ 1, or the decode demand exceeds its slot or KV
// limit) is unstable: its latencies are +inf and its attainment 0.
#pragma once

#include <functional>

#include "common/status.h"
#include "tune/types.h"

namespace pdserve::tune {

// NotFound when the profile lacks a TP size the topology uses, or (P/D) the KV law of its
// (tp_p, tp_d, mode); InvalidArgument for an empty topology or length distribution.
StatusOr<Prediction> predict_analytic(const Profile& profile, const Topology& topology, const Workload& workload,
                                      const Slo& slo, double rate);

// A model of one topology at a rate (predict_analytic, or the DES, bound to its inputs).
using Predictor = std::function<StatusOr<Prediction>(double rate)>;

struct GoodputSearch {
  double initial_rate = 1;  // Where the bracket search starts, requests per second.
  double rel_tol = 1e-3;    // Stop when hi − lo ≤ rel_tol·lo.
  int max_steps = 60;       // Doublings (or halvings) allowed while bracketing.
};

// The largest rate whose attainment is at least slo.attainment. Brackets from initial_rate by
// doubling while the rate passes (halving while it fails; 0 when it still fails after
// max_steps halvings: the SLO is out of reach even unloaded), then bisects to rel_tol and
// returns the passing end. Deterministic when the predictor is. FailedPrecondition when every
// doubling passes (no load breaks the SLO, e.g. a zero-cost profile).
StatusOr<double> goodput(const Predictor& predictor, const Slo& slo, const GoodputSearch& search = {});

// What a first token costs beyond the prefill's compute on this topology: the P/D overhead
// (which includes the decode side's Reserve) when the profile measured one, else the router's.
double first_token_overhead(const Profile& profile, const Topology& topology);

// The profile of TP size `tp`, and the KV law of a topology's (tp_p, tp_d, mode); NotFound.
StatusOr<const TpProfile*> find_tp(const Profile& profile, int tp);
StatusOr<KvLaw> find_kv_law(const Profile& profile, const Topology& topology);

}  // namespace pdserve::tune
