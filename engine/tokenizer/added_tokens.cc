#include "engine/tokenizer/added_tokens.h"

#include <algorithm>

namespace pdserve::engine {

AddedTokenMatcher::AddedTokenMatcher(const std::vector<AddedToken>& tokens)
    : tokens_(tokens), by_first_byte_(256) {
  for (size_t i = 0; i < tokens_.size(); ++i) {
    if (tokens_[i].content.empty()) continue;
    by_first_byte_[static_cast<unsigned char>(tokens_[i].content[0])].push_back(i);
  }
  for (auto& bucket : by_first_byte_) {
    std::stable_sort(bucket.begin(), bucket.end(), [this](size_t a, size_t b) {
      return tokens_[a].content.size() > tokens_[b].content.size();
    });
  }
}

std::vector<TextSegment> AddedTokenMatcher::split(std::string_view text) const {
  std::vector<TextSegment> segments;
  size_t plain_start = 0;
  size_t pos = 0;
  while (pos < text.size()) {
    const AddedToken* match = nullptr;
    for (size_t index : by_first_byte_[static_cast<unsigned char>(text[pos])]) {
      if (text.substr(pos, tokens_[index].content.size()) == tokens_[index].content) {
        match = &tokens_[index];
        break;
      }
    }
    if (match == nullptr) {
      ++pos;
      continue;
    }
    if (pos > plain_start) segments.push_back({text.substr(plain_start, pos - plain_start), -1});
    segments.push_back({text.substr(pos, match->content.size()), match->id});
    pos += match->content.size();
    plain_start = pos;
  }
  if (plain_start < text.size()) segments.push_back({text.substr(plain_start), -1});
  return segments;
}

}  // namespace pdserve::engine
