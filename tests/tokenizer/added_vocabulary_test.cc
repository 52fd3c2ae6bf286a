// Added-token matching, as the tokenizers library's AddedVocabulary: the longest token at the
// leftmost position, and lstrip / rstrip / single_word.
#include "engine/tokenizer/added_vocabulary.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace pdserve::engine {
namespace {

using ::testing::ElementsAreArray;

// The splits of `text`, each written "text" for plain text and "<id:text>" for a token.
std::vector<std::string> show(const AddedTokenMatcher& matcher, const std::string& text) {
  std::vector<std::string> out;
  for (const AddedTokenSplit& split : matcher.split(text)) {
    const std::string piece = text.substr(split.begin, split.end - split.begin);
    out.push_back(split.added_id < 0 ? piece : "<" + std::to_string(split.added_id) + ":" + piece + ">");
  }
  return out;
}

AddedTokenMatcher matcher_of(const std::vector<nlohmann::json>& tokens) {
  std::vector<AddedToken> parsed;
  std::vector<std::string> contents;
  for (const nlohmann::json& token : tokens) {
    parsed.push_back(parse_added_token(token).value());
    contents.push_back(parsed.back().content);
  }
  return AddedTokenMatcher(parsed, contents);
}

TEST(AddedVocabulary, LeftmostLongest) {
  const AddedTokenMatcher matcher = matcher_of({{{"id", 1}, {"content", "<a>"}},
                                                {{"id", 2}, {"content", "<a><b>"}},
                                                {{"id", 3}, {"content", "b>"}}});
  EXPECT_THAT(show(matcher, "x<a><b>y<a>b>"),
              ElementsAreArray({"x", "<2:<a><b>>", "y", "<1:<a>>", "<3:b>>"}));
  EXPECT_THAT(show(matcher, "plain"), ElementsAreArray({"plain"}));
}

TEST(AddedVocabulary, StripAndSingleWord) {
  const AddedTokenMatcher matcher =
      matcher_of({{{"id", 1}, {"content", "<m>"}, {"lstrip", true}},
                  {{"id", 2}, {"content", "<r>"}, {"rstrip", true}},
                  {{"id", 3}, {"content", "cat"}, {"single_word", true}}});
  // lstrip takes the whitespace before the token, rstrip the whitespace after.
  EXPECT_THAT(show(matcher, "a \t<m> b"), ElementsAreArray({"a", "<1: \t<m>>", " b"}));
  EXPECT_THAT(show(matcher, "a <r>  b"), ElementsAreArray({"a ", "<2:<r>  >", "b"}));
  // single_word: "cat" only where it is not part of a word.
  EXPECT_THAT(show(matcher, "cat concat cats cat."),
              ElementsAreArray({"<3:cat>", " concat cats ", "<3:cat>", "."}));
}

TEST(AddedVocabulary, ParsesLibraryDefaults) {
  const AddedToken special = parse_added_token({{"id", 5}, {"content", "<s>"}, {"special", true}}).value();
  EXPECT_FALSE(special.normalized);  // Special tokens default to raw-text matching...
  const AddedToken word = parse_added_token({{"id", 6}, {"content", "hello"}}).value();
  EXPECT_TRUE(word.normalized);  // ...other added tokens to normalized-text matching.
  EXPECT_FALSE(parse_added_token({{"id", -1}, {"content", "x"}}).ok());
  EXPECT_FALSE(parse_added_token({{"id", 1}}).ok());
}

}  // namespace
}  // namespace pdserve::engine
