#include "tools/bench_command.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <functional>
#include <iostream>
#include <limits>
#include <mutex>
#include <random>
#include <semaphore>
#include <thread>

#include "absl/strings/str_join.h"
#include "engine/engine.h"
#include "engine/model_loader.h"
#include "proto/engine_sampling.h"
#include "proto/sampling_defaults.h"
#include "tools/bench_workload.h"
#include "tools/router_client.h"
#include "tools/sampling_flags.h"

namespace pdserve::tools {
namespace {

using Steady = std::chrono::steady_clock;
using nlohmann::json;

struct BenchFlags {
  std::string router;
  std::string worker;  // Instead of router: one aggregated worker, directly.
  int num_prompts = 100;
  int input_len = 128;
  int output_len = 64;
  double range_ratio = 0.0;
  int max_concurrency = 0;  // 0: unlimited.
  // Session workloads: requests in flight at most across all sessions (0: no cap). With it, many
  // sessions can be open (their histories the cache's working set) while few requests run.
  int max_inflight = 0;
  int retries = 0;          // Resends of a request that failed UNAVAILABLE.
  // The random workload: this fraction of the requests is given up by the client (its deadline
  // cancels the call) at a time uniform in (0, abort_within_ms] after sending, so aborts land at
  // every stage: queued, prefilling, in transfer, decoding.
  double abort_fraction = 0;
  int abort_within_ms = 1000;
  double request_rate = std::numeric_limits<double>::infinity();
  double burstiness = 1.0;
  bool ignore_eos = false;
  int num_warmups = 0;
  uint64_t seed = 0;
  float temperature = 0.0f;
  // The output penalties, logit bias, min_tokens, logprobs and special-token flags every
  // request carries (tools/sampling_flags.h); its other fields are unused.
  engine::SamplingParams sampling;
  std::string result_file;
  bool save_detailed = false;  // The result gains request_details' "requests".
  std::string label;
  std::vector<double> percentiles = {90, 99};
  std::string api_key;
  bool tls = false;    // --tls: the router serves TLS (system CAs).
  std::string tls_ca;  // --tls-ca: ... signed by this CA.
  std::string verify_model;  // Compare every output with this model's in-process engine.
  // --workload and its shape: session workloads' fields left -1 take the workload's default
  // (default_session_spec); --num-prompts and the random lengths are the random workload's.
  std::string workload = "random";
  SessionSpec session{-1, -1, -1, -1, -1, -1, -1, -1};
  std::string trace_file;
  int trace_block_tokens = 512;  // Mooncake's block: 512 tokens per hash id.
  double trace_speed = 1.0;
  // The workload-specific flags given on the command line (by name), so that one the
  // --workload does not read is refused rather than silently unused.
  std::vector<std::string> random_given;   // --num-prompts: the random workload's.
  std::vector<std::string> lengths_given;  // --random-*: the random workload's and every warm-up's.
  std::vector<std::string> session_given;  // multiturn's and agentic's.
  std::vector<std::string> trace_given;    // trace's.
};

// An error naming the flags given that `w` does not read (with --num-warmups the random lengths
// shape the warm-up requests of any workload).
Status check_workload_flags(const BenchFlags& f, Workload w) {
  const bool sessions = w == Workload::kMultiturn || w == Workload::kAgentic;
  const std::pair<const std::vector<std::string>*, bool> groups[] = {
      {&f.random_given, w == Workload::kRandom},
      {&f.lengths_given, w == Workload::kRandom || f.num_warmups > 0},
      {&f.session_given, sessions},
      {&f.trace_given, w == Workload::kTrace}};
  std::vector<std::string> unused;
  for (const auto& [given, read] : groups)
    if (!read) unused.insert(unused.end(), given->begin(), given->end());
  if (unused.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrJoin(unused, ", ") + (unused.size() == 1 ? " is" : " are") +
                                    " not read by --workload " + workload_name(w));
}

// The requests whose successful output differs from the in-process engine's for the same
// prompt and sampling (all of them run at once, as one batch); an error if the model will not load.
StatusOr<int> count_mismatches(const std::string& model, const std::vector<v1::GenerateRequest>& requests,
                               const std::vector<RequestRecord>& records, json* details) {
  PD_ASSIGN_OR_RETURN(engine::LoadedModel loaded, engine::load_model({model, ""}));
  PD_ASSIGN_OR_RETURN(auto eng, engine::Engine::create(std::move(loaded), {}));
  std::vector<std::vector<int>> want(requests.size());
  for (size_t i = 0; i < requests.size(); ++i) {
    if (!records[i].ok) continue;
    const v1::GenerateRequest& r = requests[i];
    // The request's own parameters, every field explicit (make_requests), as a worker reads them.
    engine::GenerationRequest g{std::to_string(i), {r.token_ids().ids().begin(), r.token_ids().ids().end()},
                                engine_sampling(r.sampling())};
    PD_RETURN_IF_ERROR(eng->add_request(std::move(g), [&want, i](const engine::TokenEvent& ev) {
      if (ev.token >= 0) want[i].push_back(ev.token);
    }));
  }
  PD_RETURN_IF_ERROR(eng->run_until_idle());
  int mismatched = 0;
  *details = json::array();
  for (size_t i = 0; i < requests.size(); ++i) {
    if (!records[i].ok || records[i].tokens == want[i]) continue;
    const std::vector<int>& got = records[i].tokens;
    size_t at = 0;
    while (at < got.size() && at < want[i].size() && got[at] == want[i][at]) ++at;
    // Everything needed to replay it, and the router's id to find it in the router's log.
    details->push_back({{"request", i},
                        {"request_id", records[i].request_id},
                        {"migrations", records[i].migrations},
                        {"differs_at", at},
                        {"prompt", std::vector<int>(requests[i].token_ids().ids().begin(),
                                                    requests[i].token_ids().ids().end())},
                        {"got", got},
                        {"want", want[i]}});
    if (mismatched++ > 0) continue;
    std::cerr << "bench: request " << i << " (" << records[i].request_id << ", prompt " << requests[i].token_ids().ids_size() << " tokens, "
              << records[i].migrations << " migrations) differs from the in-process engine at output token " << at
              << ": got " << got.size() << " tokens, want " << want[i].size() << "\n";
  }
  return mismatched;
}

double seconds_since(Steady::time_point t) { return std::chrono::duration<double>(Steady::now() - t).count(); }

// A benchmark request's sampling: the flags', `max_tokens` and `seed`.
v1::SamplingParams request_sampling(const BenchFlags& f, int max_tokens, int64_t seed) {
  engine::SamplingParams p = f.sampling;
  p.max_tokens = max_tokens;
  p.min_tokens = std::min(p.min_tokens, max_tokens);  // The lengths vary; min_tokens may not pass them.
  p.ignore_eos = f.ignore_eos;
  p.seed = seed;
  v1::SamplingParams s = wire_sampling(p);
  // Explicitly neutral, so that the model's generation_config defaults do not change what
  // --verify-model recomputes from the request's parameters.
  set_neutral_sampling(&s);
  s.set_temperature(f.temperature);
  return s;
}

v1::GenerateRequest token_request(const BenchFlags& f, const std::vector<int>& prompt, int max_tokens, int64_t seed) {
  v1::GenerateRequest r;
  for (int t : prompt) r.mutable_token_ids()->add_ids(t);
  *r.mutable_sampling() = request_sampling(f, max_tokens, seed);
  return r;
}

// Draws the benchmark's prompts: random token ids (not the special ids 0..2 nor BOS/EOS) after
// BOS, with lengths uniform in [len*(1-ratio), len*(1+ratio)], capped so prompt + output fits.
std::vector<v1::GenerateRequest> make_requests(const BenchFlags& f, const v1::ModelInfo& info, int n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  auto length = [&](int len) {
    const int lo = std::max(1, int(std::floor(len * (1 - f.range_ratio))));
    const int hi = std::max(lo, int(std::ceil(len * (1 + f.range_ratio))));
    return std::uniform_int_distribution<int>(lo, hi)(rng);
  };
  const int vocab = std::max(4, info.vocab_size());
  std::uniform_int_distribution<int> token(3, vocab - 1);
  std::vector<v1::GenerateRequest> out;
  for (int i = 0; i < n; ++i) {
    int out_len = length(f.output_len);
    int in_len = length(f.input_len);
    if (info.max_context() > 0) {
      out_len = std::min(out_len, info.max_context() - 1);
      in_len = std::max(1, std::min(in_len, info.max_context() - out_len));
    }
    v1::GenerateRequest r;
    auto* ids = r.mutable_token_ids();
    ids->add_ids(info.bos_id() >= 0 ? info.bos_id() : token(rng));
    while (ids->ids_size() < in_len) {
      int t = token(rng);
      if (t == info.bos_id() || std::find(info.eos_ids().begin(), info.eos_ids().end(), t) != info.eos_ids().end()) continue;
      ids->add_ids(t);
    }
    *r.mutable_sampling() = request_sampling(f, out_len, int64_t(seed + i));
    out.push_back(std::move(r));
  }
  return out;
}

RequestRecord run_one_attempt(RouterClient& client, const v1::GenerateRequest& req, Duration give_up) {
  RequestRecord rec;
  rec.prompt_tokens = req.token_ids().ids_size();
  const Steady::time_point t0 = Steady::now();
  Steady::time_point last = t0;
  Status s = client.generate(req, [&](const v1::GenerateResponse& r) {
    if (rec.request_id.empty()) rec.request_id = r.request_id();
    if (r.finished()) {
      rec.migrations = r.migrations();
      rec.server_queued_s = r.timings().queued_s();
      rec.server_prefill_s = r.timings().prefill_s();
      rec.server_kv_transfer_s = r.timings().kv_transfer_s();
      rec.prefill_worker = r.prefill_worker();
      rec.decode_worker = r.decode_worker();
      rec.cached_tokens = r.cached_tokens();
      rec.decode_cached_tokens = r.timings().decode_cached_tokens();
      rec.transferred_blocks = r.timings().transferred_blocks();
      rec.decode_local_prefill = r.timings().decode_local_prefill();
    }
    if (r.token_ids_size() == 0) return;
    const Steady::time_point now = Steady::now();
    if (rec.output_tokens == 0) rec.ttft_s = std::chrono::duration<double>(now - t0).count();
    else rec.itl_s.push_back(std::chrono::duration<double>(now - last).count());
    last = now;
    rec.output_tokens += r.token_ids_size();
    rec.tokens.insert(rec.tokens.end(), r.token_ids().begin(), r.token_ids().end());
  }, give_up);
  rec.e2e_s = seconds_since(t0);
  rec.ok = s.ok();
  rec.code = s.code();
  rec.abandoned = give_up > Duration::zero() && s.code() == absl::StatusCode::kDeadlineExceeded;
  if (!s.ok()) rec.error = std::string(s.message());
  return rec;
}

// Sends one request; with `retries`, one that failed UNAVAILABLE (the router gone or restarting:
// nothing of it can be trusted) is sent again from scratch, after a back-off, up to that often.
// `give_up` (> 0): the client cancels it that long after sending (see BenchFlags::abort_fraction).
RequestRecord run_one(RouterClient& client, const v1::GenerateRequest& req, int retries = 0,
                      Duration give_up = Duration::zero()) {
  auto backoff = std::chrono::milliseconds(100);
  for (int attempt = 0;; ++attempt) {
    RequestRecord rec = run_one_attempt(client, req, give_up);
    rec.retries = attempt;
    if (rec.ok || rec.code != absl::StatusCode::kUnavailable || attempt >= retries) return rec;
    std::this_thread::sleep_for(backoff);
    backoff = std::min(backoff * 2, std::chrono::milliseconds(2000));
  }
}

void progress(int done, int total) {
  const int width = 40;
  const int filled = total > 0 ? done * width / total : width;
  std::cerr << "\r[" << std::string(filled, '#') << std::string(width - filled, '.') << "] " << done << "/" << total
            << (done == total ? "\n" : "") << std::flush;
}

std::string fmt(double v, int digits = 2) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

void print_table(const json& r, const std::vector<double>& percentiles) {
  auto line = [](const std::string& name, const std::string& value) {
    std::cout << name << std::string(name.size() < 40 ? 40 - name.size() : 1, ' ') << value << "\n";
  };
  std::cout << "============ Serving Benchmark Result ============\n";
  line("Successful requests:", std::to_string(r["completed"].get<int>()));
  line("Failed requests:", std::to_string(r["failed"].get<int>()));
  if (r.value("abandoned", 0) > 0)
    line("Abandoned by the client (--abort-fraction):", std::to_string(r["abandoned"].get<int>()));
  if (r.value("retried", 0) > 0) line("Resent after UNAVAILABLE (--retries):", std::to_string(r["retried"].get<int>()));
  if (r.contains("mismatched"))
    line("Outputs unlike the in-process engine's:", std::to_string(r["mismatched"].get<int>()));
  if (r.contains("max_concurrency") && !r["max_concurrency"].is_null())
    line("Maximum request concurrency:", std::to_string(r["max_concurrency"].get<int>()));
  line("Benchmark duration (s):", fmt(r["duration"].get<double>()));
  line("Total input tokens:", std::to_string(r["total_input_tokens"].get<int64_t>()));
  line("Total generated tokens:", std::to_string(r["total_output_tokens"].get<int64_t>()));
  line("Request throughput (req/s):", fmt(r["request_throughput"].get<double>()));
  line("Output token throughput (tok/s):", fmt(r["output_throughput"].get<double>()));
  line("Total token throughput (tok/s):", fmt(r["total_token_throughput"].get<double>()));
  if (r["num_ranks"].get<int>() > 0) {
    line("Ranks serving:", std::to_string(r["num_ranks"].get<int>()));
    line("Output token throughput per rank (tok/s):", fmt(r["output_throughput_per_rank"].get<double>()));
    line("Total token throughput per rank (tok/s):", fmt(r["total_token_throughput_per_rank"].get<double>()));
  }
  const std::pair<const char*, const char*> sections[] = {
      {"ttft", "Time to First Token"}, {"tpot", "Time per Output Token (excl. 1st token)"},
      {"itl", "Inter-token Latency"}, {"e2el", "End-to-end Latency"}};
  for (const auto& [key, title] : sections) {
    const std::string t = std::string("-") + title + "-";
    const size_t pad = t.size() < 50 ? (50 - t.size()) / 2 : 0;
    std::cout << std::string(pad, '-') << t << std::string(50 - pad - std::min<size_t>(t.size(), 50), '-') << "\n";
    const std::string k = key;
    std::string upper = k;
    std::transform(upper.begin(), upper.end(), upper.begin(), ::toupper);
    line("Mean " + upper + " (ms):", fmt(r["mean_" + k + "_ms"].get<double>()));
    line("Median " + upper + " (ms):", fmt(r["median_" + k + "_ms"].get<double>()));
    for (double p : percentiles) {
      const std::string ps = fmt(p, p == std::floor(p) ? 0 : 1);
      line("P" + ps + " " + upper + " (ms):", fmt(r["p" + ps + "_" + k + "_ms"].get<double>()));
    }
  }
  const std::string mode = r.value("kv_mode", "aggregated");
  if (mode == "push" || mode == "pull" || mode == "pull-host") {
    std::cout << "-----------------KV placement (P/D)----------------\n";
    line("Prompt tokens cached (all / decode side):", std::to_string(r["total_cached_tokens"].get<int64_t>()) + " / " +
                                                       std::to_string(r["total_decode_cached_tokens"].get<int64_t>()));
    line("KV blocks transferred (total / per req):", std::to_string(r["total_transferred_blocks"].get<int64_t>()) + " / " +
                                                      fmt(r["mean_transferred_blocks"].get<double>()));
    line("Prefilled on the decode worker:", std::to_string(r["decode_local_prefills"].get<int>()) + " of " +
                                                std::to_string(r["completed"].get<int>()));
  }
  std::cout << "-------Server timings (router, per request)-------\n";
  const std::pair<const char*, const char*> server[] = {{"queued", "queued (admission to placement)"},
                                                        {"prefill", "prefill (worker compute)"},
                                                        {"kv_transfer", "KV transfer"},
                                                        {"ttft_outside_prefill", "TTFT minus prefill"}};
  for (const auto& [key, title] : server) {
    const std::string k = key;
    line(std::string("Mean/median ") + title + " (ms):",
         fmt(r["mean_" + k + "_ms"].get<double>()) + " / " + fmt(r["median_" + k + "_ms"].get<double>()));
  }
  std::cout << "==================================================" << std::endl;
}

// What one run sent and measured, in send order; `turns` only for session and trace workloads.
struct RunRecords {
  std::vector<v1::GenerateRequest> requests;
  std::vector<RequestRecord> records;
  std::vector<TurnRecord> turns;
  double duration_s = 0;
};

// The progress bar of `total` units, advanced from any thread.
class Progress {
 public:
  explicit Progress(int total) : total_(total) { progress(0, total_); }
  void tick() {
    std::lock_guard lock(mu_);
    progress(++done_, total_);
  }
  // Fills the bar (a session workload that ended sessions early sends fewer turns).
  void finish() {
    std::lock_guard lock(mu_);
    if (done_ < total_) progress(total_, total_);
  }

