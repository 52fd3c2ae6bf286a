#include "tools/bench_workload.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "common/percentile.h"
#include "common/splitmix64.h"

namespace pdserve::tools {
namespace {

// A seeded stream per (seed, purpose, index), so that a session's tokens do not depend on how
// many other sessions there are.
uint64_t mix(uint64_t x) { return splitmix64(x); }

std::vector<int> seeded_tokens(uint64_t stream, int len, const TokenRange& range) {
  std::mt19937_64 rng(mix(stream));
  const int lo = 3, span = std::max(1, range.vocab_size - lo);
  std::vector<int> out(size_t(std::max(0, len)));
  for (int& t : out) {
    do {
      t = lo + int(rng() % uint64_t(span));
    } while (span > int(range.avoid.size()) && std::find(range.avoid.begin(), range.avoid.end(), t) != range.avoid.end());
  }
  return out;
}

}  // namespace

StatusOr<Workload> parse_workload(const std::string& name) {
  for (Workload w : {Workload::kRandom, Workload::kMultiturn, Workload::kAgentic, Workload::kTrace})
    if (name == workload_name(w)) return w;
  return absl::InvalidArgumentError(
      absl::StrCat("--workload '", name, "': expected random, multiturn, agentic or trace"));
}

const char* workload_name(Workload w) {
  switch (w) {
    case Workload::kRandom: return "random";
    case Workload::kMultiturn: return "multiturn";
    case Workload::kAgentic: return "agentic";
    case Workload::kTrace: return "trace";
  }
  return "?";
}

SessionSpec default_session_spec(Workload w) {
  SessionSpec s;
  if (w == Workload::kAgentic) {
    // An agent loop: one long tool-and-instructions preamble for all, many short steps, each
    // step's tool calls fanned out in parallel (SWE-agent / OpenHands-like traces).
    s.sessions = 8;
    s.turns = 6;
    s.shared_prefixes = 1;
    s.prefix_len = 192;
    s.turn_len = 16;
    s.output_len = 16;
    s.fanout = 2;
  }
  return s;
}

SessionTokens::SessionTokens(const SessionSpec& spec, TokenRange range, uint64_t seed)
    : spec_(spec), range_(std::move(range)), seed_(seed) {}

std::vector<int> SessionTokens::draw(uint64_t stream, int len) const {
  return seeded_tokens(mix(seed_) ^ stream, len, range_);
}

std::vector<int> SessionTokens::prefix(int s) const {
  const int which = s % std::max(1, spec_.shared_prefixes);
  return draw(mix(1) ^ uint64_t(which), spec_.prefix_len);
}

std::vector<int> SessionTokens::turn(int s, int t) const {
  return draw(mix(2 + uint64_t(s)) ^ mix(uint64_t(t) << 20), spec_.turn_len);
}

StatusOr<std::vector<TraceRequest>> parse_mooncake_trace(const std::string& text, int block_tokens,
                                                         const TokenRange& range, double speed, uint64_t seed) {
  if (block_tokens <= 0) return absl::InvalidArgumentError("trace block size must be > 0");
  if (!(speed > 0)) return absl::InvalidArgumentError("trace speed must be > 0");
  std::vector<TraceRequest> out;
  std::istringstream in(text);
  std::string line;
  int number = 0;
  double first_ms = -1;
  while (std::getline(in, line)) {
    ++number;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    auto bad = [&](const std::string& why) {
      return absl::InvalidArgumentError(absl::StrCat("trace line ", number, ": ", why));
    };
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object()) return bad("not a JSON object");
    for (const char* key : {"timestamp", "input_length", "output_length"})
      if (!j.contains(key) || !j[key].is_number()) return bad(absl::StrCat("needs a number \"", key, "\""));
    const double ms = j["timestamp"].get<double>();
    const int64_t input = j["input_length"].get<int64_t>(), output = j["output_length"].get<int64_t>();
    if (ms < 0 || input <= 0 || output <= 0 || input > (1 << 24) || output > (1 << 24))
      return bad("timestamp must be >= 0, input_length and output_length > 0");
    TraceRequest r;
    if (j.contains("hash_ids")) {
      if (!j["hash_ids"].is_array()) return bad("\"hash_ids\" must be an array of integers");
      for (const auto& id : j["hash_ids"]) {
        if (!id.is_number_integer()) return bad("\"hash_ids\" must be an array of integers");
        if (int64_t(r.prompt.size()) >= input) break;
        const auto block = seeded_tokens(mix(seed) ^ mix(uint64_t(id.get<int64_t>()) + 7), block_tokens, range);
        r.prompt.insert(r.prompt.end(), block.begin(), block.end());
      }
    }
    if (int64_t(r.prompt.size()) > input) r.prompt.resize(size_t(input));
    if (int64_t(r.prompt.size()) < input) {
      // Tokens past the named blocks are this request's own.
      const auto own = seeded_tokens(mix(seed) ^ mix(uint64_t(number) << 32), int(input - int64_t(r.prompt.size())),
                                     range);
      r.prompt.insert(r.prompt.end(), own.begin(), own.end());
    }
    if (first_ms < 0) first_ms = ms;
    r.arrival_s = std::max(0.0, ms - first_ms) / 1000.0 / speed;
    r.output_len = int(output);
    out.push_back(std::move(r));
  }
  if (out.empty()) return absl::InvalidArgumentError("the trace has no requests");
  std::stable_sort(out.begin(), out.end(),
                   [](const TraceRequest& a, const TraceRequest& b) { return a.arrival_s < b.arrival_s; });
  return out;
}

