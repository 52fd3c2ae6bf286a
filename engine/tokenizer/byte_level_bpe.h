// The byte-level BPE tokenizer of Hugging Face tokenizer.json files (GPT-2, Llama-3, Qwen2):
// added/special tokens are cut out of the text first, the pre-tokenizer's regexes (PCRE2,
// Unicode mode) split the rest into words, each word's bytes become GPT-2's printable
// byte-to-unicode characters, and pairs merge by rank. Decoding maps the characters back.
// Immutable once built: encode and decode may run concurrently from any thread.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/status.h"
#include "engine/tokenizer.h"
#include "engine/tokenizer/added_tokens.h"
#include "engine/tokenizer/bpe_merge.h"
#include "engine/tokenizer/hf_tokenizer_json.h"

namespace pdserve::engine {

class ByteLevelBpe final : public Tokenizer {
 public:
  // Builds from a parsed byte-level tokenizer.json; `name` (the path) is quoted in errors.
  static StatusOr<std::unique_ptr<ByteLevelBpe>> from_hf(const HfTokenizerJson& spec,
                                                         const std::string& name);
  ~ByteLevelBpe() override;

  // BOS is left out when tokenizer_config.json says add_bos_token: false.
  StatusOr<std::vector<int>> encode(std::string_view text, bool add_bos) const override;
  std::string decode_token(int prev, int token) const override;
  int vocab_size() const override { return static_cast<int>(pieces_.size()); }
  int bos_id() const override { return bos_id_; }
  int eos_id() const override { return eos_id_; }

  // GPT-2's byte-to-unicode map: the printable character (as UTF-8) that stands for `byte`.
  static const std::array<std::string, 256>& byte_chars();

 private:
  class CompiledPattern;  // A PCRE2 pattern; kept out of this header.
  struct Step {
    PreTokenizerStep spec;
    std::unique_ptr<CompiledPattern> pattern;  // kSplit only.
  };

  ByteLevelBpe() = default;
  StatusOr<std::vector<std::string>> pre_tokenize(std::string_view text) const;
  void encode_word(std::string_view word, std::vector<int>& ids) const;

  std::vector<Step> steps_;
  std::vector<std::string> pieces_;  // Byte-level spelling by id ("" for ids without one).
  std::vector<AddedToken> added_list_;
  std::vector<int> added_index_;  // By id: the index into added_list_, or -1.
  std::optional<AddedTokenMatcher> added_tokens_;
  std::unordered_map<std::string, int> piece_ids_;
  std::array<int, 256> byte_ids_{};  // The id of each byte's single-character piece.
  std::unordered_map<uint64_t, MergeCandidate> merges_;  // (left << 32 | right) -> merge.
  bool ignore_merges_ = false;
  int bos_id_ = -1;
  int eos_id_ = -1;
  bool config_adds_bos_ = true;
};

}  // namespace pdserve::engine
