// The Unigram model of tokenizer.json files (SentencePiece unigram: T5, ALBERT, XLNet), as the
// tokenizers library's models/unigram: the best-scoring segmentation of a word into vocabulary
// pieces (Viterbi over the lattice of pieces starting at each character); a character no piece
// covers costs the unknown token (the lowest score minus 10), consecutive unknowns fuse into
// one, and with byte_fallback an unknown run becomes its <0xNN> byte pieces instead.
#pragma once

#include <array>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "absl/container/flat_hash_map.h"
#include "common/status.h"
#include "engine/tokenizer/byte_trie.h"
#include "engine/tokenizer/tokenizer_model.h"

namespace pdserve::engine {

class UnigramModel final : public TokenizerModel {
 public:
  // From a tokenizer.json "model" object of type Unigram.
  static StatusOr<std::unique_ptr<UnigramModel>> from_json(const nlohmann::json& model);

  Status encode_word(std::string_view word, std::vector<int>& ids) const override;
  std::optional<int> token_to_id(std::string_view token) const override;
  const std::string* id_to_token(int id) const override;
  int vocab_size() const override { return static_cast<int>(pieces_.size()); }

 private:
  UnigramModel() = default;

  std::vector<std::string> pieces_;
  std::vector<double> scores_;
  absl::flat_hash_map<std::string, int> vocab_;
  ByteTrie trie_;
  std::optional<int> unk_id_;
  double unk_score_ = 0;
  bool byte_fallback_ = false;
  std::array<int, 256> byte_ids_{};
};

}  // namespace pdserve::engine
