// tokenizer.json normalizers, one table row per behaviour: the normalizer JSON, an input and
// what the tokenizers library makes of it.
#include "engine/tokenizer/normalizers.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace pdserve::engine {
namespace {

struct NormalizerCase {
  const char* json;
  const char* input;
  const char* expected;
};

TEST(Normalizers, Table) {
  const NormalizerCase cases[] = {
      {"null", "A b", "A b"},
      // NFC composes e + U+0301 into é; NFD decomposes é; the K forms fold compatibility
      // characters (the "ﬁ" ligature, superscript two).
      {R"({"type": "NFC"})", "caf" "e\xCC\x81", "caf\xC3\xA9"},
      {R"({"type": "NFD"})", "caf\xC3\xA9", "cafe\xCC\x81"},
      {R"({"type": "NFKC"})", "\xEF\xAC\x81" "x\xC2\xB2", "fix2"},
      {R"({"type": "NFKD"})", "\xEF\xAC\x81\xC3\xA9", "fie\xCC\x81"},
      {R"({"type": "NFC"})", "\xEF\xAC\x81", "\xEF\xAC\x81"},  // NFC keeps the ligature.
      {R"({"type": "Replace", "pattern": {"String": " "}, "content": "▁"})", " a  b", "▁a▁▁b"},
      {R"({"type": "Replace", "pattern": {"Regex": " {2,}"}, "content": " "})", "a   b c", "a b c"},
      {R"({"type": "Prepend", "prepend": "▁"})", "a", "▁a"},
      {R"({"type": "Prepend", "prepend": "▁"})", "", ""},  // Nothing to prepend to.
      {R"({"type": "Strip", "strip_left": true, "strip_right": false})", " \t a \n", "a \n"},
      {R"({"type": "Strip", "strip_left": true, "strip_right": true})", "\xE3\x80\x80 a \n", "a"},
      {R"({"type": "Lowercase"})", "ÀB\xCE\xA3", "àb\xCF\x82"},  // Final sigma: ς.
      {R"({"type": "Lowercase"})", "\xCE\xA3\xCE\x91", "\xCF\x83\xCE\xB1"},  // Not final: σ.
      {R"({"type": "Lowercase"})", "\xC4\xB0", "i\xCC\x87"},  // İ -> i + combining dot.
      {R"({"type": "StripAccents"})", "cafe\xCC\x81", "cafe"},
      {R"({"type": "BertNormalizer", "clean_text": true, "handle_chinese_chars": true,
           "strip_accents": null, "lowercase": true})",
       "H\xC3\xA9llo\t\x01\xE4\xB8\x96", "hello  \xE4\xB8\x96 "},
      {R"({"type": "BertNormalizer", "clean_text": false, "handle_chinese_chars": false,
           "strip_accents": false, "lowercase": true})",
       "H\xC3\xA9", "h\xC3\xA9"},
      {R"({"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "▁"},
           {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]})",
       "a b", "▁a▁b"},
  };
  for (const NormalizerCase& c : cases) {
    auto normalizer = Normalizer::from_json(nlohmann::json::parse(c.json));
    ASSERT_TRUE(normalizer.ok()) << c.json << ": " << normalizer.status();
    auto out = normalizer->apply(c.input);
    ASSERT_TRUE(out.ok()) << out.status();
    EXPECT_EQ(*out, c.expected) << c.json << " on \"" << c.input << "\"";
  }
}

TEST(Normalizers, RefusesUnknownTypesByName) {
  for (const char* type : {"Precompiled", "Nmt", "ByteLevel"}) {
    auto normalizer = Normalizer::from_json({{"type", type}});
    ASSERT_FALSE(normalizer.ok()) << type;
    EXPECT_EQ(normalizer.status().code(), absl::StatusCode::kUnimplemented);
    EXPECT_EQ(normalizer.status().message(), std::string("unsupported normalizer ") + type);
  }
  EXPECT_EQ(Normalizer::from_json({{"type", "Replace"}, {"content", "x"}}).status().code(),
            absl::StatusCode::kInvalidArgument);  // No pattern.
}

}  // namespace
}  // namespace pdserve::engine
