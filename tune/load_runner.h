// One load point against a running cluster: `pdserve bench` run as a child with the workload's
// sampler (the same program an operator benchmarks with), its per-request records read back
// from --save-detailed, and what the tuner computes from them: SLO attainment, measured
// percentiles and the TTFT's terms.
#pragma once

#include <limits>
#include <string>
#include <vector>

#include "common/status.h"
#include "tune/types.h"

namespace pdserve::tune {

struct LoadSpec {
  std::string router;  // gRPC HOST:PORT.
  int num_prompts = 100;
  int input_len = 128, output_len = 32;
  double range_ratio = 0;  // bench's --random-range-ratio: lengths uniform in len·(1±ratio).
  double rate = std::numeric_limits<double>::infinity();
  double burstiness = 1.0;  // Gamma shape of the gaps (1: Poisson).
  int max_concurrency = 0;  // 0: unlimited.
  int num_warmups = 0;
  uint64_t seed = 0;
};

// What one request measured (seconds).
struct RequestSample {
  bool ok = false;
  double start_s = 0, ttft_s = 0, e2e_s = 0;
  double tpot_s = -1;  // -1: fewer than two tokens.
  int prompt_tokens = 0, output_tokens = 0;
  double queued_s = 0, prefill_s = 0, kv_transfer_s = 0;
  std::vector<double> itl_s;
  std::string prefill_worker, decode_worker;
};

struct LoadResult {
  double duration_s = 0;
  std::vector<RequestSample> requests;
};

// `pdserve bench`'s arguments for `spec` (after the binary), always --ignore-eos and greedy.
std::vector<std::string> bench_arguments(const LoadSpec& spec, const std::string& result_file);

// The requests of a `pdserve bench --save-detailed` result.
StatusOr<LoadResult> parse_bench_result(const std::string& json_text);

// Runs the point; fails when bench cannot run (a failed request is a record, not an error).
StatusOr<LoadResult> run_load(const std::string& pdserve, const LoadSpec& spec, const std::string& work_dir,
                              const std::string& tag, double timeout_s);

// The fraction of requests that succeeded and met both SLOs (TPOT is not held against a
// one-token request).
double attainment(const std::vector<RequestSample>& requests, const Slo& slo);

// The `p`-th percentile (0..100) of a field over the successful requests.
double sample_percentile(const std::vector<RequestSample>& requests, double RequestSample::*field, double p);

// The workload's lengths in bench's terms: fixed, or uniform with one ratio for both lengths;
// InvalidArgument for what bench cannot sample.
Status apply_workload(const Workload& workload, LoadSpec* spec);

}  // namespace pdserve::tune
