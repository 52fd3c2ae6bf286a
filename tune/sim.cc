#include "tune/sim.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <deque>
#include <queue>
#include <utility>

#include "common/clock.h"
#include "router/policy.h"
#include "tune/decode_batch.h"
#include "tune/queue_model.h"
#include "tune/sampling.h"

namespace pdserve::tune {
namespace {

Duration to_duration(double seconds) { return Duration(std::llround(seconds * 1e9)); }

struct Request {
  int input = 0, output = 0, blocks = 0;
  int client = 0;  // Closed loop: whose request it is.
  int remaining = 0;  // Prompt tokens not yet computed.
  int decode_worker = -1;
  bool started = false, refused = false;
  double kv_s = 0;
  TimePoint arrival, dispatched, prefill_start, prefill_end, decode_ready, decode_start, done;
};

// A prefill engine: prompts FCFS (the front one possibly part computed), one step at a time.
struct PrefillEngine {
  std::deque<int> queue;
  std::vector<std::pair<int, int>> step;  // (request, tokens) of the step in flight.
  bool busy = false;
  int64_t queued_tokens = 0;  // The router's view: prompt tokens sent and not yet answered.
  int outstanding = 0;
};

// A decode or aggregated engine.
struct DecodeEngine {
  std::deque<int> waiting;      // Placed here, waiting for a slot and KV (P/D: after the hand-off).
  std::deque<int> prefilling;   // Aggregated: admitted prompts, FCFS.
  std::vector<int> joining;     // Aggregated: prefilled, decoding from the next step.
  std::vector<std::pair<int, int>> chunks;  // Aggregated: prompt chunks of the step in flight.
  DecodeBatch batch;
  bool busy = false;
  int active = 0;       // Holding a slot (P/D: decoding; aggregated: prefilling or decoding).
  int used_blocks = 0;  // Reserved by the active ones.
  int assigned = 0, assigned_blocks = 0;  // The router's view: placed here and not finished.
};

enum class EventKind { kArrival, kPrefillStep, kDecodeReady, kDecodeStep };

struct Event {
  TimePoint at;
  uint64_t order;  // Ties in time run in scheduling order, so a run is reproducible.
  EventKind kind;
  int who;  // A request (arrival, ready) or an engine (steps).
  bool operator>(const Event& o) const { return at != o.at ? at > o.at : order > o.order; }
};

class Simulation {
 public:
  Simulation(const Profile& profile, const Topology& topology, const Workload& workload, const Slo& slo,
             double rate, const SimOptions& options, const TpProfile& prefill, const TpProfile& decode, KvLaw kv)
      : profile_(profile), topology_(topology), workload_(workload), slo_(slo), rate_(rate), options_(options),
        prefill_(prefill), decode_(decode), kv_(kv), lengths_(workload.seed), gaps_(options.seed),
        max_running_(options.max_running > 0 ? options.max_running : INT_MAX),
        max_waiting_(options.max_waiting > 0 ? options.max_waiting : INT_MAX),
        num_blocks_(int(decode.kv_tokens / std::max(decode.block_size, 1))),
        prefill_engines_(topology.aggregated ? 0 : topology.n_p), decode_engines_(topology.n_d) {
    requests_.reserve(options.requests);
  }

  SimResult run();

