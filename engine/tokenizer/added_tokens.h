// Added (special) tokens of tokenizer.json files: their literal text is found in the input
// before BPE runs, so "<|eot_id|>" becomes one id instead of being split into pieces.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace pdserve::engine {

struct AddedToken {
  int id = -1;
  std::string content;
  bool special = false;  // Special tokens decode to "" (they are control symbols, not text).
};

struct TextSegment {
  std::string_view text;
  int added_id;  // The added token this segment is, or -1 for ordinary text to run BPE on.
};

// Splits `text` at occurrences of the added tokens' contents, taking at each position the
// longest one that matches (leftmost-longest, as Hugging Face tokenizers do).
class AddedTokenMatcher {
 public:
  explicit AddedTokenMatcher(const std::vector<AddedToken>& tokens);
  std::vector<TextSegment> split(std::string_view text) const;

 private:
  std::vector<AddedToken> tokens_;
  // Per first byte, the indices into tokens_ of the tokens starting with it, longest first.
  std::vector<std::vector<size_t>> by_first_byte_;
};

}  // namespace pdserve::engine
