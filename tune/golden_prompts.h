// The correctness gate's golden prompt set (docs/tune.md §6.5): token prompts whose lengths sit
// where a topology's bookkeeping can go wrong — one short of, exactly at and one past a KV block,
// one past the engine's per-step token budget (a chunked prefill), one that fills the context,
// a very short one — plus ordinary ones. Token ids are seeded and drawn from the vocabulary
// (never BOS after the first position, never EOS), decoding is greedy with ignore_eos, so every
// correct topology must produce the same tokens as the in-process reference.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace pdserve::tune {

// What the prompt set is drawn for: the model (ModelInfo) and the engine's geometry (the
// workers' Info and flags).
struct GoldenShape {
  int vocab_size = 0;
  int bos_id = -1;  // -1: the model has none; the first token is then drawn like the others.
  std::vector<int> eos_ids;
  int max_context = 0;  // Positions; 0: unknown (then nothing is capped by it).
  int block_size = 16;
  int max_batch_tokens = 512;
};

// Why a prompt is in the set.
enum class GoldenKind { kShort, kBlockMinusOne, kBlock, kBlockPlusOne, kChunkBoundary, kNearMaxContext, kOrdinary };
std::string golden_kind_name(GoldenKind kind);

struct GoldenPrompt {
  GoldenKind kind = GoldenKind::kOrdinary;
  std::vector<int> tokens;
  int max_tokens = 32;  // New tokens, greedy, ignore_eos.
};

// The set for `shape`: short (1 token), block_size−1, block_size, block_size+1,
// max_batch_tokens+1, near max context, and two ordinary lengths, each with 32–64 new tokens
// (fewer where the context leaves less room). A length the context cannot hold together with at
// least one new token is left out (a chunk boundary past a small model's context, say), so the
// set may hold fewer than 8 prompts. Deterministic in (shape, seed).
std::vector<GoldenPrompt> golden_prompts(const GoldenShape& shape, uint64_t seed = 0);

}  // namespace pdserve::tune
