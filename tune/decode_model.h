// The decode side of the analytic model: a decode worker's mean batch from Little's law,
// B = λ_d·E[steps]·T_d(B), under pdserve's reservation rule (a running sequence holds KV for
// prompt + max_tokens, so B·E[reservation] ≤ kv_tokens) and the engine's max_running, and the
// batch's spread (Poisson, the M/G/∞ occupancy) for TPOT's tail. research/tune.md §3.7, §6.4.
#pragma once

#include <cstdint>
#include <functional>

#include "common/status.h"

namespace pdserve::tune {

// What one decode worker is asked to carry.
struct DecodeDemand {
  double lambda = 0;             // Requests per second at this worker.
  double steps_per_request = 0;  // E[OSL − 1]: the first token comes from the prefill.
  double reservation_tokens = 0; // E[KV reserved per sequence] (prompt + max_tokens, in blocks).
  int64_t kv_tokens = 0;
  int max_running = 0;
};

enum class DecodeBound { kNone, kKv, kSlots };

struct DecodeFixedPoint {
  double batch = 0;       // Mean running sequences (time average).
  double step_s = 0;      // T_d(batch).
  double batch_max = 0;   // min(max_running, kv_tokens / reservation).
  bool feasible = true;   // False: the demand needs more than batch_max; decode queues grow.
  DecodeBound bound = DecodeBound::kNone;  // Which limit makes it infeasible.
};

// Solves B = λ·E[steps]·step_seconds(B) on [0, batch_max] by bisection (100 halvings, so the
// answer is deterministic to the last bit). step_seconds must be positive and nondecreasing in
// B; where several B solve it, the bracket's sign change at the lowest end is taken.
// InvalidArgument for a negative demand or a non-positive reservation.
StatusOr<DecodeFixedPoint> solve_decode_fixed_point(const std::function<double(double)>& step_seconds,
                                                    const DecodeDemand& demand);

// Poisson(mean): P(N ≤ k), and the least k with P(N ≤ k) ≥ q.
double poisson_cdf(double mean, int k);
int poisson_quantile(double mean, double q);

}  // namespace pdserve::tune
