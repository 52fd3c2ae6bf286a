// tokenizer.json pre-tokenizers: the split behaviours on hand-placed delimiters, then one
// table row per pre-tokenizer: its JSON, an input and the words the tokenizers library makes.
#include "engine/tokenizer/pre_tokenizers.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace pdserve::engine {
namespace {

using ::testing::ElementsAreArray;

// The pieces of "a--b-" (delimiters at 1, 2 and 4) under each behaviour, as text.
std::vector<std::string> split_dashes(SplitBehavior behavior, bool invert) {
  const std::string text = "a--b-";
  std::vector<std::string> out;
  for (const TextSpan& span : split_spans(text.size(), {{1, 2}, {2, 3}, {4, 5}}, behavior, invert)) {
    out.push_back(text.substr(span.begin, span.end - span.begin));
  }
  return out;
}

TEST(PreTokenizers, SplitBehaviors) {
  using B = SplitBehavior;
  EXPECT_THAT(split_dashes(B::kRemoved, false), ElementsAreArray({"a", "b"}));
  EXPECT_THAT(split_dashes(B::kIsolated, false), ElementsAreArray({"a", "-", "-", "b", "-"}));
  EXPECT_THAT(split_dashes(B::kMergedWithPrevious, false), ElementsAreArray({"a-", "-", "b-"}));
  EXPECT_THAT(split_dashes(B::kMergedWithNext, false), ElementsAreArray({"a", "-", "-b", "-"}));
  EXPECT_THAT(split_dashes(B::kContiguous, false), ElementsAreArray({"a", "--", "b", "-"}));
  // invert: the matches are the pieces' contents, the text between them the delimiters.
  EXPECT_THAT(split_dashes(B::kRemoved, true), ElementsAreArray({"-", "-", "-"}));
  EXPECT_THAT(split_dashes(B::kMergedWithPrevious, true), ElementsAreArray({"a", "-", "-b", "-"}));
}

struct PreTokenizerCase {
  const char* json;
  const char* input;
  std::vector<std::string> words;
  bool at_text_start = true;
};

TEST(PreTokenizers, Table) {
  const PreTokenizerCase cases[] = {
      {"null", "a b", {"a b"}},
      // GPT-2's regex; words in the byte-level alphabet (" " is "Ġ", "\n" is "Ċ").
      {R"({"type": "ByteLevel", "add_prefix_space": false, "use_regex": true})", "Hi  there's\n",
       {"Hi", "Ġ", "Ġthere", "'s", "Ċ"}},
      {R"({"type": "ByteLevel", "add_prefix_space": true, "use_regex": true})", "Hi", {"ĠHi"}},
      {R"({"type": "ByteLevel", "add_prefix_space": false, "use_regex": false})", "a b\xC3\xA9",
       {"aĠbÃ©"}},
      // \s is the White_Space property: U+3000 is, U+180E and U+FEFF are not.
      {R"({"type": "Split", "pattern": {"Regex": "\\s+"}, "behavior": "Removed", "invert": false})",
       "a\xE3\x80\x80" "b\xE1\xA0\x8E" "c\xEF\xBB\xBF" "d", {"a", "b\xE1\xA0\x8E" "c\xEF\xBB\xBF" "d"}},
      {R"({"type": "Split", "pattern": {"String": " "}, "behavior": "MergedWithPrevious", "invert": false})",
       "a b  c", {"a ", "b ", " ", "c"}},
      {R"({"type": "Split", "pattern": {"Regex": "\\p{N}{1,3}"}, "behavior": "Isolated", "invert": false})",
       "x12345", {"x", "123", "45"}},
      {R"({"type": "Split", "pattern": {"Regex": "[a-z]+"}, "behavior": "Removed", "invert": true})",
       "ab, cd", {"ab", "cd"}},
      // Metaspace: spaces to "▁", a "▁" before the piece per prepend_scheme, split before each.
      {R"({"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always", "split": true})",
       "a b", {"▁a", "▁b"}},
      {R"({"type": "Metaspace", "replacement": "▁", "prepend_scheme": "never", "split": true})",
       "a b", {"a", "▁b"}},
      {R"({"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first", "split": false})",
       "a b", {"▁a▁b"}},
      {R"({"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first", "split": false})",
       "a b", {"a▁b"}, false},  // Not at the start of the input: no prepend.
      {R"({"type": "Metaspace", "replacement": "▁", "add_prefix_space": false})", "a b", {"a", "▁b"}},
      {R"({"type": "Digits", "individual_digits": false})", "a12b3", {"a", "12", "b", "3"}},
      {R"({"type": "Digits", "individual_digits": true})", "a12", {"a", "1", "2"}},
      {R"({"type": "Punctuation", "behavior": "Isolated"})", "hi!?x", {"hi", "!", "?", "x"}},
      {R"({"type": "Punctuation", "behavior": "Contiguous"})", "hi!?x", {"hi", "!?", "x"}},
      {R"({"type": "Whitespace"})", "Hey  you!!  ok", {"Hey", "you", "!!", "ok"}},
      {R"({"type": "WhitespaceSplit"})", " Hey  you!! ", {"Hey", "you!!"}},
      {R"({"type": "BertPreTokenizer"})", "Hey you!!", {"Hey", "you", "!", "!"}},
      {R"({"type": "Sequence", "pretokenizers": [{"type": "WhitespaceSplit"},
           {"type": "Digits", "individual_digits": true}]})",
       "a1 b", {"a", "1", "b"}},
  };
  for (const PreTokenizerCase& c : cases) {
    auto pre_tokenizer = PreTokenizer::from_json(nlohmann::json::parse(c.json));
    ASSERT_TRUE(pre_tokenizer.ok()) << c.json << ": " << pre_tokenizer.status();
    auto words = pre_tokenizer->apply(c.input, c.at_text_start);
    ASSERT_TRUE(words.ok()) << words.status();
    EXPECT_THAT(*words, ElementsAreArray(c.words)) << c.json << " on \"" << c.input << "\"";
  }
}

TEST(PreTokenizers, RefusesUnknownTypesAndBehaviors) {
  auto unknown = PreTokenizer::from_json({{"type", "UnicodeScripts"}});
  EXPECT_EQ(unknown.status().message(), "unsupported pre_tokenizer UnicodeScripts");
  auto behavior = PreTokenizer::from_json(nlohmann::json::parse(
      R"({"type": "Split", "pattern": {"String": " "}, "behavior": "Sideways", "invert": false})"));
  EXPECT_EQ(behavior.status().message(), "unsupported Split behavior Sideways");
  auto scheme = PreTokenizer::from_json(nlohmann::json::parse(
      R"({"type": "Metaspace", "replacement": "▁", "prepend_scheme": "sometimes"})"));
  EXPECT_EQ(scheme.status().code(), absl::StatusCode::kUnimplemented);
}

}  // namespace
}  // namespace pdserve::engine
