// The workloads of `pdserve bench --workload`, beside its random prompts: multi-turn chat and
// agent sessions, whose every turn resends the whole history (the previous prompt, the output
// the server returned, verbatim, and the turn's new tokens) as real clients do, and replayed
// traces in the Mooncake format. And the oracle they are judged against: how many prompt
// tokens a single prefix cache of unbounded size would have reused. Generators and the oracle
// are pure (seeded, no I/O) so that they are unit-tested; bench_command.cc drives them.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "common/status.h"

namespace pdserve::tools {

enum class Workload {
  kRandom,     // Independent random prompts (`vllm bench serve`'s random dataset).
  kMultiturn,  // Chat sessions: shared system prompts, a user message per turn.
  kAgentic,    // Agent sessions: a long shared preamble, short tool results, sibling fan-out.
  kTrace,      // A Mooncake-format JSONL trace replayed at its timestamps.
};

// "random", "multiturn", "agentic", "trace"; InvalidArgument for anything else.
StatusOr<Workload> parse_workload(const std::string& name);
const char* workload_name(Workload w);

// The shape of a session workload.
struct SessionSpec {
  int sessions = 16;        // Conversations (or agent runs).
  int turns = 4;            // Requests per session, one after the other.
  int shared_prefixes = 4;  // Distinct system prompts (preambles); session s uses s % shared_prefixes.
  int prefix_len = 128;     // Tokens of each system prompt.
  int turn_len = 32;        // New tokens per turn (user message, or tool result).
  int output_len = 32;      // max_tokens of each turn.
  int fanout = 1;           // Sibling requests per turn with the same history (agentic: > 1);
                            // the session goes on with the first sibling's output.
  double think_time_s = 0;  // Between a turn's answer and the session's next turn.
};

// The default shape of each session workload (sessions and lengths the flags may override).
SessionSpec default_session_spec(Workload w);

// Which token ids a workload draws: [3, vocab_size) less `avoid` (the model's BOS and EOS ids),
// so that no prompt holds a special token by chance.
struct TokenRange {
  int vocab_size = 0;
  std::vector<int> avoid;
};

// The tokens of a session's prompts, from `seed`.
class SessionTokens {
 public:
  SessionTokens(const SessionSpec& spec, TokenRange range, uint64_t seed);
  // Session `s`'s system prompt (shared by sessions with the same s % shared_prefixes).
  std::vector<int> prefix(int s) const;
  // The new tokens of session `s`'s turn `t` (t >= 0).
  std::vector<int> turn(int s, int t) const;

 private:
  std::vector<int> draw(uint64_t stream, int len) const;
  SessionSpec spec_;
  TokenRange range_;
  uint64_t seed_;
};

// One request of a trace: when it arrives, its prompt and its output length.
struct TraceRequest {
  double arrival_s = 0;
  std::vector<int> prompt;
  int output_len = 0;
};

// Reads a Mooncake-format trace (one JSON object per line: "timestamp" in ms, "input_length",
// "output_length", "hash_ids": the ids of the prompt's blocks of `block_tokens` tokens each,
// equal ids meaning equal blocks). Each hash id becomes `block_tokens` seeded tokens of
// `range`, the prompt is cut to input_length (or padded with fresh tokens), and arrivals are
// rescaled by 1 / `speed`, the first at 0. InvalidArgument naming the line for a malformed one.
StatusOr<std::vector<TraceRequest>> parse_mooncake_trace(const std::string& text, int block_tokens,
                                                         const TokenRange& range, double speed, uint64_t seed);

// The single-cache oracle: a prefix cache of unbounded size that holds every full block any
// request so far sent (its prompt, at send) or computed (prompt + output but its last token,
// whose KV nothing computes, at its end). A request can reuse its longest cached run of leading
// full blocks, at most ⌊(prompt − 1) / B⌋ (the engine's rule: the last prompt token is always
// computed). Thread-safe.
class ReuseOracle {
 public:
  explicit ReuseOracle(int block_size) : block_size_(block_size) {}
  // Prompt tokens the oracle could reuse for `prompt`, then records the prompt's blocks.
  int on_send(const std::vector<int>& prompt);
  // Records the computed blocks of an ended request's `sequence` (its prompt and output).
  void on_end(const std::vector<int>& sequence);

 private:
  // Caller holds mu_. Chained block names (prefix hash) of the leading full blocks.
  std::vector<uint64_t> chain(const std::vector<int>& tokens) const;
  const int block_size_;
  std::mutex mu_;
  std::set<uint64_t> blocks_;
};

// The metrics of a session workload beyond `pdserve bench`'s: hit rates against the oracle,
// and TTFT by turn (turn 1 and turns >= 2).
struct TurnRecord {
  int turn = 0;  // 0-based.
  bool ok = false;
  double ttft_s = 0;
  int prompt_tokens = 0;
  int cached_tokens = 0;  // The server's report (GenerateResponse.cached_tokens).
  int oracle_tokens = 0;  // ReuseOracle::on_send.
};

// "hit_rate" (Σ cached / Σ prompt), "oracle_hit_rate", "hit_efficiency" (their ratio; null
// with an oracle of 0), and per bucket "turn1" / "turn2plus": requests, median and p90 TTFT
// (ms), hit rate.
struct SessionSummary {
  double hit_rate = 0, oracle_hit_rate = 0, hit_efficiency = 0;
  int turn1_requests = 0, later_requests = 0;
  double turn1_ttft_p50_ms = 0, turn1_ttft_p90_ms = 0, later_ttft_p50_ms = 0, later_ttft_p90_ms = 0;
  double turn1_hit_rate = 0, later_hit_rate = 0;
};
SessionSummary summarize_sessions(const std::vector<TurnRecord>& records);

}  // namespace pdserve::tools
