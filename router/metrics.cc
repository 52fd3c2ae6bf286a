#include "router/metrics.h"

#include <cmath>
#include <cstdio>
#include <tuple>

namespace pdserve::router {
namespace {

// vLLM's buckets, so histograms from both systems compare bucket by bucket.
const std::vector<double> kTtftBuckets = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5,
                                          0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0};
const std::vector<double> kTpotBuckets = {0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5,
                                          0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0};
const std::vector<double> kE2eBuckets = {0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0,
                                         20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0};
const std::vector<double> kTransferBuckets = {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                                              0.25, 0.5, 1.0, 2.5, 5.0, 10.0};

std::string escape_label(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\') out += "\\\\";
    else if (c == '"') out += "\\\"";
    else if (c == '\n') out += "\\n";
    else out += c;
  }
  return out;
}

}  // namespace

Histogram::Histogram(std::vector<double> b) : bounds(std::move(b)), counts(bounds.size() + 1, 0) {}

void Histogram::observe(double value) {
  size_t i = 0;
  while (i < bounds.size() && value > bounds[i]) ++i;
  ++counts[i];
  sum += value;
  ++count;
}

std::string format_labels(const Labels& labels) {
  if (labels.empty()) return "";
  std::string out = "{";
  for (size_t i = 0; i < labels.size(); ++i) {
    if (i) out += ",";
    out += labels[i].first + "=\"" + escape_label(labels[i].second) + "\"";
  }
  return out + "}";
}

std::string format_value(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  if (value == std::floor(value) && std::fabs(value) < 1e15) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.0f", value);
    return buf;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.9g", value);
  return buf;
}

void append_header(std::string& out, const std::string& name, const std::string& help, const std::string& type) {
  out += "# HELP " + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
}

void append_sample(std::string& out, const std::string& name, const Labels& labels, double value) {
  out += name + format_labels(labels) + " " + format_value(value) + "\n";
}

void append_histogram(std::string& out, const std::string& name, const Labels& labels, const Histogram& h) {
  uint64_t cumulative = 0;
  for (size_t i = 0; i <= h.bounds.size(); ++i) {
    cumulative += h.counts[i];
    Labels l = labels;
    l.emplace_back("le", i < h.bounds.size() ? format_value(h.bounds[i]) : "+Inf");
    append_sample(out, name + "_bucket", l, double(cumulative));
  }
  append_sample(out, name + "_sum", labels, h.sum);
  append_sample(out, name + "_count", labels, double(h.count));
}

RouterMetrics::RouterMetrics() : ttft_(kTtftBuckets), tpot_(kTpotBuckets), e2e_(kE2eBuckets) {}

void RouterMetrics::observe_request(const std::string& finish_reason, double ttft_s, double tpot_s, double e2e_s,
                                    int prompt_tokens, int generation_tokens) {
  std::lock_guard lock(mu_);
  if (ttft_s >= 0) ttft_.observe(ttft_s);
  if (tpot_s >= 0) tpot_.observe(tpot_s);
  e2e_.observe(e2e_s);
  ++success_[finish_reason];
  prompt_tokens_ += prompt_tokens;
  generation_tokens_ += generation_tokens;
}

void RouterMetrics::observe_kv_transfer(const std::string& prefill, const std::string& decode, uint64_t bytes,
                                        double seconds) {
  std::lock_guard lock(mu_);
  auto it = transfers_.try_emplace({prefill, decode}, Transfer{0, Histogram(kTransferBuckets)}).first;
  it->second.bytes += bytes;
  it->second.seconds.observe(seconds);
}

void RouterMetrics::count_failure(const std::string& code) {
  std::lock_guard lock(mu_);
  ++failures_[code];
}

void RouterMetrics::count_migration(bool after_first_token) {
  std::lock_guard lock(mu_);
  ++(after_first_token ? migrations_mid_stream_ : migrations_before_first_token_);
}

void RouterMetrics::count_decode_local_prefill() {
  std::lock_guard lock(mu_);
  ++decode_local_prefills_;
}