 private:
  TimePoint now() const { return clock_.now(); }
  void schedule(TimePoint at, EventKind kind, int who) { events_.push({at, next_order_++, kind, who}); }
  // A new request from `client` at `at`.
  void create(TimePoint at, int client);
  void on_arrival(int id);
  void dispatch(int id);
  void refuse(int id);
  void complete(int id);
  void next_of_client(int client);
  std::vector<router::WorkerLoad> decode_loads() const;
  void prefill_kick(int w);
  void on_prefill_step(int w);
  void on_decode_ready(int id);
  void decode_kick(int w);
  void on_decode_step(int w);
  void aggregated_kick(int w);
  void on_aggregated_step(int w);
  double decode_seconds(const DecodeBatch& b) const {
    return decode_.decode.step_seconds(b.batch(), double(b.context_tokens()));
  }
  // Takes up to `budget` prompt tokens FCFS from `queue` into `step`; returns the tokens taken.
  int take_chunks(const std::deque<int>& queue, int budget, std::vector<std::pair<int, int>>* step);
  // Pops the prompts of `queue` the step finished (a prefix); returns them.
  std::vector<int> finish_chunks(std::deque<int>* queue, std::vector<std::pair<int, int>>* step);
  // Time-weighted statistics of a step of `seconds`, over the measured window only.
  void account(double seconds, bool carries_prompt, int batch, int used_blocks);
  Prediction summarize(std::vector<RequestRecord>* records) const;

