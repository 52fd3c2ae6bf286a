#include "tune/golden_prompts.h"

#include <algorithm>
#include <random>

namespace pdserve::tune {

std::string golden_kind_name(GoldenKind kind) {
  switch (kind) {
    case GoldenKind::kShort: return "short";
    case GoldenKind::kBlockMinusOne: return "block_size-1";
    case GoldenKind::kBlock: return "block_size";
    case GoldenKind::kBlockPlusOne: return "block_size+1";
    case GoldenKind::kChunkBoundary: return "max_batch_tokens+1";
    case GoldenKind::kNearMaxContext: return "near_max_context";
    case GoldenKind::kOrdinary: return "ordinary";
  }
  return "unknown";
}

std::vector<GoldenPrompt> golden_prompts(const GoldenShape& shape, uint64_t seed) {
  // Ids 0..2 are the special ids of llama2.c-style vocabularies (unk, BOS, EOS).
  const int first_id = std::min(3, std::max(0, shape.vocab_size - 1));
  std::uniform_int_distribution<int> token(first_id, std::max(first_id, shape.vocab_size - 1));
  std::uniform_int_distribution<int> new_tokens(32, 64);
  auto special = [&](int t) {
    return t == shape.bos_id || std::find(shape.eos_ids.begin(), shape.eos_ids.end(), t) != shape.eos_ids.end();
  };
  const int bs = shape.block_size;
  const int near_max = shape.max_context > 0 ? shape.max_context - 32 : 0;  // Room for 32 new tokens.
  const std::vector<std::pair<GoldenKind, int>> lengths = {
      {GoldenKind::kShort, 1},
      {GoldenKind::kBlockMinusOne, bs - 1},
      {GoldenKind::kBlock, bs},
      {GoldenKind::kBlockPlusOne, bs + 1},
      {GoldenKind::kChunkBoundary, shape.max_batch_tokens + 1},
      {GoldenKind::kNearMaxContext, near_max},
      {GoldenKind::kOrdinary, 2 * bs + bs / 2},
      {GoldenKind::kOrdinary, 5 * bs + 3},
  };
  std::vector<GoldenPrompt> out;
  for (size_t i = 0; i < lengths.size(); ++i) {
    const auto [kind, length] = lengths[i];
    // A generator per prompt: a prompt's tokens do not depend on whether the others fit.
    std::seed_seq seq{uint64_t(seed), uint64_t(i)};
    std::mt19937_64 rng(seq);
    int wanted_new = new_tokens(rng);
    if (length < 1) continue;
    if (shape.max_context > 0) wanted_new = std::min(wanted_new, shape.max_context - length);
    if (wanted_new < 1) continue;
    GoldenPrompt p;
    p.kind = kind;
    p.max_tokens = wanted_new;
    p.tokens.reserve(size_t(length));
    if (shape.bos_id >= 0) p.tokens.push_back(shape.bos_id);
    while (int(p.tokens.size()) < length) {
      const int t = token(rng);
      if (!special(t)) p.tokens.push_back(t);
    }
    out.push_back(std::move(p));
  }
  return out;
}

}  // namespace pdserve::tune
