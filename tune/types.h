// The tuner's vocabulary (`pdserve tune`, docs/tune.md): the step laws a profile fits, the
// workload and SLOs a plan is made for, and the topologies it ranks. Plain structs, shared by
// the fitter, the queueing model, the discrete-event simulator, the search and the report, so
// each of those stays a set of pure functions over them.
#pragma once

#include <cstdint>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "engine/dtype.h"

namespace pdserve::tune {

// Prefill step time (seconds) of one engine step carrying `tokens` prompt tokens in total
// (DistServe's form): a + b·Σl + c·Σl². A prompt longer than the engine's per-step budget
// (max_batch_tokens) is computed in several such steps (chunks).
struct PrefillLaw {
  double a = 0, b = 0, c = 0;
  double step_seconds(double tokens) const { return a + b * tokens + c * tokens * tokens; }
};

// Decode step time (seconds) of one engine step decoding `batch` sequences whose KV holds
// `kv_tokens` tokens in all: a + b·B + c·ΣK, in two regimes split at batch `split` (B < split
// uses `lo`, else `hi`; split = +inf: one regime).
struct DecodeLaw {
  struct Regime {
    double a = 0, b = 0, c = 0;
  };
  Regime lo, hi;
  double split = std::numeric_limits<double>::infinity();
  double step_seconds(double batch, double kv_tokens) const {
    const Regime& r = batch < split ? lo : hi;
    return r.a + r.b * batch + r.c * kv_tokens;
  }
};

// KV transfer time (seconds) of a prompt of `tokens` tokens between a prefill group of TP
// tp_p and a decode group of TP tp_d in one kv mode: alpha + tokens·per_token. In push mode it
// is the part of the transfer the prefill did not hide (WorkerEvent.kv_transfer_s).
struct KvLaw {
  double alpha = 0, per_token = 0;
  double seconds(double tokens) const { return alpha + per_token * tokens; }
};

enum class KvMode { kPush, kPull };
enum class Device { kCpu, kCuda, kHip, kEmulated };

// A fit's quality on points it did not see (every 4th point held out).
struct FitError {
  int points = 0, held_out = 0;
  double median_abs_rel = 0;  // Median |predicted − measured| / measured over held-out points.
  double p90_abs_rel = 0;
};

// What one TP size of the engine measured.
struct TpProfile {
  int tp = 1;
  PrefillLaw prefill;
  DecodeLaw decode;
  FitError prefill_error, decode_error;
  // Capacity, exact from the worker's Info.
  int64_t kv_tokens = 0;  // num_blocks × block_size.
  int block_size = 16;
  int max_running = 256;
  int max_batch_tokens = 512;
  int max_context = 0;
};

struct KvPairProfile {
  int tp_p = 1, tp_d = 1;
  KvMode mode = KvMode::kPush;
  KvLaw law;
  FitError error;
};

// A reusable profile (profile.json): keyed by what it was measured on.
struct Profile {
  std::string model;         // Name as served.
  std::string model_sha256;  // Of the model's weights file(s).
  Device device = Device::kCpu;
  std::string device_model;  // CPU model name or GPU name.
  engine::DType dtype = engine::DType::kF32;     // The GEMM weights' (f32 | bf16).
  engine::DType kv_dtype = engine::DType::kF32;  // The KV cache's elements (f32 | bf16).
  engine::GemmPrecision gemm_precision = engine::GemmPrecision::kExact;  // exact | bf16 (bf16 weights).
  std::string pdserve_version;
  std::map<int, TpProfile> by_tp;
  std::vector<KvPairProfile> kv;
  // Per request, beyond the steps, in seconds, measured at c=1: the router's and RPCs' share
  // of the first token (TTFT minus the prefill's compute) through an aggregated worker and
  // through a P/D pair (which adds the decode side's Reserve), and the decode hand-off (the
  // second token's wait beyond the KV transfer and one decode step).
  double router_overhead_s = 0;
  double pd_overhead_s = 0;
  double handoff_s = 0;
};

// A length distribution: fixed, uniform on [lo, hi], or the empirical one of a trace.
struct LengthDist {
  enum class Kind { kFixed, kUniform, kEmpirical };
  Kind kind = Kind::kFixed;
  int lo = 0, hi = 0;         // kFixed: lo == hi.
  std::vector<int> samples;  // kEmpirical.
};

enum class Arrival { kPoisson, kGamma, kClosed };

struct Workload {
  LengthDist input, output;  // Prompt tokens; max_tokens (generated with ignore_eos).
  Arrival arrival = Arrival::kPoisson;
  double gamma_cv = 1.0;  // kGamma: the arrival gaps' coefficient of variation.
  int concurrency = 0;    // kClosed: clients in the loop.
  uint64_t seed = 0;
};

// Latency objectives: the `percentile` of TTFT and of TPOT within bounds, and a request is
// "good" when it meets both; goodput is the largest rate at which at least `attainment` of the
// requests are good.
struct Slo {
  double ttft_s = 1.0, tpot_s = 0.05;
  double percentile = 90;
  double attainment = 0.9;
};

// A deployment: n_p prefill workers of TP tp_p and n_d decode workers of TP tp_d in `mode`, or
// (aggregated) n_d aggregated workers of TP tp_d and no prefill workers.
struct Topology {
  bool aggregated = false;
  int n_p = 0, tp_p = 0;
  int n_d = 1, tp_d = 1;
  KvMode mode = KvMode::kPush;
  int ranks() const { return n_p * tp_p + n_d * tp_d; }
  bool operator==(const Topology&) const = default;
};

// What a model (analytic or simulated) predicts for a topology at one arrival rate.
struct Prediction {
  double rate = 0;              // Requests per second offered.
  double attainment = 0;        // Fraction of requests meeting both SLOs.
  double ttft_p50_s = 0, ttft_pq_s = 0;  // pq: at Slo::percentile.
  double tpot_p50_s = 0, tpot_pq_s = 0;
  // TTFT's terms, means in seconds: router admission wait, prefill queue, prefill compute,
  // router overhead; and the KV transfer and hand-off the decode side waits for.
  double router_wait_s = 0, prefill_wait_s = 0, prefill_s = 0, overhead_s = 0, kv_transfer_s = 0, handoff_s = 0;
  double prefill_utilization = 0;  // ρ per prefill worker (aggregated: of the mixed steps).
  double decode_batch = 0;         // Mean sequences per decode step.
  double kv_occupancy = 0;         // Reserved fraction of a decode worker's KV.
  bool stable = true;              // False when a queue grows without bound at this rate.
};

}  // namespace pdserve::tune