  const Profile& profile_;
  const Topology& topology_;
  const Workload& workload_;
  const Slo& slo_;
  const double rate_;
  const SimOptions& options_;
  const TpProfile& prefill_;  // Aggregated: unused.
  const TpProfile& decode_;   // The decode (or aggregated) engines' profile.
  const KvLaw kv_;
  Sampler lengths_, gaps_;
  const int max_running_, max_waiting_, num_blocks_;
  FakeClock clock_;
  TimePoint start_ = clock_.now();
  std::priority_queue<Event, std::vector<Event>, std::greater<>> events_;
  uint64_t next_order_ = 0;
  std::vector<Request> requests_;
  std::vector<PrefillEngine> prefill_engines_;
  std::vector<DecodeEngine> decode_engines_;
  int running_ = 0;  // Router: out at the workers.
  std::deque<int> router_waiting_;
  bool measuring_ = false;
  TimePoint window_start_, window_end_;
  double prefill_busy_s_ = 0, decode_busy_s_ = 0, batch_time_ = 0, blocks_time_ = 0;
};

void Simulation::create(TimePoint at, int client) {
  const int id = int(requests_.size());
  Request r;
  r.input = lengths_.length(workload_.input);
  r.output = lengths_.length(workload_.output);
  const int context = decode_.max_context > 0 ? decode_.max_context : INT_MAX;
  r.blocks = router::blocks_needed(r.input, r.output, context, decode_.block_size);
  r.client = client;
  r.arrival = at;
  requests_.push_back(r);
  schedule(at, EventKind::kArrival, id);
}

void Simulation::on_arrival(int id) {
  if (id == options_.warmup) {
    measuring_ = true;
    window_start_ = now();
  }
  if (id == options_.requests - 1) {
    measuring_ = false;
    window_end_ = now();
  }
  if (workload_.arrival != Arrival::kClosed && id + 1 < options_.requests) {
    const double mean = 1 / rate_;
    const double shape = 1 / (workload_.gamma_cv * workload_.gamma_cv);
    const double gap = workload_.arrival == Arrival::kGamma ? gaps_.gamma(shape, mean / shape) : gaps_.exponential(mean);
    create(now() + to_duration(gap), 0);
  }
  switch (router::admit(running_, int(router_waiting_.size()), max_running_, max_waiting_)) {
    case router::Admission::kRun:
      ++running_;
      dispatch(id);
      break;
    case router::Admission::kWait:
      router_waiting_.push_back(id);
      break;
    case router::Admission::kReject:
      refuse(id);
      break;
  }
}

std::vector<router::WorkerLoad> Simulation::decode_loads() const {
  std::vector<router::WorkerLoad> loads(decode_engines_.size());
  for (size_t i = 0; i < loads.size(); ++i) {
    const DecodeEngine& e = decode_engines_[i];
    loads[i].index = int(i);
    loads[i].up = true;
    loads[i].tp = topology_.tp_d;
    loads[i].num_blocks = num_blocks_;
    loads[i].free_blocks = std::max(num_blocks_ - e.assigned_blocks, 0);
    loads[i].running = e.active;
    loads[i].waiting = e.assigned - e.active;
  }
  return loads;
}

void Simulation::dispatch(int id) {
  Request& r = requests_[id];
  r.dispatched = now();
  const int d = router::pick_decode(decode_loads(), r.blocks, {});
  if (d < 0) {  // No decode worker's cache could ever hold it.
    --running_;
    refuse(id);
    return;
  }
  r.decode_worker = d;
  DecodeEngine& engine = decode_engines_[d];
  ++engine.assigned;
  engine.assigned_blocks += r.blocks;
  if (topology_.aggregated) {
    engine.waiting.push_back(id);
    aggregated_kick(d);
    return;
  }
  std::vector<router::WorkerLoad> loads(prefill_engines_.size());
  for (size_t i = 0; i < loads.size(); ++i) {
    loads[i].index = int(i);
    loads[i].up = true;
    loads[i].tp = topology_.tp_p;
    loads[i].queued_prefill_tokens = prefill_engines_[i].queued_tokens;
    loads[i].running = prefill_engines_[i].outstanding;
  }
  const int p = router::pick_prefill(loads, {});
  PrefillEngine& prefill = prefill_engines_[p];
  r.remaining = r.input;
  prefill.queue.push_back(id);
  prefill.queued_tokens += r.input;
  ++prefill.outstanding;
  prefill_kick(p);
}

void Simulation::refuse(int id) {
  requests_[id].refused = true;
  requests_[id].done = now();
  next_of_client(requests_[id].client);
}

void Simulation::next_of_client(int client) {
  if (workload_.arrival == Arrival::kClosed && int(requests_.size()) < options_.requests) create(now(), client);
}

void Simulation::complete(int id) {
  Request& r = requests_[id];
  r.done = now();
  DecodeEngine& engine = decode_engines_[r.decode_worker];
  --engine.assigned;
  engine.assigned_blocks -= r.blocks;
  --running_;
  while (!router_waiting_.empty() && running_ < max_running_) {
    const int next = router_waiting_.front();
    router_waiting_.pop_front();
    ++running_;
    dispatch(next);
  }
  next_of_client(r.client);
}

int Simulation::take_chunks(const std::deque<int>& queue, int budget, std::vector<std::pair<int, int>>* step) {
  int taken = 0;
  for (int id : queue) {
    if (taken == budget) break;
    Request& r = requests_[id];
    const int tokens = std::min(r.remaining, budget - taken);
    if (!r.started) {
      r.started = true;
      r.prefill_start = now();
    }
    step->emplace_back(id, tokens);
    taken += tokens;
  }
  return taken;
}

std::vector<int> Simulation::finish_chunks(std::deque<int>* queue, std::vector<std::pair<int, int>>* step) {
  for (const auto& [id, tokens] : *step) requests_[id].remaining -= tokens;
  step->clear();
  std::vector<int> finished;
  while (!queue->empty() && requests_[queue->front()].remaining == 0) {
    finished.push_back(queue->front());
    requests_[queue->front()].prefill_end = now();
    queue->pop_front();
  }
  return finished;
}

void Simulation::account(double seconds, bool carries_prompt, int batch, int used_blocks) {
  if (!measuring_) return;
  if (carries_prompt) prefill_busy_s_ += seconds;
  if (batch > 0) {
    decode_busy_s_ += seconds;
    batch_time_ += batch * seconds;
  }
  blocks_time_ += double(used_blocks) * seconds;
}

void Simulation::prefill_kick(int w) {
  PrefillEngine& e = prefill_engines_[w];
  if (e.busy || e.queue.empty()) return;
  const int tokens = take_chunks(e.queue, prefill_.max_batch_tokens, &e.step);
  const double seconds = prefill_.prefill.step_seconds(tokens);
  e.busy = true;
  account(seconds, true, 0, 0);
  schedule(now() + to_duration(seconds), EventKind::kPrefillStep, w);
}

void Simulation::on_prefill_step(int w) {
  PrefillEngine& e = prefill_engines_[w];
  e.busy = false;
  for (int id : finish_chunks(&e.queue, &e.step)) {
    Request& r = requests_[id];
    e.queued_tokens -= r.input;
    --e.outstanding;
    r.kv_s = kv_.seconds(r.input);
    schedule(now() + to_duration(r.kv_s + profile_.handoff_s), EventKind::kDecodeReady, id);
  }
  prefill_kick(w);
}

void Simulation::on_decode_ready(int id) {
  Request& r = requests_[id];
  r.decode_ready = now();
  if (r.output <= 1) {  // The prefill's token was the whole answer.
    r.decode_start = now();
    complete(id);
    return;
  }
  decode_engines_[r.decode_worker].waiting.push_back(id);
  decode_kick(r.decode_worker);
}

void Simulation::decode_kick(int w) {
  DecodeEngine& e = decode_engines_[w];
  if (e.busy) return;
  std::vector<int> admitted;
  while (!e.waiting.empty() && e.active < decode_.max_running &&
         e.used_blocks + requests_[e.waiting.front()].blocks <= num_blocks_) {
    admitted.push_back(e.waiting.front());
    e.used_blocks += requests_[e.waiting.front()].blocks;
    ++e.active;
    e.waiting.pop_front();
  }
  if (e.batch.batch() == 0 && admitted.empty()) return;
  e.batch.begin_step();
  for (int id : admitted) {
    requests_[id].decode_start = now();
    e.batch.join(id, requests_[id].input, requests_[id].output - 1);
  }
  const double seconds = decode_seconds(e.batch);
  e.busy = true;
  account(seconds, false, e.batch.batch(), e.used_blocks);
  schedule(now() + to_duration(seconds), EventKind::kDecodeStep, w);
}

void Simulation::on_decode_step(int w) {
  DecodeEngine& e = decode_engines_[w];
  e.busy = false;
  for (int id : e.batch.end_step()) {
    e.used_blocks -= requests_[id].blocks;
    --e.active;
    complete(id);
  }
  decode_kick(w);
}

void Simulation::aggregated_kick(int w) {
  DecodeEngine& e = decode_engines_[w];
  if (e.busy) return;
  // The engine admits a request, slot and reservation, before computing its prompt.
  while (!e.waiting.empty() && e.active < decode_.max_running &&
         e.used_blocks + requests_[e.waiting.front()].blocks <= num_blocks_) {
    const int id = e.waiting.front();
    e.waiting.pop_front();
    e.used_blocks += requests_[id].blocks;
    ++e.active;
    requests_[id].remaining = requests_[id].input;
    e.prefilling.push_back(id);
  }
  if (e.batch.batch() == 0 && e.joining.empty() && e.prefilling.empty()) return;
  e.batch.begin_step();
  for (int id : e.joining) {
    requests_[id].decode_start = now();
    e.batch.join(id, requests_[id].input, requests_[id].output - 1);
  }
  e.joining.clear();
  const int batch = e.batch.batch();
  const int chunk = take_chunks(e.prefilling, std::max(decode_.max_batch_tokens - batch, 0), &e.chunks);
  const PrefillLaw& prefill = decode_.prefill;
  double seconds = 0;
  if (batch > 0 && chunk > 0) {
    seconds = decode_seconds(e.batch) + prefill.step_seconds(chunk) - prefill.a;
  } else if (chunk > 0) {
    seconds = prefill.step_seconds(chunk);
  } else {
    seconds = decode_seconds(e.batch);
  }
  e.busy = true;
  account(seconds, chunk > 0, batch, e.used_blocks);
  schedule(now() + to_duration(seconds), EventKind::kDecodeStep, w);
}

void Simulation::on_aggregated_step(int w) {
  DecodeEngine& e = decode_engines_[w];
  e.busy = false;
  const auto release = [&](int id) {
    e.used_blocks -= requests_[id].blocks;
    --e.active;
    complete(id);
  };
  for (int id : e.batch.end_step()) release(id);
  for (int id : finish_chunks(&e.prefilling, &e.chunks)) {
    Request& r = requests_[id];
    r.decode_ready = now();
    if (r.output <= 1) {
      r.decode_start = now();
      release(id);
    } else {
      e.joining.push_back(id);
    }
  }
  aggregated_kick(w);
}

SimResult Simulation::run() {
  if (workload_.arrival == Arrival::kClosed) {
    for (int c = 0; c < workload_.concurrency && c < options_.requests; ++c) create(now(), c);
  } else {
    create(now(), 0);
  }
  while (!events_.empty()) {
    const Event e = events_.top();
    events_.pop();
    clock_.advance(e.at - now());
    switch (e.kind) {
      case EventKind::kArrival:
        on_arrival(e.who);
        break;
      case EventKind::kPrefillStep:
        on_prefill_step(e.who);
        break;
      case EventKind::kDecodeReady:
        on_decode_ready(e.who);
        break;
      case EventKind::kDecodeStep:
        topology_.aggregated ? on_aggregated_step(e.who) : on_decode_step(e.who);
        break;
    }
  }
  SimResult result;
  result.prediction = summarize(&result.requests);
  return result;
}

double percentile(std::vector<double> values, double q) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const double pos = q * double(values.size() - 1);
  const size_t i = size_t(pos);
  if (i + 1 >= values.size()) return values.back();
  return values[i] + (pos - double(i)) * (values[i + 1] - values[i]);
}

double seconds_between(TimePoint a, TimePoint b) { return std::chrono::duration<double>(b - a).count(); }

Prediction Simulation::summarize(std::vector<RequestRecord>* records) const {
  Prediction p;
  std::vector<double> ttft, tpot;
  int good = 0;
  for (size_t id = size_t(options_.warmup); id < requests_.size(); ++id) {
    const Request& r = requests_[id];
    RequestRecord rec;
    rec.arrival_s = seconds_between(start_, r.arrival);
    rec.input_tokens = r.input;
    rec.output_tokens = r.output;
    rec.refused = r.refused;
    if (!r.refused) {
      rec.router_wait_s = seconds_between(r.arrival, r.dispatched);
      rec.prefill_wait_s = seconds_between(r.dispatched, r.prefill_start);
      rec.prefill_s = seconds_between(r.prefill_start, r.prefill_end);
      rec.overhead_s = first_token_overhead(profile_, topology_);
      rec.kv_transfer_s = r.kv_s;
      rec.handoff_s = topology_.aggregated ? 0 : profile_.handoff_s;
      rec.decode_wait_s = seconds_between(r.decode_ready, r.decode_start);
      rec.ttft_s = seconds_between(r.arrival, r.prefill_end) + rec.overhead_s;
      rec.e2e_s = seconds_between(r.arrival, r.done) + rec.overhead_s;
      rec.tpot_s = r.output > 1 ? (rec.e2e_s - rec.ttft_s) / (r.output - 1) : 0;
      rec.good = rec.ttft_s <= slo_.ttft_s && rec.tpot_s <= slo_.tpot_s;
      ttft.push_back(rec.ttft_s);
      tpot.push_back(rec.tpot_s);
      p.router_wait_s += rec.router_wait_s;
      p.prefill_wait_s += rec.prefill_wait_s;
      p.prefill_s += rec.prefill_s;
      p.kv_transfer_s += rec.kv_transfer_s;
    }
    good += rec.good;
    records->push_back(rec);
  }
  const double served = double(std::max<size_t>(ttft.size(), 1));
  p.router_wait_s /= served;
  p.prefill_wait_s /= served;
  p.prefill_s /= served;
  p.kv_transfer_s /= served;
  p.overhead_s = first_token_overhead(profile_, topology_);
  p.handoff_s = topology_.aggregated ? 0 : profile_.handoff_s;
  p.attainment = records->empty() ? 0 : double(good) / double(records->size());
  const double q = slo_.percentile / 100;
  p.ttft_p50_s = percentile(ttft, 0.5);
  p.ttft_pq_s = percentile(ttft, q);
  p.tpot_p50_s = percentile(tpot, 0.5);
  p.tpot_pq_s = percentile(tpot, q);
  const double window = seconds_between(window_start_, window_end_);
  p.rate = workload_.arrival == Arrival::kClosed ? (window > 0 ? (options_.requests - 1 - options_.warmup) / window : 0)
                                                 : rate_;
  if (window > 0) {
    const int prefill_engines = topology_.aggregated ? topology_.n_d : topology_.n_p;
    p.prefill_utilization = prefill_busy_s_ / (window * prefill_engines);
    p.kv_occupancy = num_blocks_ > 0 ? blocks_time_ / (window * topology_.n_d * num_blocks_) : 0;
  }
  p.decode_batch = decode_busy_s_ > 0 ? batch_time_ / decode_busy_s_ : 0;
  // A growing queue: the last quarter waits far longer than the second.
  const auto quarter_wait = [&](int quarter) {
    double sum = 0;
    int n = 0;
    const size_t from = records->size() * quarter / 4, to = records->size() * (quarter + 1) / 4;
    for (size_t i = from; i < to; ++i) {
      const RequestRecord& rec = (*records)[i];
      if (rec.refused) continue;
      sum += rec.router_wait_s + rec.prefill_wait_s + rec.decode_wait_s;
      ++n;
    }
    return n > 0 ? sum / n : 0;
  };
  p.stable = records->size() < 8 || quarter_wait(3) <= 2 * quarter_wait(1) + p.prefill_s;
  return p;
}

Status validate(const Topology& topology, const Workload& workload, double rate, const SimOptions& options) {
  if (topology.n_d < 1 || (!topology.aggregated && topology.n_p < 1))
    return absl::InvalidArgumentError("topology without workers");
  if (options.warmup < 0 || options.requests <= options.warmup)
    return absl::InvalidArgumentError("no measured request: requests must exceed warmup");
  if (workload.arrival == Arrival::kClosed && workload.concurrency < 1)
    return absl::InvalidArgumentError("closed loop without clients");
  if (workload.arrival != Arrival::kClosed && !(rate > 0)) return absl::InvalidArgumentError("rate must be positive");
  if (workload.arrival == Arrival::kGamma && !(workload.gamma_cv > 0))
    return absl::InvalidArgumentError("gamma arrivals need cv > 0");
  PD_RETURN_IF_ERROR(length_points(workload.input).status());
  return length_points(workload.output).status();
}

}  // namespace

