// The tokenizer of a Hugging Face tokenizer.json, composed as the file says: added tokens cut
// out of the raw text (added_vocabulary.h), the normalizer on the rest (normalizers.h), the
// pre-tokenizer's words (pre_tokenizers.h), the model's ids per word (bpe_model.h,
// unigram_model.h, wordpiece_model.h), the post-processor's special tokens
// (post_processor.h); decoding runs the decoder chain (decoders.h) token by token. Whatever
// the file asks for that is not implemented is refused at load, naming the component.
// tokenizer_config.json adds transformers' rule for Llama / Gemma / CodeLlama tokenizer
// classes: their add_bos_token / add_eos_token rebuild the post-processor as [bos] A [eos];
// other classes keep the file's. Immutable once built: encode and decode may run
// concurrently from any thread.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "engine/tokenizer.h"
#include "engine/tokenizer/added_vocabulary.h"
#include "engine/tokenizer/decoders.h"
#include "engine/tokenizer/normalizers.h"
#include "engine/tokenizer/post_processor.h"
#include "engine/tokenizer/pre_tokenizers.h"
#include "engine/tokenizer/tokenizer_model.h"

namespace pdserve::engine {

class HfTokenizer final : public Tokenizer {
 public:
  // `config_json` is the text of tokenizer_config.json, or empty when there is none.
  // InvalidArgument for malformed files, Unimplemented naming an unsupported component.
  static StatusOr<std::unique_ptr<HfTokenizer>> from_json(std::string_view tokenizer_json,
                                                          std::string_view config_json);

  // `add_bos` is transformers' add_special_tokens: whether the post-processor runs.
  StatusOr<std::vector<int>> encode(std::string_view text, bool add_bos) const override;
  // The decoder's output for `token` after `prev`; special tokens add nothing, and a token
  // after -1 or a special token is the first of the text (the decoders' start rules apply).
  std::string decode_token(int prev, int token) const override;
  // The added token's content (or the vocabulary's piece for one only tokenizer_config.json
  // names special), as transformers' decode with skip_special_tokens=False shows it.
  std::string special_token_text(int token) const override;
  // transformers' decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False).
  std::string decode(const std::vector<int>& tokens) const override;
  int vocab_size() const override { return vocab_size_; }
  int bos_id() const override { return bos_id_; }
  int eos_id() const override { return eos_id_; }

 private:
  HfTokenizer() = default;
  Status encode_segment(std::string_view text, bool at_text_start, std::vector<int>& ids) const;
  std::optional<int> token_id(std::string_view content) const;
  bool skipped(int token) const;
  std::string decode_piece(int token, bool first) const;

  Normalizer normalizer_;
  PreTokenizer pre_tokenizer_;
  std::unique_ptr<TokenizerModel> model_;
  PostProcessor post_processor_;
  Decoder decoder_;
  std::vector<AddedToken> added_tokens_;
  std::optional<AddedTokenMatcher> raw_added_;         // normalized: false tokens.
  std::optional<AddedTokenMatcher> normalized_added_;  // normalized: true tokens.
  std::vector<int> added_index_;  // By id: the index into added_tokens_, or -1.
  std::vector<bool> special_;     // By id: skipped when decoding.
  int vocab_size_ = 0;
  int bos_id_ = -1;
  int eos_id_ = -1;
};

}  // namespace pdserve::engine
