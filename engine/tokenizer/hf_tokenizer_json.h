// Reads a Hugging Face tokenizer.json (and the tokenizer_config.json beside it) into plain
// data that the two BPE implementations are built from, so that the JSON library and its
// exceptions stay inside one file. Only what BPE models use is kept.
#pragma once

#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/status.h"
#include "engine/tokenizer/added_tokens.h"

namespace pdserve::engine {

// How a regex split treats the matches (the "behavior" of a Split pre-tokenizer).
enum class SplitBehavior { kIsolated, kRemoved, kMergedWithPrevious, kMergedWithNext, kContiguous };

// One step of the pre-tokenizer pipeline, each applied to every piece the previous made.
struct PreTokenizerStep {
  enum class Kind { kSplit, kPrependSpace };
  Kind kind = Kind::kSplit;
  std::string pattern;  // kSplit: a PCRE2 pattern, or a literal string when `literal`.
  bool literal = false;
  bool invert = false;  // The pattern describes the pieces' contents instead of the delimiters.
  SplitBehavior behavior = SplitBehavior::kIsolated;
};

struct HfTokenizerJson {
  // SentencePiece-converted files (Llama-2, Mistral): pieces spell spaces as "▁", unknown
  // characters fall back to <0xNN> pieces. Otherwise the GPT-2 byte-level scheme.
  bool sentencepiece_style = false;
  std::unordered_map<std::string, int> vocab;
  std::vector<std::pair<std::string, std::string>> merges;  // In rank order.
  std::vector<AddedToken> added_tokens;
  bool ignore_merges = false;  // A pre-token that is itself in the vocab is not split (Llama-3).
  int unk_id = -1;
  std::vector<PreTokenizerStep> pre_tokenizer;
  int bos_id = -1;
  int eos_id = -1;
  bool add_bos = true;  // Whether encoding starts with BOS (add_bos_token, the template).
};

// `config_json` is the text of tokenizer_config.json, or empty when there is none. `name`
// (the file path) is quoted in errors.
StatusOr<HfTokenizerJson> parse_hf_tokenizer_json(std::string_view tokenizer_json,
                                                  std::string_view config_json,
                                                  const std::string& name);

}  // namespace pdserve::engine