std::string RouterMetrics::render(int running, int waiting, const std::vector<WorkerGauges>& workers) const {
  std::lock_guard lock(mu_);
  std::string out;
  append_header(out, "pdserve:num_requests_running", "Requests out at the workers.", "gauge");
  append_sample(out, "pdserve:num_requests_running", {}, running);
  append_header(out, "pdserve:num_requests_waiting", "Requests waiting in the router's admission queue.", "gauge");
  append_sample(out, "pdserve:num_requests_waiting", {}, waiting);

  append_header(out, "pdserve:time_to_first_token_seconds", "Time to first token (router arrival to first token).", "histogram");
  append_histogram(out, "pdserve:time_to_first_token_seconds", {}, ttft_);
  append_header(out, "pdserve:time_per_output_token_seconds", "Mean time per output token after the first, per request.", "histogram");
  append_histogram(out, "pdserve:time_per_output_token_seconds", {}, tpot_);
  append_header(out, "pdserve:e2e_request_latency_seconds", "Request latency, arrival to finish.", "histogram");
  append_histogram(out, "pdserve:e2e_request_latency_seconds", {}, e2e_);

  append_header(out, "pdserve:request_success_total", "Finished requests by finish reason.", "counter");
  for (const auto& [reason, n] : success_) append_sample(out, "pdserve:request_success_total", {{"finished_reason", reason}}, double(n));
  append_header(out, "pdserve:request_failure_total", "Requests that ended with an error, by gRPC status code.", "counter");
  for (const auto& [code, n] : failures_) append_sample(out, "pdserve:request_failure_total", {{"code", code}}, double(n));
  append_header(out, "pdserve:request_migrations_total",
                "Requests placed again after their workers failed, died or stalled, by whether the client already had "
                "tokens.",
                "counter");
  append_sample(out, "pdserve:request_migrations_total", {{"stage", "before_first_token"}},
                double(migrations_before_first_token_));
  append_sample(out, "pdserve:request_migrations_total", {{"stage", "mid_stream"}}, double(migrations_mid_stream_));
  append_header(out, "pdserve:decode_local_prefills_total",
                "Placements whose decode worker prefilled the prompt itself (its cache lacked at most "
                "--local-prefill-tokens of it): no prefill worker, no KV transfer.",
                "counter");
  append_sample(out, "pdserve:decode_local_prefills_total", {}, double(decode_local_prefills_));
  append_header(out, "pdserve:prompt_tokens_total", "Prompt tokens of finished requests.", "counter");
  append_sample(out, "pdserve:prompt_tokens_total", {}, double(prompt_tokens_));
  append_header(out, "pdserve:generation_tokens_total", "Generated tokens of finished requests.", "counter");
  append_sample(out, "pdserve:generation_tokens_total", {}, double(generation_tokens_));

  append_header(out, "pdserve:kv_transfer_bytes_total", "KV cache bytes moved from prefill to decode workers.", "counter");
  for (const auto& [pair, t] : transfers_)
    append_sample(out, "pdserve:kv_transfer_bytes_total", {{"prefill", pair.first}, {"decode", pair.second}}, double(t.bytes));
  append_header(out, "pdserve:kv_transfer_seconds", "KV cache transfer time per request.", "histogram");
  for (const auto& [pair, t] : transfers_)
    append_histogram(out, "pdserve:kv_transfer_seconds", {{"prefill", pair.first}, {"decode", pair.second}}, t.seconds);

  struct Gauge {
    const char* name;
    const char* help;
    double (*value)(const WorkerGauges&);
  };
  const Gauge gauges[] = {
      {"pdserve:worker_up", "1 when the worker answered its last health poll.", [](const WorkerGauges& w) { return w.up ? 1.0 : 0.0; }},
      {"pdserve:kv_cache_usage_perc", "Fraction of the worker's KV cache blocks in use (0 to 1).",
       [](const WorkerGauges& w) { return w.num_blocks > 0 ? 1.0 - double(w.free_blocks) / w.num_blocks : 0.0; }},
      {"pdserve:kv_cache_free_blocks", "Free KV cache blocks on the worker.", [](const WorkerGauges& w) { return double(w.free_blocks); }},
      {"pdserve:kv_cache_total_blocks", "KV cache blocks on the worker.", [](const WorkerGauges& w) { return double(w.num_blocks); }},
      {"pdserve:worker_num_requests_running", "Sequences running on the worker.", [](const WorkerGauges& w) { return double(w.running); }},
      {"pdserve:worker_num_requests_waiting", "Sequences queued on the worker.", [](const WorkerGauges& w) { return double(w.waiting); }},
      {"pdserve:worker_queued_prefill_tokens", "Prompt tokens queued for prefill on the worker.",
       [](const WorkerGauges& w) { return double(w.queued_prefill_tokens); }},
  };
  for (const Gauge& g : gauges) {
    append_header(out, g.name, g.help, "gauge");
    for (const WorkerGauges& w : workers) append_sample(out, g.name, {{"worker", w.worker}, {"role", w.role}}, g.value(w));
  }
  append_header(out, "pdserve:worker_info",
                "1 per worker; its compute backend and where kvtransfer moves its KV (kv_memory: host, device or staged).",
                "gauge");
  for (const WorkerGauges& w : workers)
    append_sample(out, "pdserve:worker_info",
                  {{"worker", w.worker}, {"role", w.role}, {"backend", w.backend}, {"kv_memory", w.kv_memory}}, 1.0);
  // The workers' own kvtransfer counters (both sides of every transfer, per worker), beside the
  // router's per-pair kv_transfer_seconds histogram above.
  const Gauge counters[] = {
      {"pdserve:worker_kv_transfer_requests_total", "Requests whose KV the worker's kvtransfer ranks moved.",
       [](const WorkerGauges& w) { return double(w.kv_transfer_requests); }},
      {"pdserve:worker_kv_transfer_bytes_total",
       "KV bytes the worker's kvtransfer ranks moved (a push producer's puts and the writes its consumer "
       "received; a pull consumer's gets).",
       [](const WorkerGauges& w) { return double(w.kv_transfer_bytes); }},
      {"pdserve:worker_kv_transfer_failures_total", "KV transfers that failed on one of the worker's ranks.",
       [](const WorkerGauges& w) { return double(w.kv_transfer_failures); }},
      {"pdserve:worker_kv_transfer_leases_expired_total", "KV transfers whose lease expired on the worker.",
       [](const WorkerGauges& w) { return double(w.kv_transfer_leases_expired); }},
      {"pdserve:worker_kv_transfer_refused_total",
       "kvtransfer notifications and requests the worker refused (malformed, inconsistent, unknown sender).",
       [](const WorkerGauges& w) { return double(w.kv_transfer_refused); }},
      {"pdserve:worker_kv_transfer_seconds_total", "Time the worker's completed KV transfers took, summed.",
       [](const WorkerGauges& w) { return w.kv_transfer_seconds; }},
  };
  for (const Gauge& g : counters) {
    append_header(out, g.name, g.help, "counter");
    for (const WorkerGauges& w : workers) {
      if (w.kv_memory.empty()) continue;  // No kvtransfer (aggregated).
      append_sample(out, g.name, {{"worker", w.worker}, {"role", w.role}}, g.value(w));
    }
  }
  append_header(out, "pdserve:worker_preemptions_total",
                "Sequences the worker's engine preempted to make room in its KV cache (recomputed later).", "counter");
  for (const WorkerGauges& w : workers)
    append_sample(out, "pdserve:worker_preemptions_total", {{"worker", w.worker}, {"role", w.role}}, double(w.preemptions));
  append_header(out, "pdserve:worker_host_copies_total",
                "Prefill worker, pull-host: prompts copied to the host tier for the decode side to read (device blocks "
                "freed at once); outcome=fallback: read from the device because every host slot was in use.",
                "counter");
  for (const WorkerGauges& w : workers) {
    if (w.role != "prefill") continue;
    append_sample(out, "pdserve:worker_host_copies_total", {{"worker", w.worker}, {"role", w.role}, {"outcome", "copied"}},
                  double(w.host_copies));
    append_sample(out, "pdserve:worker_host_copies_total",
                  {{"worker", w.worker}, {"role", w.role}, {"outcome", "fallback"}}, double(w.host_copy_fallbacks));
  }
  append_header(out, "pdserve:worker_transfer_held_block_seconds_total",
                "Prefill worker: device KV block-seconds that finished prefills held for their transfers (from the "
                "prefill's end until the decode side had the KV; pull-host frees them at its host-tier copy).",
                "counter");
  for (const WorkerGauges& w : workers)
    if (w.role == "prefill")
      append_sample(out, "pdserve:worker_transfer_held_block_seconds_total", {{"worker", w.worker}, {"role", w.role}},
                    w.transfer_held_block_seconds);
  // The KV cache's host, filesystem and peer tiers (docs/kv_offload.md), per worker that has them.
  using Tier = WorkerGauges::Tier;
  struct TierGauge {
    const char* name;
    const char* help;
    bool host, disk, peer;  // The tiers that have it.
    double (*value)(const Tier&);
  };
  const TierGauge tier_gauges[] = {
      {"pdserve:worker_kv_tier_blocks", "Blocks the worker's host KV tier holds at most (per rank).", true, false, false,
       [](const Tier& t) { return double(t.blocks); }},
      {"pdserve:worker_kv_tier_free_blocks",
       "Blocks of the worker's host KV tier free or holding an evictable cached key (none being read).", true, false, false,
       [](const Tier& t) { return double(t.free_blocks); }},
      {"pdserve:worker_kv_tier_cached_blocks", "Blocks of the worker's KV tier holding a cached key.", true, true, false,
       [](const Tier& t) { return double(t.cached_blocks); }},
      {"pdserve:worker_kv_tier_hit_tokens_total",
       "Prompt tokens requests found in the tier (beyond the tiers above it).", true, true, false,
       [](const Tier& t) { return double(t.hit_tokens); }},
      {"pdserve:worker_kv_tier_stored_blocks_total", "Blocks copied into the tier.", true, true, false,
       [](const Tier& t) { return double(t.stored_blocks); }},
      {"pdserve:worker_kv_tier_loaded_blocks_total",
       "Blocks copied from the tier back to the device (peer: read from other workers into the host tier).", true,
       true, true,
       [](const Tier& t) { return double(t.loaded_blocks); }},
      {"pdserve:worker_kv_tier_bytes", "Bytes of the worker's filesystem tier's chunk files.", false, true, false,
       [](const Tier& t) { return double(t.bytes); }},
      {"pdserve:worker_kv_tier_dropped_blocks_total",
       "Blocks whose store the tier dropped (write queue full, or the write failed).", false, true, false,
       [](const Tier& t) { return double(t.dropped_blocks); }},
      {"pdserve:worker_kv_tier_evicted_blocks_total", "Blocks the tier evicted over its byte cap.", false, true, false,
       [](const Tier& t) { return double(t.evicted_blocks); }},
      {"pdserve:worker_kv_tier_corrupt_files_total", "Chunk files that failed a check (deleted, computed instead).",
       false, true, false, [](const Tier& t) { return double(t.corrupt_files); }},
      {"pdserve:worker_kv_tier_load_seconds_total",
       "Seconds the worker spent reading the tier (the loader's file reads; peer reads, lease to release).", false,
       true, true, [](const Tier& t) { return t.load_seconds; }},
      {"pdserve:worker_kv_tier_load_timeouts_total",
       "Loads from the tier that reached --kv-load-timeout-ms (peer: --kv-peer-read-timeout-ms); their requests "
       "computed the rest.",
       false, true, true,
       [](const Tier& t) { return double(t.load_timeouts); }},
      {"pdserve:worker_kv_tier_pending_loads_total",
       "Admissions that waited (PENDING) while the tier's files were read for them.", false, true, false,
       [](const Tier& t) { return double(t.pending_loads); }},
      {"pdserve:worker_kv_tier_failed_loads_total",
       "Peer reads that failed (refused or empty lease, no host slots, a failed transfer); computed instead.", false,
       false, true, [](const Tier& t) { return double(t.failed_loads); }},
      {"pdserve:worker_kv_tier_stale_loads_total",
       "Peer reads dropped because a block's stamp no longer held at the source after the read.", false, false, true,
       [](const Tier& t) { return double(t.stale_loads); }},
      {"pdserve:worker_kv_tier_leases_total", "Peer-tier leases the worker granted to other workers' reads.", false,
       false, true, [](const Tier& t) { return double(t.leases); }},
      {"pdserve:worker_kv_tier_leased_blocks_total", "Blocks of the peer-tier leases the worker granted.", false,
       false, true, [](const Tier& t) { return double(t.leased_blocks); }},
  };
  for (const TierGauge& g : tier_gauges) {
    append_header(out, g.name, g.help, std::string_view(g.name).ends_with("_total") ? "counter" : "gauge");
    for (const WorkerGauges& w : workers)
      for (const auto& [has, tier, label] : {std::tuple{g.host, &w.host, "host"}, std::tuple{g.disk, &w.disk, "disk"},
                                             std::tuple{g.peer, &w.peer, "peer"}})
        if (has && tier->present)
          append_sample(out, g.name, {{"worker", w.worker}, {"role", w.role}, {"tier", label}}, g.value(*tier));
  }
  append_header(out, "pdserve:kv_staged_bytes_total",
                "KV bytes a worker copied between device memory and its transfer mirror (staged kv_memory).", "counter");
  for (const WorkerGauges& w : workers) {
    if (w.kv_memory != "staged") continue;
    append_sample(out, "pdserve:kv_staged_bytes_total", {{"worker", w.worker}, {"role", w.role}, {"direction", "to_host"}},
                  double(w.kv_staged_to_host_bytes));
    append_sample(out, "pdserve:kv_staged_bytes_total",
                  {{"worker", w.worker}, {"role", w.role}, {"direction", "to_device"}}, double(w.kv_staged_to_device_bytes));
  }
  return out;
}

}  // namespace pdserve::router
