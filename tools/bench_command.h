// `pdserve bench`: load-tests a running router the way `vllm bench serve` does — random or
// fixed prompt/output lengths, a concurrency cap or a Poisson/gamma arrival rate, warm-ups —
// and reports throughput and TTFT/TPOT/ITL/E2EL statistics (table on stdout, JSON file).
// The statistics are pure functions so their arithmetic is table-tested.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/percentile.h"

namespace pdserve::tools {

// Adds the subcommand to `app`; its callback sets `*exit_code`.
void add_bench_command(CLI::App& app, int* exit_code);

// What one benchmark request measured.
struct RequestRecord {
  bool ok = false;
  std::string error;
  int prompt_tokens = 0;
  int output_tokens = 0;
  double start_s = 0;  // Sent at this offset from the benchmark's start.
  double ttft_s = 0;
  double e2e_s = 0;
  std::vector<double> itl_s;  // Gaps between consecutive token-carrying messages.
  std::vector<int> tokens;    // The streamed token ids (checked with --verify-model).
  int migrations = 0;         // The router's count, from the final message.
  std::string request_id;     // The router's id for it (to find it in the router's log).
  absl::StatusCode code = absl::StatusCode::kOk;
  int retries = 0;  // Earlier attempts that failed UNAVAILABLE and were sent again.
  bool abandoned = false;  // Cancelled by the client on purpose (bench --abort-fraction).
  // The router's timings of the request, from the final message (proto Timings).
  double server_queued_s = 0, server_prefill_s = 0, server_kv_transfer_s = 0;
  // The workers that served it, from the final message (empty through --worker).
  std::string prefill_worker, decode_worker;
  int cached_tokens = 0;  // Prompt tokens the serving worker's prefix cache held.
  // P/D (proto Timings, of the last placement): prompt tokens the decode worker's own cache
  // held, the prompt blocks moved to it, and whether it prefilled the prompt itself.
  int decode_cached_tokens = 0, transferred_blocks = 0;
  bool decode_local_prefill = false;
};

// The statistics' percentile (common/percentile.h).
using ::pdserve::percentile;

// Arrival offsets (seconds from the start) of `n` requests at `rate` per second; gaps are
// gamma-distributed with shape `burstiness` (1: Poisson), mean 1/rate. Infinite rate: all 0.
std::vector<double> arrival_times(int n, double rate, double burstiness, uint64_t seed);

// The result object: counts, throughputs, the most requests seen in flight at once, the
// prompt tokens cached on either side, the KV blocks moved and the prompts the decode worker
// prefilled itself (completed requests), and, for
// ttft/tpot/itl/e2el, mean_/median_/std_/pXX_ values in milliseconds (vLLM's key names).
nlohmann::json summarize(const std::vector<RequestRecord>& records, double duration_s,
                         const std::vector<double>& percentiles);

// --save-detailed: one object per record, in send order, with what it measured (seconds) and
// which workers served it, so that SLO attainment and which (prefill, decode) pairs served can
// be computed afterwards (`pdserve tune`). tpot_s is null for fewer than 2 output tokens.
nlohmann::json request_details(const std::vector<RequestRecord>& records);

}  // namespace pdserve::tools