StatusOr<SimResult> simulate(const Profile& profile, const Topology& topology, const Workload& workload,
                             const Slo& slo, double rate, const SimOptions& options) {
  PD_RETURN_IF_ERROR(validate(topology, workload, rate, options));
  PD_ASSIGN_OR_RETURN(const TpProfile* decode, find_tp(profile, topology.tp_d));
  const TpProfile* prefill = decode;
  KvLaw kv;
  if (!topology.aggregated) {
    PD_ASSIGN_OR_RETURN(prefill, find_tp(profile, topology.tp_p));
    PD_ASSIGN_OR_RETURN(kv, find_kv_law(profile, topology));
  }
  Simulation sim(profile, topology, workload, slo, rate, options, *prefill, *decode, kv);
  return sim.run();
}

StatusOr<double> simulated_goodput(const Profile& profile, const Topology& topology, const Workload& workload,
                                   const Slo& slo, const SimOptions& options, const GoodputSearch& search) {
  if (workload.arrival == Arrival::kClosed)
    return absl::InvalidArgumentError("goodput is a largest open-loop rate; a closed loop has no rate to search");
  return goodput(
      [&](double rate) -> StatusOr<Prediction> {
        PD_ASSIGN_OR_RETURN(SimResult result, simulate(profile, topology, workload, slo, rate, options));
        return result.prediction;
      },
      slo, search);
}

}  // namespace pdserve::tune
