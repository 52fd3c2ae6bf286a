#include "engine/tokenizer/added_vocabulary.h"

#include <nlohmann/json.hpp>

#include "engine/tokenizer/json_fields.h"
#include "engine/tokenizer/unicode.h"

namespace pdserve::engine {
namespace {

// The library's single-word test: a word character (alphanumeric or '_') on that side.
bool is_word_character(char32_t c) { return c == '_' || unicode::is_alphabetic_or_numeric(c); }

char32_t last_code_point(std::string_view text) {
  const std::vector<unicode::CodePoint> cps = unicode::code_points(
      text.substr(text.size() > 4 ? text.size() - 4 : 0));  // The last character is within 4 bytes.
  return cps.empty() ? 0 : cps.back().value;
}

char32_t first_code_point(std::string_view text) {
  const std::vector<unicode::CodePoint> cps = unicode::code_points(text.substr(0, 4));
  return cps.empty() ? 0 : cps.front().value;
}

}  // namespace

StatusOr<AddedToken> parse_added_token(const nlohmann::json& node) {
  AddedToken token;
  PD_ASSIGN_OR_RETURN(const json_fields::Json* id, json_fields::member(node, "id"));
  PD_ASSIGN_OR_RETURN(token.id, json_fields::token_id(*id, "an added token's id"));
  PD_ASSIGN_OR_RETURN(token.content, json_fields::string_member(node, "content"));
  PD_ASSIGN_OR_RETURN(token.special, json_fields::bool_member(node, "special", false));
  // The library's default: special tokens are not normalized, others are.
  PD_ASSIGN_OR_RETURN(token.normalized, json_fields::bool_member(node, "normalized", !token.special));
  PD_ASSIGN_OR_RETURN(token.lstrip, json_fields::bool_member(node, "lstrip", false));
  PD_ASSIGN_OR_RETURN(token.rstrip, json_fields::bool_member(node, "rstrip", false));
  PD_ASSIGN_OR_RETURN(token.single_word, json_fields::bool_member(node, "single_word", false));
  return token;
}

AddedTokenMatcher::AddedTokenMatcher(std::vector<AddedToken> tokens,
                                     const std::vector<std::string>& contents)
    : tokens_(std::move(tokens)) {
  for (size_t i = 0; i < tokens_.size(); ++i) {
    if (!contents[i].empty()) trie_.insert(contents[i], static_cast<int>(i));
  }
}

std::vector<AddedTokenSplit> AddedTokenMatcher::split(std::string_view text) const {
  std::vector<AddedTokenSplit> splits;
  size_t plain_start = 0;  // Where the text not yet covered begins.
  size_t pos = 0;
  while (pos < text.size()) {
    size_t match_length = 0;
    int match = -1;
    trie_.for_each_prefix(text.substr(pos), [&](size_t length, int index) {
      match_length = length;  // Longest wins: prefixes come shortest first.
      match = index;
    });
    if (match < 0) {
      ++pos;
      continue;
    }
    const AddedToken& token = tokens_[size_t(match)];
    size_t start = pos;
    size_t stop = pos + match_length;
    pos = stop;  // The next search starts after this match, kept or not.
    if (token.single_word) {
      const bool word_before = start > 0 && is_word_character(last_code_point(text.substr(0, start)));
      const bool word_after = stop < text.size() && is_word_character(first_code_point(text.substr(stop)));
      if (word_before || word_after) continue;
    }
    if (token.lstrip) {
      const std::vector<unicode::CodePoint> before =
          unicode::code_points(text.substr(plain_start, start - plain_start));
      size_t i = before.size();
      while (i > 0 && unicode::is_whitespace(before[i - 1].value)) --i;
      start = plain_start + (i < before.size() ? before[i].begin : start - plain_start);
    }
    if (token.rstrip) {
      for (const unicode::CodePoint& cp : unicode::code_points(text.substr(stop))) {
        if (!unicode::is_whitespace(cp.value)) break;
        stop += cp.length;
      }
      pos = stop;
    }
    if (start > plain_start) splits.push_back({plain_start, start, -1});
    splits.push_back({start, stop, token.id});
    plain_start = stop;
  }
  if (plain_start < text.size()) splits.push_back({plain_start, text.size(), -1});
  return splits;
}

}  // namespace pdserve::engine
