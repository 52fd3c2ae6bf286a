// Added tokens of tokenizer.json files ("added_tokens": special and control tokens such as
// "<|eot_id|>", and plain added words), as the tokenizers library's AddedVocabulary: their
// text is found in the input before the model runs, so each becomes its one id. Tokens with
// normalized: false are matched on the raw text, the others on the normalized text of what is
// left; a match takes the longest token at the leftmost position; lstrip / rstrip absorb the
// whitespace beside a match, single_word rejects a match inside a word.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "common/status.h"
#include "engine/tokenizer/byte_trie.h"

namespace pdserve::engine {

struct AddedToken {
  int id = -1;
  std::string content;
  bool special = false;     // Skipped when decoding (a control symbol, not text).
  bool normalized = false;  // Matched on normalized text (else on the raw input).
  bool lstrip = false;
  bool rstrip = false;
  bool single_word = false;
};

// From a tokenizer.json "added_tokens" entry.
StatusOr<AddedToken> parse_added_token(const nlohmann::json& node);

// A piece of text: an added token's match, or text in between (added_id -1).
struct AddedTokenSplit {
  size_t begin;
  size_t end;
  int added_id;
};

// Finds the tokens of one kind (raw-text or normalized-text matches).
class AddedTokenMatcher {
 public:
  // `contents[i]` is the text matched for `tokens[i]` (its content, normalized if need be).
  AddedTokenMatcher(std::vector<AddedToken> tokens, const std::vector<std::string>& contents);
  bool empty() const { return tokens_.empty(); }
  // Covers all of `text` with matches and the spans between them, in order.
  std::vector<AddedTokenSplit> split(std::string_view text) const;

 private:
  std::vector<AddedToken> tokens_;
  ByteTrie trie_;  // Matched text -> index into tokens_.
};

}  // namespace pdserve::engine
