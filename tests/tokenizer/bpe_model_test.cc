// The BPE model on hand-made vocabularies: merge order, ignore_merges, byte fallback, the
// unknown token with and without fuse_unk, continuing_subword_prefix / end_of_word_suffix.
#include "engine/tokenizer/bpe_model.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace pdserve::engine {
namespace {

using ::testing::ElementsAre;

std::vector<int> encode(const std::string& model_json, const std::string& word) {
  auto model = BpeModel::from_json(nlohmann::json::parse(model_json));
  EXPECT_TRUE(model.ok()) << model.status();
  std::vector<int> ids;
  if (model.ok()) EXPECT_TRUE((*model)->encode_word(word, ids).ok());
  return ids;
}

TEST(BpeModel, MergesByRankLeftmostFirst) {
  const std::string model = R"({"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2, "aa": 3, "aab": 4},
      "merges": ["a b", "a a", "aa b"]})";
  // "a b" (rank 0) before "a a": "aab" -> a + ab, never aab.
  EXPECT_THAT(encode(model, "aab"), ElementsAre(0, 2));
  // Equal ranks go leftmost first: "aaa" -> aa + a.
  EXPECT_THAT(encode(model, "aaa"), ElementsAre(3, 0));
}

TEST(BpeModel, IgnoreMergesTakesWholeWords) {
  const std::string vocab = R"("vocab": {"a": 0, "b": 1, "ab": 2, "aa": 3, "aab": 4}, "merges": ["a b", "a a", "aa b"])";
  EXPECT_THAT(encode(R"({"type": "BPE", "ignore_merges": true, )" + vocab + "}", "aab"), ElementsAre(4));
  EXPECT_THAT(encode(R"({"type": "BPE", "ignore_merges": false, )" + vocab + "}", "aab"), ElementsAre(0, 2));
}

TEST(BpeModel, ByteFallbackAndUnknowns) {
  const std::string bytes = R"("<0xC3>": 10, "<0xA9>": 11)";
  // é is no piece: its bytes.
  EXPECT_THAT(encode(R"({"type": "BPE", "byte_fallback": true, "unk_token": "<unk>",
                         "vocab": {"<unk>": 0, "a": 1, )" + bytes + R"(}, "merges": []})",
                     "a\xC3\xA9"),
              ElementsAre(1, 10, 11));
  // Without byte pieces for it, ü is unknown; consecutive unknowns fuse only with fuse_unk.
  const std::string unk = R"("unk_token": "<unk>", "vocab": {"<unk>": 0, "a": 1}, "merges": [])";
  EXPECT_THAT(encode(R"({"type": "BPE", "fuse_unk": true, )" + unk + "}", "a\xC3\xBC\xC3\xBC" "a"),
              ElementsAre(1, 0, 1));
  EXPECT_THAT(encode(R"({"type": "BPE", "fuse_unk": false, )" + unk + "}", "a\xC3\xBC\xC3\xBC" "a"),
              ElementsAre(1, 0, 0, 1));
  // No unk_token: unknown characters are dropped, as in the library.
  EXPECT_THAT(encode(R"({"type": "BPE", "vocab": {"a": 1}, "merges": []})", "a\xC3\xBC"), ElementsAre(1));
}

TEST(BpeModel, SubwordPrefixAndSuffix) {
  // Characters after the first carry "##", the last one "</w>"; a merge drops the right
  // side's prefix.
  const std::string model = R"({"type": "BPE", "continuing_subword_prefix": "##", "end_of_word_suffix": "</w>",
      "vocab": {"a": 0, "##b": 1, "##c</w>": 2, "ab": 3, "ab##c</w>": 4, "abc</w>": 5},
      "merges": ["a ##b", "ab ##c</w>"]})";
  EXPECT_THAT(encode(model, "abc"), ElementsAre(5));
}

TEST(BpeModel, BadModelsFail) {
  for (const char* json : {
           R"({"type": "BPE", "vocab": {"a": 0}, "merges": ["a b"]})",        // Unknown piece.
           R"({"type": "BPE", "vocab": {"a": 0}, "merges": ["a"]})",          // Malformed merge.
           R"({"type": "BPE", "vocab": {"a": 0}, "unk_token": "<unk>"})",    // unk not in vocab.
           R"({"type": "BPE", "vocab": {"a": 1.5}})",                         // Fractional id.
       }) {
    EXPECT_EQ(BpeModel::from_json(nlohmann::json::parse(json)).status().code(),
              absl::StatusCode::kInvalidArgument)
        << json;
  }
  EXPECT_EQ(BpeModel::from_json(nlohmann::json::parse(R"({"type": "BPE", "vocab": {}, "dropout": 0.5})"))
                .status().code(),
            absl::StatusCode::kUnimplemented);
}

}  // namespace
}  // namespace pdserve::engine