 private:
  std::mutex mu_;
  int done_ = 0;
  const int total_;
};

// The dispatch every workload shares: unit i starts at `arrivals[i]` seconds after `start`,
// once one of `max_concurrency` slots is free (0: no cap), on a thread of its own that holds
// the slot until it returns. `launch(i, offset)` runs on the dispatching thread, in arrival
// order (what must see the sends in order, like the oracle, goes there), and returns the
// unit's work. Returns when every unit's work did.
void run_at_arrivals(const std::vector<double>& arrivals, int max_concurrency, Steady::time_point start,
                     const std::function<std::function<void()>(size_t i, double offset_s)>& launch) {
  std::counting_semaphore<> slots(max_concurrency > 0 ? max_concurrency : std::max<int>(1, int(arrivals.size())));
  std::vector<std::thread> threads;
  for (size_t i = 0; i < arrivals.size(); ++i) {
    std::this_thread::sleep_until(start + std::chrono::duration_cast<Steady::duration>(std::chrono::duration<double>(arrivals[i])));
    slots.acquire();
    threads.emplace_back([&slots, work = launch(i, seconds_since(start))] {
      work();
      slots.release();
    });
  }
  for (std::thread& t : threads) t.join();
}

// The random workload: `requests` at their arrival times, at most --max-concurrency at once.
RunRecords run_random(const BenchFlags& f, RouterClient& client, const v1::ModelInfo& info) {
  RunRecords run;
  run.requests = make_requests(f, info, f.num_prompts, f.seed);
  run.records.resize(run.requests.size());
  // Which requests the client gives up on, and when (their own stream, so that the prompts stay
  // those of the same seed without aborts).
  std::vector<Duration> give_up(run.requests.size(), Duration::zero());
  std::mt19937_64 abort_rng(f.seed ^ 0xab0a7ull);
  for (Duration& d : give_up)
    if (std::uniform_real_distribution<double>(0, 1)(abort_rng) < f.abort_fraction)
      d = std::chrono::milliseconds(std::uniform_int_distribution<int>(1, f.abort_within_ms)(abort_rng));
  Progress bar(int(run.requests.size()));
  const Steady::time_point start = Steady::now();
  run_at_arrivals(arrival_times(f.num_prompts, f.request_rate, f.burstiness, f.seed), f.max_concurrency, start,
                  [&](size_t i, double offset) {
                    return [&, i, offset] {
                      run.records[i] = run_one(client, run.requests[i], f.retries, give_up[i]);
                      run.records[i].start_s = offset;
                      bar.tick();
                    };
                  });
  run.duration_s = seconds_since(start);
  return run;
}

TokenRange token_range(const v1::ModelInfo& info) {
  TokenRange range{std::max(4, info.vocab_size()), {info.eos_ids().begin(), info.eos_ids().end()}};
  range.avoid.push_back(info.bos_id());
  return range;
}

// The shape a session workload runs: its defaults, overridden by the flags given.
SessionSpec session_spec(const BenchFlags& f, Workload w) {
  SessionSpec s = default_session_spec(w);
  const SessionSpec& o = f.session;
  for (auto [flag, field] : {std::pair{o.sessions, &s.sessions}, {o.turns, &s.turns}, {o.shared_prefixes, &s.shared_prefixes},
                             {o.prefix_len, &s.prefix_len}, {o.turn_len, &s.turn_len}, {o.output_len, &s.output_len},
                             {o.fanout, &s.fanout}})
    if (flag >= 0) *field = flag;
  if (o.think_time_s >= 0) s.think_time_s = o.think_time_s;
  return s;
}

// Multi-turn and agentic sessions: each session starts at its arrival time (at most
// --max-concurrency sessions at once) and sends its turns one after the other, each turn's
// prompt the last prompt, the first sibling's output and the turn's new tokens; a turn's
// siblings go out together. A session ends early when its next turn would not fit the context,
// or when a turn failed.
RunRecords run_sessions(const BenchFlags& f, const SessionSpec& spec, RouterClient& client, const v1::ModelInfo& info,
                        int block_size) {
  const SessionTokens tokens(spec, token_range(info), f.seed);
  ReuseOracle oracle(block_size);
  RunRecords run;
  std::mutex mu;  // Guards run's vectors.
  Progress bar(spec.sessions * spec.turns * spec.fanout);
  std::counting_semaphore<> inflight(f.max_inflight > 0 ? f.max_inflight : std::max(1, spec.sessions * spec.fanout));
  const Steady::time_point start = Steady::now();
  auto session = [&](int s) {
    std::vector<int> history = tokens.prefix(s);
    for (int t = 0; t < spec.turns; ++t) {
      std::vector<int> prompt = history;
      const std::vector<int> added = tokens.turn(s, t);
      prompt.insert(prompt.end(), added.begin(), added.end());
      if (info.max_context() > 0 && int(prompt.size()) + spec.output_len > info.max_context()) break;
      std::vector<RequestRecord> siblings(size_t(spec.fanout));
      std::vector<v1::GenerateRequest> sent(size_t(spec.fanout));
      std::vector<int> reusable(size_t(spec.fanout));
      std::vector<std::thread> threads;
      for (int k = 0; k < spec.fanout; ++k) {
        const int64_t seed = int64_t(f.seed) + (int64_t(s) * spec.turns + t) * spec.fanout + k;
        sent[size_t(k)] = token_request(f, prompt, spec.output_len, seed);
        reusable[size_t(k)] = oracle.on_send(prompt);
        threads.emplace_back([&, k] {
          inflight.acquire();  // The wait for a slot is not the request's: TTFT starts after it.
          const double offset = seconds_since(start);
          siblings[size_t(k)] = run_one(client, sent[size_t(k)], f.retries);
          siblings[size_t(k)].start_s = offset;
          inflight.release();
        });
      }
      for (std::thread& th : threads) th.join();
      bool failed = false;
      for (int k = 0; k < spec.fanout; ++k) {
        const RequestRecord& r = siblings[size_t(k)];
        failed |= !r.ok;
        std::vector<int> sequence = prompt;
        sequence.insert(sequence.end(), r.tokens.begin(), r.tokens.end());
        if (r.ok) oracle.on_end(sequence);
        {
          std::lock_guard lock(mu);
          run.requests.push_back(sent[size_t(k)]);
          run.records.push_back(r);
          run.turns.push_back({t, r.ok, r.ttft_s, r.prompt_tokens, r.cached_tokens, reusable[size_t(k)]});
        }
        bar.tick();
      }
      if (failed) break;
      history = prompt;
      history.insert(history.end(), siblings[0].tokens.begin(), siblings[0].tokens.end());
      if (spec.think_time_s > 0 && t + 1 < spec.turns)
        std::this_thread::sleep_for(std::chrono::duration<double>(spec.think_time_s));
    }
  };
  run_at_arrivals(arrival_times(spec.sessions, f.request_rate, f.burstiness, f.seed), f.max_concurrency, start,
                  [&](size_t s, double) { return [&session, s] { session(int(s)); }; });
  bar.finish();
  run.duration_s = seconds_since(start);
  return run;
}

// A Mooncake trace: every request at its (rescaled) timestamp, at most --max-concurrency at once.
RunRecords run_trace(const BenchFlags& f, const std::vector<TraceRequest>& trace, RouterClient& client, int block_size) {
  ReuseOracle oracle(block_size);
  RunRecords run;
  run.records.resize(trace.size());
  run.turns.resize(trace.size());
  std::vector<double> arrivals;
  for (size_t i = 0; i < trace.size(); ++i) {
    run.requests.push_back(token_request(f, trace[i].prompt, trace[i].output_len, int64_t(f.seed + i)));
    arrivals.push_back(trace[i].arrival_s);
  }
  Progress bar(int(trace.size()));
  const Steady::time_point start = Steady::now();
  run_at_arrivals(arrivals, f.max_concurrency, start, [&](size_t i, double offset) {
    const int reusable = oracle.on_send(trace[i].prompt);  // In send order.
    return [&, i, offset, reusable] {
      RequestRecord r = run_one(client, run.requests[i], f.retries);
      r.start_s = offset;
      std::vector<int> sequence = trace[i].prompt;
      sequence.insert(sequence.end(), r.tokens.begin(), r.tokens.end());
      if (r.ok) oracle.on_end(sequence);
      run.turns[i] = {0, r.ok, r.ttft_s, r.prompt_tokens, r.cached_tokens, reusable};
      run.records[i] = std::move(r);
      bar.tick();
    };
  });
  run.duration_s = seconds_since(start);
  return run;
}

json session_json(const SessionSummary& s, bool by_turn) {
  json j = {{"hit_rate", s.hit_rate},
            {"oracle_hit_rate", s.oracle_hit_rate},
            {"hit_efficiency", s.oracle_hit_rate > 0 ? json(s.hit_efficiency) : json(nullptr)}};
  if (by_turn) {
    j["turn1"] = {{"requests", s.turn1_requests},
                  {"median_ttft_ms", s.turn1_ttft_p50_ms},
                  {"p90_ttft_ms", s.turn1_ttft_p90_ms},
                  {"hit_rate", s.turn1_hit_rate}};
    j["turn2plus"] = {{"requests", s.later_requests},
                      {"median_ttft_ms", s.later_ttft_p50_ms},
                      {"p90_ttft_ms", s.later_ttft_p90_ms},
                      {"hit_rate", s.later_hit_rate}};
  }
  return j;
}

void print_reuse(const json& r) {
  auto line = [](const std::string& name, const std::string& value) {
    std::cout << name << std::string(name.size() < 40 ? 40 - name.size() : 1, ' ') << value << "\n";
  };
  std::cout << "------------------Prefix reuse-------------------\n";
  line("Cached prompt tokens (server):", fmt(100 * r["hit_rate"].get<double>(), 1) + " %");
  line("Reusable prompt tokens (oracle):", fmt(100 * r["oracle_hit_rate"].get<double>(), 1) + " %");
  if (!r["hit_efficiency"].is_null()) line("Hit efficiency (server / oracle):", fmt(r["hit_efficiency"].get<double>(), 3));
  for (const char* bucket : {"turn1", "turn2plus"}) {
    if (!r.contains(bucket)) continue;
    const json& b = r[bucket];
    const std::string name = std::string(bucket) == "turn1" ? "turn 1" : "turns >= 2";
    line("Median / P90 TTFT, " + name + " (ms):",
         fmt(b["median_ttft_ms"].get<double>()) + " / " + fmt(b["p90_ttft_ms"].get<double>()) + "  (" +
             std::to_string(b["requests"].get<int>()) + " req, " + fmt(100 * b["hit_rate"].get<double>(), 1) +
             " % cached)");
  }
}

int run_bench(const BenchFlags& f) {
  if (f.router.empty() == f.worker.empty()) {
    std::cerr << "error: give --router, or --worker to bypass the router\n";
    return 2;
  }
  auto workload = parse_workload(f.workload);
  if (!workload.ok()) {
    std::cerr << "error: " << workload.status().message() << "\n";
    return 2;
  }
  if (Status flags = check_workload_flags(f, *workload); !flags.ok()) {
    std::cerr << "error: " << flags.message() << "\n";
    return 2;
  }
  const auto& given = f.random_given;
  if (f.abort_fraction == 0 && std::find(given.begin(), given.end(), "--abort-within-ms") != given.end()) {
    std::cerr << "error: --abort-within-ms times the aborts of --abort-fraction: give a fraction above 0\n";
    return 2;
  }
  auto tls = load_client_tls(f.tls, f.tls_ca);
  if (!tls.ok()) {
    std::cerr << "error: " << tls.status().message() << "\n";
    return 2;
  }
  auto connected = connect_and_describe(f.router, f.worker, api_key_or_env(f.api_key), *tls);
  if (!connected.ok()) {
    std::cerr << "error: " << connected.status().message() << "\n";
    return 1;
  }
  RouterClient* client = connected->client.get();
  const v1::ModelInfo* info = &connected->model;
  if (f.num_prompts <= 0 || f.input_len <= 0 || f.output_len <= 0 || f.range_ratio < 0 || f.range_ratio >= 1 ||
      f.burstiness <= 0 || !(f.request_rate > 0) || !(f.abort_fraction >= 0 && f.abort_fraction <= 1) ||
      f.abort_within_ms <= 0) {
    std::cerr << "error: need --num-prompts, --random-input-len, --random-output-len > 0, --random-range-ratio in "
                 "[0, 1), --burstiness > 0, --request-rate > 0, --abort-fraction in [0, 1], --abort-within-ms > 0\n";
    return 2;
  }
  const SessionSpec spec = session_spec(f, *workload);
  const bool sessions = *workload == Workload::kMultiturn || *workload == Workload::kAgentic;
  if (sessions && (spec.sessions <= 0 || spec.turns <= 0 || spec.shared_prefixes <= 0 || spec.prefix_len < 0 ||
                   spec.turn_len <= 0 || spec.output_len <= 0 || spec.fanout <= 0 || spec.fanout > 16 ||
                   f.max_inflight < 0)) {
    std::cerr << "error: need --sessions, --turns, --shared-prefixes, --turn-len, --turn-output-len > 0, "
                 "--prefix-len, --max-inflight >= 0 and --fanout in 1..16\n";
    return 2;
  }
  std::vector<TraceRequest> trace;
  if (*workload == Workload::kTrace) {
    std::ifstream in(f.trace_file);
    if (f.trace_file.empty() || !in) {
      std::cerr << "error: --workload trace needs a readable --trace FILE (Mooncake JSONL)\n";
      return 2;
    }
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    auto parsed = parse_mooncake_trace(text, f.trace_block_tokens, token_range(*info), f.trace_speed, f.seed);
    if (!parsed.ok()) {
      std::cerr << "error: --trace " << f.trace_file << ": " << parsed.status().message() << "\n";
      return 2;
    }
    trace = std::move(*parsed);
  }
  // The oracle counts in the servers' unit: the KV block of the workers serving (16 when the
  // router cannot tell, the workers' default).
  const int block_size = info->kv_block_size() > 0 ? info->kv_block_size() : 16;
  std::cerr << "bench: " << info->name() << " via "
            << (f.worker.empty() ? f.router + " (" + info->kv_mode() + ")" : f.worker + " (worker, no router)")
            << ", workload " << workload_name(*workload) << ", ";
  if (sessions)
    std::cerr << spec.sessions << " sessions x " << spec.turns << " turns x " << spec.fanout << ", prefix "
              << spec.prefix_len << " (" << spec.shared_prefixes << " shared), turn " << spec.turn_len << ", output "
              << spec.output_len << (f.max_inflight > 0 ? ", in flight " + std::to_string(f.max_inflight) : "");
  else if (*workload == Workload::kTrace)
    std::cerr << trace.size() << " trace requests at speed " << f.trace_speed;
  else
    std::cerr << f.num_prompts << " prompts, input " << f.input_len << ", output " << f.output_len;
  std::cerr << ", concurrency " << (f.max_concurrency > 0 ? std::to_string(f.max_concurrency) : "unlimited")
            << ", rate " << f.request_rate << "/s\n";

  if (f.num_warmups > 0) {
    std::cerr << "bench: " << f.num_warmups << " warm-up requests\n";
    for (const auto& r : make_requests(f, *info, f.num_warmups, f.seed + 1'000'003)) {
      RequestRecord rec = run_one(*client, r);
      if (!rec.ok) {
        std::cerr << "error: warm-up failed: " << rec.error << "\n";
        return 1;
      }
    }
  }

  const RunRecords run = sessions ? run_sessions(f, spec, *client, *info, block_size)
                         : *workload == Workload::kTrace ? run_trace(f, trace, *client, block_size)
                                                         : run_random(f, *client, *info);
  const std::vector<RequestRecord>& records = run.records;

  json result = summarize(records, run.duration_s, f.percentiles);
  result["backend"] = "pdserve";
  result["label"] = f.label;
  result["model_id"] = info->name();
  result["kv_mode"] = f.worker.empty() ? info->kv_mode() : "direct-worker";
  result["workload"] = workload_name(*workload);
  if (sessions) {
    result["sessions"] = spec.sessions;
    result["turns"] = spec.turns;
    result["shared_prefixes"] = spec.shared_prefixes;
    result["prefix_len"] = spec.prefix_len;
    result["turn_len"] = spec.turn_len;
    result["turn_output_len"] = spec.output_len;
    result["fanout"] = spec.fanout;
    result["think_time_s"] = spec.think_time_s;
    result["max_inflight"] = f.max_inflight > 0 ? json(f.max_inflight) : json(nullptr);
  } else if (*workload == Workload::kTrace) {
    result["trace"] = f.trace_file;
    result["trace_requests"] = trace.size();
    result["trace_speed"] = f.trace_speed;
  } else {
    result["num_prompts"] = f.num_prompts;
    result["random_input_len"] = f.input_len;
    result["random_output_len"] = f.output_len;
    result["random_range_ratio"] = f.range_ratio;
    result["abort_fraction"] = f.abort_fraction;
    result["abort_within_ms"] = f.abort_within_ms;
  }
  if (!run.turns.empty()) {
    result["kv_block_size"] = block_size;
    result["prefix_reuse"] = session_json(summarize_sessions(run.turns), sessions);
  }
  result["request_rate"] = std::isinf(f.request_rate) ? json("inf") : json(f.request_rate);
  result["burstiness"] = f.burstiness;
  result["max_concurrency"] = f.max_concurrency > 0 ? json(f.max_concurrency) : json(nullptr);
  result["ignore_eos"] = f.ignore_eos;
  // Per rank, so that setups with different rank counts compare (0 ranks: the router has none up).
  const int ranks = info->num_ranks();
  result["num_ranks"] = ranks;
  result["output_throughput_per_rank"] = ranks > 0 ? result["output_throughput"].get<double>() / ranks : 0.0;
  result["total_token_throughput_per_rank"] =
      ranks > 0 ? result["total_token_throughput"].get<double>() / ranks : 0.0;
  if (!f.verify_model.empty()) {
    std::cerr << "bench: checking every output against the in-process engine (" << f.verify_model << ")\n";
    json details;
    StatusOr<int> mismatched = count_mismatches(f.verify_model, run.requests, records, &details);
    if (!mismatched.ok()) {
      std::cerr << "error: --verify-model: " << mismatched.status().message() << "\n";
      return 1;
    }
    result["mismatched"] = *mismatched;
    result["mismatches"] = details;
  }
  if (f.save_detailed) result["requests"] = request_details(records);
  print_table(result, f.percentiles);
  if (result.contains("prefix_reuse")) {
    print_reuse(result["prefix_reuse"]);
    std::cout << "==================================================" << std::endl;
  }
  for (const RequestRecord& r : records)
    if (!r.ok && !r.abandoned) {
      std::cerr << "bench: first failure: " << r.error << "\n";
      break;
    }
  if (!f.result_file.empty()) {
    std::ofstream out(f.result_file);
    out << result.dump(2) << "\n";
    if (!out) {
      std::cerr << "error: cannot write " << f.result_file << "\n";
      return 1;
    }
  }
  const bool all_equal = !result.contains("mismatched") || result["mismatched"].get<int>() == 0;
  return result["failed"].get<int>() == 0 && all_equal ? 0 : 1;
}

}  // namespace

std::vector<double> arrival_times(int n, double rate, double burstiness, uint64_t seed) {
  std::vector<double> out(std::max(0, n), 0.0);
  if (std::isinf(rate)) return out;
  std::mt19937_64 rng(seed);
  std::gamma_distribution<double> gap(burstiness, 1.0 / (rate * burstiness));
  double t = 0;
  for (int i = 0; i < n; ++i) {
    out[i] = t;
    t += gap(rng);
  }
  return out;
}

json summarize(const std::vector<RequestRecord>& records, double duration_s, const std::vector<double>& percentiles) {
  std::vector<double> ttft, tpot, itl, e2el, queued, prefill, kv_transfer, outside_prefill;
  int completed = 0, failed = 0, abandoned = 0, retried = 0, migrations = 0;
  int64_t input = 0, output = 0, cached = 0, decode_cached = 0, transferred = 0;
  int decode_local = 0;
  for (const RequestRecord& r : records) {
    retried += r.retries;
    migrations += r.migrations;
    if (!r.ok) {
      ++(r.abandoned ? abandoned : failed);
      continue;
    }
    ++completed;
    input += r.prompt_tokens;
    output += r.output_tokens;
    cached += r.cached_tokens;
    decode_cached += r.decode_cached_tokens;
    transferred += r.transferred_blocks;
    decode_local += r.decode_local_prefill;
    if (r.output_tokens > 0) ttft.push_back(r.ttft_s);
    if (r.output_tokens > 1) tpot.push_back((r.e2e_s - r.ttft_s) / (r.output_tokens - 1));
    itl.insert(itl.end(), r.itl_s.begin(), r.itl_s.end());
    e2el.push_back(r.e2e_s);
    queued.push_back(r.server_queued_s);
    prefill.push_back(r.server_prefill_s);
    kv_transfer.push_back(r.server_kv_transfer_s);
    // What the first token cost beyond the prefill's compute: router, RPCs, KV transfer and
    // hand-off. Unlike TTFT it hardly moves with the prefill's own noise.
    if (r.output_tokens > 0) outside_prefill.push_back(std::max(0.0, r.ttft_s - r.server_prefill_s));
  }
  json j;
  j["duration"] = duration_s;
  j["completed"] = completed;
  j["failed"] = failed;
  j["abandoned"] = abandoned;  // Given up by the client on purpose (--abort-fraction).
  j["retried"] = retried;
  j["migrations"] = migrations;  // The router's, over every request it finished.
  j["total_input_tokens"] = input;
  j["total_output_tokens"] = output;
  j["total_cached_tokens"] = cached;  // Prompt tokens the servers' prefix caches held.
  j["total_decode_cached_tokens"] = decode_cached;  // P/D: of them, on the decode side.
  j["total_transferred_blocks"] = transferred;       // P/D: prompt KV blocks moved to decode workers.
  j["mean_transferred_blocks"] = completed > 0 ? double(transferred) / completed : 0.0;
  j["decode_local_prefills"] = decode_local;  // P/D: prompts prefilled on their decode worker.
  const double d = duration_s > 0 ? duration_s : 1;
  j["request_throughput"] = completed / d;
  j["output_throughput"] = double(output) / d;
  j["total_token_throughput"] = double(input + output) / d;
  auto stats = [&](const std::string& key, const std::vector<double>& v) {
    double mean = 0, var = 0;
    for (double x : v) mean += x;
    if (!v.empty()) mean /= double(v.size());
    for (double x : v) var += (x - mean) * (x - mean);
    if (!v.empty()) var /= double(v.size());
    j["mean_" + key + "_ms"] = mean * 1000;
    j["median_" + key + "_ms"] = percentile(v, 50) * 1000;
    j["std_" + key + "_ms"] = std::sqrt(var) * 1000;
    for (double p : percentiles) {
      char ps[16];
      std::snprintf(ps, sizeof ps, p == std::floor(p) ? "%.0f" : "%.1f", p);
      j["p" + std::string(ps) + "_" + key + "_ms"] = percentile(v, p) * 1000;
    }
  };
  // Peak concurrency from the send and finish times: a check that the concurrency cap held.
  std::vector<std::pair<double, int>> edges;
  for (const RequestRecord& r : records)
    if (r.ok) {
      edges.emplace_back(r.start_s, 1);
      edges.emplace_back(r.start_s + r.e2e_s, -1);
    }
  std::sort(edges.begin(), edges.end());
  int in_flight = 0, peak = 0;
  for (const auto& [t, delta] : edges) peak = std::max(peak, in_flight += delta);
  j["peak_concurrency"] = peak;
  stats("ttft", ttft);
  stats("tpot", tpot);
  stats("itl", itl);
  stats("e2el", e2el);
  stats("queued", queued);
  stats("prefill", prefill);
  stats("kv_transfer", kv_transfer);
  stats("ttft_outside_prefill", outside_prefill);
  return j;
}

json request_details(const std::vector<RequestRecord>& records) {
  json out = json::array();
  for (const RequestRecord& r : records) {
    out.push_back({{"ok", r.ok},
                   {"error", r.error},
                   {"code", absl::StatusCodeToString(r.code)},
                   {"start_s", r.start_s},
                   {"ttft_s", r.ttft_s},
                   {"e2e_s", r.e2e_s},
                   {"tpot_s", r.output_tokens > 1 ? json((r.e2e_s - r.ttft_s) / (r.output_tokens - 1)) : json(nullptr)},
                   {"output_tokens", r.output_tokens},
                   {"prompt_tokens", r.prompt_tokens},
                   {"cached_tokens", r.cached_tokens},
                   {"decode_cached_tokens", r.decode_cached_tokens},
                   {"transferred_blocks", r.transferred_blocks},
                   {"decode_local_prefill", r.decode_local_prefill},
                   {"itl_s", r.itl_s},
                   {"server_queued_s", r.server_queued_s},
                   {"server_prefill_s", r.server_prefill_s},
                   {"server_kv_transfer_s", r.server_kv_transfer_s},
                   {"prefill_worker", r.prefill_worker},
                   {"decode_worker", r.decode_worker},
                   {"migrations", r.migrations},
                   {"retries", r.retries},
                   {"request_id", r.request_id}});
  }
  return out;
}

void add_bench_command(CLI::App& app, int* exit_code) {
  auto f = std::make_shared<BenchFlags>();
  CLI::App* cmd = app.add_subcommand("bench", "Benchmark a running router (like `vllm bench serve`)");
  cmd->add_option("--router", f->router, "Router gRPC HOST:PORT");
  cmd->add_option("--api-key", f->api_key, "API key for the router (default: $PDSERVE_API_KEY)");
  cmd->add_flag("--tls", f->tls, "Connect to the router over TLS, trusting the system's CAs");
  cmd->add_option("--tls-ca", f->tls_ca, "Connect to the router over TLS, trusting only this PEM CA");
  cmd->add_option("--worker", f->worker,
                  "Instead of --router: one aggregated worker's gRPC HOST:PORT, to measure what the router adds");
  const std::vector<CLI::Option*> random = {
      cmd->add_option("--num-prompts", f->num_prompts, "Requests to send (random)")->capture_default_str(),
      cmd->add_option("--abort-fraction", f->abort_fraction,
                      "Give up this fraction of the requests (random): the client cancels each at a random time "
                      "within --abort-within-ms of sending (counted as `abandoned`, not failed)"),
      cmd->add_option("--abort-within-ms", f->abort_within_ms, "When the --abort-fraction requests are given up at "
                      "the latest (random)")->capture_default_str()};
  const std::vector<CLI::Option*> lengths = {
      cmd->add_option("--random-input-len,--input-len", f->input_len, "Prompt tokens (random, warm-ups)")
          ->capture_default_str(),
      cmd->add_option("--random-output-len,--output-len", f->output_len, "Tokens to generate (max_tokens)")
          ->capture_default_str(),
      cmd->add_option("--random-range-ratio", f->range_ratio, "Lengths uniform in len*(1±ratio); 0: fixed")
          ->capture_default_str()};
  cmd->add_option("--max-concurrency", f->max_concurrency, "Requests in flight at most (0: unlimited)");
  cmd->add_option("--retries", f->retries,
                  "Send a request that failed UNAVAILABLE (the router gone or restarting) again from scratch, up to "
                  "this often (counted as `retried`)")
      ->capture_default_str();
  cmd->add_option("--request-rate", f->request_rate, "Requests per second (default inf: all at once)");
  cmd->add_option("--burstiness", f->burstiness, "Gamma shape of the arrival gaps (1: Poisson)")->capture_default_str();
  cmd->add_flag("--ignore-eos", f->ignore_eos, "Generate exactly the output length");
  cmd->add_option("--num-warmups", f->num_warmups, "Warm-up requests before measuring")->capture_default_str();
  cmd->add_option("--seed", f->seed, "Seed for lengths, tokens and arrivals")->capture_default_str();
  cmd->add_option("--temperature", f->temperature, "Sampling temperature (0: greedy)")->capture_default_str();
  add_output_sampling_flags(cmd, &f->sampling);
  cmd->add_option("--percentile-metrics-values,--percentiles", f->percentiles, "Percentiles to report")->capture_default_str();
  cmd->add_option("--result-file", f->result_file, "Write the result as JSON here");
  cmd->add_flag("--save-detailed", f->save_detailed,
                "Add every request's measurements and workers to the result (\"requests\", in send order)");
  cmd->add_option("--verify-model", f->verify_model,
                  "After the run, compare every successful output with this model's in-process engine (same prompt "
                  "and sampling, seeded); mismatches are counted and fail the run");
  cmd->add_option("--label", f->label, "A name for this run in the result");
  cmd->add_option("--workload", f->workload,
                  "random (independent prompts), multiturn (chat sessions resending their history), agentic "
                  "(a long shared preamble, short steps, sibling fan-out) or trace (--trace, Mooncake JSONL)")
      ->capture_default_str();
  SessionSpec& spec = f->session;
  const std::vector<CLI::Option*> session = {
      cmd->add_option("--sessions", spec.sessions, "Sessions (multiturn/agentic; default 16 / 8)"),
      cmd->add_option("--turns", spec.turns, "Requests per session, one after the other (default 4 / 6)"),
      cmd->add_option("--shared-prefixes", spec.shared_prefixes,
                      "Distinct system prompts the sessions share, round robin (default 4 / 1)"),
      cmd->add_option("--prefix-len", spec.prefix_len, "Tokens of each system prompt (default 128 / 192)"),
      cmd->add_option("--turn-len", spec.turn_len, "New tokens per turn (default 32 / 16)"),
      cmd->add_option("--turn-output-len", spec.output_len, "max_tokens of each turn (default 32 / 16)"),
      cmd->add_option("--fanout", spec.fanout, "Sibling requests per turn with the same history (default 1 / 2)"),
      cmd->add_option("--think-time", spec.think_time_s,
                      "Seconds between an answer and the session's next turn (default 0)"),
      cmd->add_option("--max-inflight", f->max_inflight,
                      "Requests in flight at most across the open sessions (0: no cap); --max-concurrency caps the "
                      "open sessions")};
  const std::vector<CLI::Option*> trace = {
      cmd->add_option("--trace", f->trace_file,
                      "A Mooncake-format trace (JSONL: timestamp ms, input_length, output_length, hash_ids)"),
      cmd->add_option("--trace-block-tokens", f->trace_block_tokens, "Tokens per trace hash id")->capture_default_str(),
      cmd->add_option("--trace-speed", f->trace_speed, "Replay speed (2: twice as fast)")->capture_default_str()};
  cmd->callback([f, exit_code, random, lengths, session, trace] {
    auto given = [](const std::vector<CLI::Option*>& options) {
      std::vector<std::string> names;
      for (const CLI::Option* o : options)
        if (o->count() > 0) names.push_back(o->get_name());
      return names;
    };
    f->random_given = given(random);
    f->lengths_given = given(lengths);
    f->session_given = given(session);
    f->trace_given = given(trace);
    *exit_code = run_bench(*f);
  });
}

}  // namespace pdserve::tools
