// Stage 4 of `pdserve tune`: a predicted topology brought up and measured. The cluster is
// started with `pdserve up`, gated (correct tokens on every pair, no leaked block) before any
// timing, then loaded with `pdserve bench` at multiples of the predicted goodput (the 1.0
// point twice, for the run-to-run noise); the measured goodput is where the attainment margin
// crosses zero, interpolated between the points that bracket it.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "common/status.h"
#include "tune/load_runner.h"
#include "tune/local_cluster.h"
#include "tune/step_slowdown.h"
#include "tune/types.h"

namespace pdserve::tune {

struct ValidateOptions {
  ClusterOptions cluster;
  Workload workload;
  Slo slo;
  std::vector<double> loads = {0.8, 1.0, 1.0, 1.2};  // × the predicted goodput.
  double point_duration_s = 20;
  int min_requests = 150, max_requests = 4000;
  int extra_points = 2;  // Tried beyond the loads when none brackets the crossing.
  // The profile the prediction came from: each point's step slowdown is measured against its
  // laws (none without it).
  const Profile* profile = nullptr;
};

struct MeasuredPoint {
  double factor = 0, rate = 0;
  int requests = 0, failed = 0;
  double attainment = 0;
  double ttft_p50_s = 0, ttft_pq_s = 0, tpot_p50_s = 0, tpot_pq_s = 0;
  // Means of the TTFT's terms: router queue, prefill (worker-side, queue and compute), the KV
  // transfer the decode side reported, and the rest of the first token (RPCs, router).
  double queued_s = 0, prefill_s = 0, kv_transfer_s = 0, overhead_s = 0;
  Prediction predicted;  // The model's, at this rate.
  // The workers' steps during the point against the profile's laws (tune/step_slowdown.h).
  StepSlowdown slowdown;
};

// The gate's verdict on a running cluster (the tuner passes tune/gate's).
struct GateVerdict {
  bool pass = false;
  std::string detail;  // Pairs covered, or the first divergence, or the leak.
};

struct Validation {
  Topology topology;
  std::string label;  // Why it was validated: "rank 1", "best aggregated", "dynamo pick", ...
  double predicted_goodput = 0;
  bool gate_run = false;
  GateVerdict gate;
  std::vector<MeasuredPoint> points;
  double measured_goodput = -1;  // -1: not measured.
  // The crossing was not bracketed: measured_goodput is a bound (below the lowest point's rate
  // or above the highest's).
  bool measured_is_bound = false;
  double noise = 0;  // |Δ attainment| between the two runs at the same load.
  std::string error;
};

using PredictAtFn = std::function<StatusOr<Prediction>(const Topology&, double rate)>;
using GateFn = std::function<StatusOr<GateVerdict>(const ClusterEndpoints&, const Topology&)>;

// Measures one topology. A gate failure stops it (no timing on a wrong topology); a failure to
// start or load is recorded in Validation::error.
Validation validate_topology(const ValidateOptions& options, const Topology& topology, const std::string& label,
                             double predicted_goodput, const PredictAtFn& predict, const GateFn& gate);

// The rate where attainment − alpha crosses zero, linearly interpolated between the closest
// bracketing points (averaging points at the same rate); without a bracket, the nearest
// point's rate with *bound set. -1 without points.
double interpolate_goodput(const std::vector<MeasuredPoint>& points, double alpha, bool* bound);

// How long a point's `pdserve bench` of `num_prompts` requests at `rate`/s may run before it is
// called hung: three times its arrival span (num_prompts / rate, which min_requests makes far
// longer than point_duration_s at a low rate), and at least 120 s and 10 × point_duration_s.
double load_timeout_s(int num_prompts, double rate, double point_duration_s);

// A point's measured numbers from its requests.
MeasuredPoint measure_point(const std::vector<RequestSample>& requests, const Slo& slo);

}  // namespace pdserve::tune
