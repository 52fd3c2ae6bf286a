// The tuner's queueing closed forms (docs/tune.md; research/tune.md §3.7): the mean wait of a
// single FCFS server (Pollaczek–Khinchine, Kingman, and their M/D/1 and M/M/1 cases), the
// exponential-tail wait quantile, the highest utilization a TTFT slack allows, and the service
// moments of a prefill worker over a prompt-length distribution. Pure functions, so the
// analytic predictor (tune/analytic.h) is a composition of table-tested pieces.
#pragma once

#include <utility>
#include <vector>

#include "common/status.h"
#include "tune/types.h"

namespace pdserve::tune {

// The first two moments of a service time, in seconds and seconds².
struct ServiceMoments {
  double mean = 0, second = 0;
  // R = E[S²]/(2E[S]): the mean residual service a newcomer finds in progress.
  double mean_residual() const { return mean > 0 ? second / (2 * mean) : 0; }
  // c_s² = Var(S)/E[S]².
  double cv2() const { return mean > 0 ? second / (mean * mean) - 1 : 0; }
};

// M/G/1 mean wait in queue (Pollaczek–Khinchine): λ·E[S²]/(2(1 − ρ)), ρ = λ·E[S]; +inf when
// ρ ≥ 1 (the queue grows without bound).
double pk_mean_wait(double lambda, const ServiceMoments& s);
// M/D/1 (S = d always) and M/M/1 (S exponential of mean `mean`): P-K's special cases.
double md1_mean_wait(double lambda, double d);
double mm1_mean_wait(double lambda, double mean);
// G/G/1 mean wait (Kingman): ((c_a² + c_s²)/2)·ρ/(1 − ρ)·E[S]; with c_a² = 1 it equals P-K.
double kingman_mean_wait(double lambda, const ServiceMoments& s, double arrival_cv2);

// The arrival gaps' squared coefficient of variation: Poisson 1; gamma cv². A closed loop
// (Arrival::kClosed) sends a request only when one of its clients' requests ends, which is
// smoother than Poisson and caps the queue at the concurrency; it is treated as deterministic
// arrivals (0) at the offered rate, a lower bound on the wait (the DES simulates the loop).
double arrival_cv2(const Workload& workload);

// The wait's tail, P(W > t) ≈ ρ·exp(−t(1 − ρ)/R), scaled so its mean ρR/(1 − ρ) equals
// `mean_wait` (R = mean_wait·(1 − ρ)/ρ; for P-K this is E[S²]/(2E[S])). A screening
// approximation: final figures come from the DES.
struct WaitTail {
  double rho = 0, mean_wait = 0;
  // P(W ≤ t); 0 for t < 0.
  double cdf(double t) const;
  // W_q,q = (R/(1 − ρ))·ln(ρ/(1 − q)) for q > 1 − ρ, else 0 (q in (0, 1)).
  double quantile(double q) const;
};

// The same quantile from (ρ, R) directly, as research/tune.md §3.7 writes it.
double wait_quantile(double rho, double mean_residual, double q);

// The highest prefill utilization at which the mean wait ρR/(1 − ρ) stays within `slack`
// seconds: s/(s + R); 0 when there is no slack.
double rho_max(double slack, double mean_residual);

// A length distribution as weighted points (value, probability): fixed one point, uniform every
// integer of [lo, hi] (or, past 256 values, 256 equal strata at their midpoints, so an
// expectation costs at most 256 terms), empirical each sample with weight 1/n.
// InvalidArgument for an empty or inverted distribution.
StatusOr<std::vector<std::pair<int, double>>> length_points(const LengthDist& dist);
StatusOr<double> mean_length(const LengthDist& dist);

// Seconds the prefill engine spends on one prompt of `tokens` tokens alone under a per-step
// budget of `chunk_tokens`: ⌊l/C⌋ full steps of C tokens and one of the remainder.
double prefill_service_seconds(const PrefillLaw& law, int tokens, int chunk_tokens);

// E[S] and E[S²] of prefill_service_seconds over the prompt lengths.
StatusOr<ServiceMoments> prefill_moments(const PrefillLaw& law, const LengthDist& input, int chunk_tokens);

// The `q` quantile (q in (0, 1)) of prefill_service_seconds over the prompt lengths.
StatusOr<double> prefill_service_quantile(const PrefillLaw& law, const LengthDist& input, int chunk_tokens, double q);

}  // namespace pdserve::tune
