// The model stage of a tokenizer.json pipeline: one pre-tokenized word to token ids, and the
// vocabulary both ways. Implemented by the BPE and Unigram models (bpe_model.h,
// unigram_model.h); immutable once built, so safe to share across threads.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace pdserve::engine {

class TokenizerModel {
 public:
  virtual ~TokenizerModel() = default;
  // Appends the ids of `word` to `ids`.
  virtual Status encode_word(std::string_view word, std::vector<int>& ids) const = 0;
  virtual std::optional<int> token_to_id(std::string_view token) const = 0;
  // The piece of `id`; nullptr when the vocabulary has none.
  virtual const std::string* id_to_token(int id) const = 0;
  // One past the largest id.
  virtual int vocab_size() const = 0;
};

}  // namespace pdserve::engine