std::vector<uint64_t> ReuseOracle::chain(const std::vector<int>& tokens) const {
  std::vector<uint64_t> out;
  uint64_t h = 0x6a09e667f3bcc908ull;
  for (size_t i = 0; i + size_t(block_size_) <= tokens.size(); i += size_t(block_size_)) {
    for (size_t k = i; k < i + size_t(block_size_); ++k) h = mix(h ^ uint64_t(uint32_t(tokens[k])));
    out.push_back(h);
  }
  return out;
}

int ReuseOracle::on_send(const std::vector<int>& prompt) {
  if (block_size_ <= 0 || prompt.empty()) return 0;
  std::lock_guard lock(mu_);
  const std::vector<uint64_t> keys = chain(prompt);
  const size_t cap = (prompt.size() - 1) / size_t(block_size_);
  size_t hit = 0;
  while (hit < std::min(cap, keys.size()) && blocks_.count(keys[hit])) ++hit;
  blocks_.insert(keys.begin(), keys.end());
  return int(hit) * block_size_;
}

void ReuseOracle::on_end(const std::vector<int>& sequence) {
  if (block_size_ <= 0 || sequence.empty()) return;
  std::lock_guard lock(mu_);
  const std::vector<uint64_t> keys = chain({sequence.begin(), sequence.end() - 1});
  blocks_.insert(keys.begin(), keys.end());
}

SessionSummary summarize_sessions(const std::vector<TurnRecord>& records) {
  SessionSummary s;
  int64_t prompt = 0, cached = 0, oracle = 0;
  int64_t prompt1 = 0, cached1 = 0, prompt2 = 0, cached2 = 0;
  std::vector<double> ttft1, ttft2;
  for (const TurnRecord& r : records) {
    if (!r.ok) continue;
    prompt += r.prompt_tokens;
    cached += r.cached_tokens;
    oracle += r.oracle_tokens;
    if (r.turn == 0) {
      ttft1.push_back(r.ttft_s);
      prompt1 += r.prompt_tokens;
      cached1 += r.cached_tokens;
    } else {
      ttft2.push_back(r.ttft_s);
      prompt2 += r.prompt_tokens;
      cached2 += r.cached_tokens;
    }
  }
  auto ratio = [](int64_t a, int64_t b) { return b > 0 ? double(a) / double(b) : 0.0; };
  s.hit_rate = ratio(cached, prompt);
  s.oracle_hit_rate = ratio(oracle, prompt);
  s.hit_efficiency = ratio(cached, oracle);
  s.turn1_requests = int(ttft1.size());
  s.later_requests = int(ttft2.size());
  s.turn1_ttft_p50_ms = percentile(ttft1, 50) * 1000;
  s.turn1_ttft_p90_ms = percentile(ttft1, 90) * 1000;
  s.later_ttft_p50_ms = percentile(ttft2, 50) * 1000;
  s.later_ttft_p90_ms = percentile(ttft2, 90) * 1000;
  s.turn1_hit_rate = ratio(cached1, prompt1);
  s.later_hit_rate = ratio(cached2, prompt2);
  return s;
}

}  // namespace pdserve::tools
