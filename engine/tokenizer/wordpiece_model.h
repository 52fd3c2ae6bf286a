// The WordPiece model of tokenizer.json files (BERT and its kin), as the tokenizers library's
// models/wordpiece: greedy longest-match-first from the start of the word, pieces after the
// first spelled with continuing_subword_prefix ("##"); a word with any part that matches no
// piece, or longer than max_input_chars_per_word, is the unknown token as a whole.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "absl/container/flat_hash_map.h"
#include "common/status.h"
#include "engine/tokenizer/tokenizer_model.h"

namespace pdserve::engine {

class WordPieceModel final : public TokenizerModel {
 public:
  // From a tokenizer.json "model" object of type WordPiece.
  static StatusOr<std::unique_ptr<WordPieceModel>> from_json(const nlohmann::json& model);

  Status encode_word(std::string_view word, std::vector<int>& ids) const override;
  std::optional<int> token_to_id(std::string_view token) const override;
  const std::string* id_to_token(int id) const override;
  int vocab_size() const override { return static_cast<int>(pieces_.size()); }

 private:
  WordPieceModel() = default;

  absl::flat_hash_map<std::string, int> vocab_;
  std::vector<std::string> pieces_;
  std::vector<bool> has_piece_;
  int unk_id_ = -1;
  std::string continuing_subword_prefix_;
  int max_input_chars_per_word_ = 100;
};

}  // namespace pdserve::engine
