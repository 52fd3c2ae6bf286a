// The BPE model of tokenizer.json files (GPT-2, Llama-3, Qwen, Llama-2, Gemma), as the
// tokenizers library's models/bpe: a word splits into characters (with continuing_subword_prefix
// / end_of_word_suffix), characters outside the vocabulary become <0xNN> byte pieces
// (byte_fallback) or the unknown token (fused when fuse_unk), then adjacent pairs merge in
// merge-rank order. With ignore_merges a word that is itself in the vocabulary is one token.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "absl/container/flat_hash_map.h"
#include "common/status.h"
#include "engine/tokenizer/bpe_merge.h"
#include "engine/tokenizer/tokenizer_model.h"

namespace pdserve::engine {

class BpeModel final : public TokenizerModel {
 public:
  // From a tokenizer.json "model" object of type BPE. dropout > 0 (random merges) is refused.
  static StatusOr<std::unique_ptr<BpeModel>> from_json(const nlohmann::json& model);

  Status encode_word(std::string_view word, std::vector<int>& ids) const override;
  std::optional<int> token_to_id(std::string_view token) const override;
  const std::string* id_to_token(int id) const override;
  int vocab_size() const override { return static_cast<int>(pieces_.size()); }

 private:
  BpeModel() = default;
  std::optional<MergeCandidate> merge_of(int left, int right) const;

  absl::flat_hash_map<std::string, int> vocab_;
  std::vector<std::string> pieces_;  // By id; "" where the vocabulary skips an id.
  std::vector<bool> has_piece_;
  absl::flat_hash_map<uint64_t, MergeCandidate> merges_;  // (left << 32 | right) -> merge.
  std::array<int, 256> byte_ids_{};  // byte_fallback: the <0xNN> piece of each byte, or -1.
  std::optional<int> unk_id_;
  std::string continuing_subword_prefix_;
  std::string end_of_word_suffix_;
  bool byte_fallback_ = false;
  bool fuse_unk_ = false;
  bool ignore_merges_ = false;
};

}  // namespace pdserve::engine
