// The router's Prometheus metrics, named after vLLM's so existing dashboards read them:
// latency histograms (TTFT, TPOT, end to end), request gauges, per-worker KV cache usage and
// load, and KV transfer volume and time per prefill→decode pair. The text exposition is built
// by small pure formatting functions (table-tested); RouterMetrics holds the live values.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace pdserve::router {

using Labels = std::vector<std::pair<std::string, std::string>>;

struct Histogram {
  explicit Histogram(std::vector<double> bounds);
  void observe(double value);

  std::vector<double> bounds;    // Upper bounds, ascending; +Inf is implicit.
  std::vector<uint64_t> counts;  // Per bucket (not cumulative), bounds.size() + 1 of them.
  double sum = 0;
  uint64_t count = 0;
};

// `{a="x",b="y"}` with Prometheus escaping of \, " and newlines; "" for no labels.
std::string format_labels(const Labels& labels);
// A number as Prometheus writes it: "+Inf", "NaN", integers without a fraction.
std::string format_value(double value);
// `# HELP` and `# TYPE` lines.
void append_header(std::string& out, const std::string& name, const std::string& help, const std::string& type);
// One sample line.
void append_sample(std::string& out, const std::string& name, const Labels& labels, double value);
// A histogram's cumulative `_bucket{le=...}` lines, `_sum` and `_count`.
void append_histogram(std::string& out, const std::string& name, const Labels& labels, const Histogram& h);

// A worker's state as the registry last saw it, for the per-worker gauges.
struct WorkerGauges {
  std::string worker;  // Address.
  std::string role;    // "prefill", "decode" or "aggregated".
  bool up = false;
  int num_blocks = 0;
  int free_blocks = 0;
  int running = 0;
  int waiting = 0;
  int64_t queued_prefill_tokens = 0;
  std::string backend;    // "cpu", "cuda:0", ... (empty until the worker answered).
  std::string kv_memory;  // "host", "staged", or empty (no kvtransfer).
  uint64_t kv_staged_to_host_bytes = 0;
  uint64_t kv_staged_to_device_bytes = 0;
  // The worker's kvtransfer counters (WorkerInfo.kv_transfer_*); all 0 without kvtransfer.
  uint64_t kv_transfer_requests = 0, kv_transfer_bytes = 0, kv_transfer_failures = 0;
  uint64_t kv_transfer_leases_expired = 0, kv_transfer_refused = 0;
  double kv_transfer_seconds = 0;
  uint64_t preemptions = 0;  // WorkerInfo.preemptions_total.
  uint64_t host_copies = 0, host_copy_fallbacks = 0;  // WorkerInfo.host_copies_total, ..._fallbacks_total.
  double transfer_held_block_seconds = 0;  // WorkerInfo.transfer_held_block_seconds_total.
  // A KV cache tier below the device's (WorkerInfo.host_tier, .disk_tier).
  struct Tier {
    bool present = false;
    int blocks = 0, free_blocks = 0, cached_blocks = 0;  // free_blocks: host only.
    uint64_t hit_tokens = 0, stored_blocks = 0, loaded_blocks = 0;
    uint64_t bytes = 0, dropped_blocks = 0, evicted_blocks = 0, corrupt_files = 0;  // Disk only.
    double load_seconds = 0;      // Disk and peer.
    uint64_t load_timeouts = 0;   // Disk and peer.
    uint64_t pending_loads = 0;   // Disk only.
    // Peer only: reads that failed or were dropped (a stamp no longer held); leases served.
    uint64_t failed_loads = 0, stale_loads = 0, leases = 0, leased_blocks = 0;
  };
  Tier host, disk, peer;
};

// Thread-safe live metrics of one router.
class RouterMetrics {
 public:
  RouterMetrics();

  // Records a finished request. `tpot_s` < 0 when it produced fewer than two tokens.
  void observe_request(const std::string& finish_reason, double ttft_s, double tpot_s, double e2e_s,
                       int prompt_tokens, int generation_tokens);
  // Records one KV cache transfer between two workers.
  void observe_kv_transfer(const std::string& prefill, const std::string& decode, uint64_t bytes, double seconds);
  // Counts a request that ended with an error status (by gRPC code name).
  void count_failure(const std::string& code);
  // Counts a request placed again after its workers failed: `after_first_token` when the client
  // already had tokens (the stream went on from them).
  void count_migration(bool after_first_token);
  // Counts a P/D placement prefilled on its decode worker (RouterOptions::local_prefill_tokens).
  void count_decode_local_prefill();

  // The whole exposition: these metrics plus the given gauges.
  std::string render(int running, int waiting, const std::vector<WorkerGauges>& workers) const;

 private:
  struct Transfer {
    uint64_t bytes = 0;
    Histogram seconds;
  };
  mutable std::mutex mu_;
  Histogram ttft_, tpot_, e2e_;
  std::map<std::string, uint64_t> success_;  // By finish reason.
  std::map<std::string, uint64_t> failures_;  // By status code.
  uint64_t migrations_before_first_token_ = 0, migrations_mid_stream_ = 0;
  uint64_t decode_local_prefills_ = 0;
  uint64_t prompt_tokens_ = 0;
  uint64_t generation_tokens_ = 0;
  std::map<std::pair<std::string, std::string>, Transfer> transfers_;
};

}  // namespace pdserve::router
