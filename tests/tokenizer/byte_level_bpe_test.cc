// Byte-level BPE tokenizer.json files: a hand-made Llama-3 style one whose encodings are
// worked out by hand below, the minimal 256-byte kind synthetic models use, and bad files.
#include "engine/tokenizer/byte_level_bpe.h"

#include <chrono>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "engine/tokenizer.h"
#include "tests/tokenizer/test_files.h"

namespace pdserve::engine {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing::temp_dir;
using testing::write_all;

// JSON string literal body for a byte-level character (escaping '"' and '\\').
std::string json_char(int byte) {
  const std::string& c = ByteLevelBpe::byte_chars()[byte];
  return c == "\"" || c == "\\" ? "\\" + c : c;
}

std::string byte_vocab() {
  std::string vocab;
  for (int byte = 0; byte < 256; ++byte) {
    if (byte > 0) vocab += ", ";
    vocab += "\"" + json_char(byte) + "\": " + std::to_string(byte);
  }
  return vocab;
}

constexpr const char* kLlama3Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+)";

// Ids: bytes 0..255 (id = byte), merges 256..263, specials 264..266. "Ġ" is the space byte.
// Merge ranks: 0 "Ġ t"->256, 1 "h e"->257, 2 "Ġt he"->258, 3 "l l"->259, 4 "ll o"->260,
// 5 "e llo"->261, 6 "h ello"->262, 7 ["3","4"]->263.
std::string llama3_style_json() {
  return std::string(R"({"version": "1.0",
    "added_tokens": [
      {"id": 264, "content": "<|begin_of_text|>", "special": true},
      {"id": 265, "content": "<|end_of_text|>", "special": true},
      {"id": 266, "content": "<|eot_id|>", "special": true}],
    "normalizer": null,
    "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
      {"type": "Split", "pattern": {"Regex": ")") + kLlama3Pattern + R"("},
       "behavior": "Isolated", "invert": false},
      {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false}]},
    "post_processor": {"type": "Sequence", "processors": [
      {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": false, "use_regex": true},
      {"type": "TemplateProcessing",
       "single": [{"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}},
                  {"Sequence": {"id": "A", "type_id": 0}}]}]},
    "decoder": {"type": "ByteLevel"},
    "model": {"type": "BPE", "byte_fallback": false, "vocab": {)" +
         byte_vocab() + R"(, "Ġt": 256, "he": 257, "Ġthe": 258, "ll": 259, "llo": 260,
      "ello": 261, "hello": 262, "34": 263},
      "merges": ["Ġ t", "h e", "Ġt he", "l l", "ll o", "e llo", "h ello", ["3", "4"]]}})";
}

std::unique_ptr<Tokenizer> load_json(const std::string& json, const std::string& config = "") {
  const auto dir = temp_dir();
  write_all(dir / "tokenizer.json", json);
  if (!config.empty()) write_all(dir / "tokenizer_config.json", config);
  auto tok = load_tokenizer((dir / "tokenizer.json").string());
  EXPECT_TRUE(tok.ok()) << tok.status();
  return tok.ok() ? std::move(tok).value() : nullptr;
}

TEST(ByteLevelBpe, ByteCharsAreGpt2Map) {
  const auto& chars = ByteLevelBpe::byte_chars();
  EXPECT_EQ(chars['A'], "A");
  EXPECT_EQ(chars[' '], "\xC4\xA0");   // Ġ U+0120
  EXPECT_EQ(chars['\n'], "\xC4\x8A");  // Ċ U+010A
  EXPECT_EQ(chars[0], "\xC4\x80");     // Ā U+0100
  EXPECT_EQ(chars[0xAD], "\xC5\x83");  // The soft hyphen is the last shifted byte: U+0143.
  EXPECT_EQ(chars[0xC3], "\xC3\x83");  // Printable Latin-1 stands for itself.
}

TEST(ByteLevelBpe, MergesByRank) {
  auto tok = load_json(llama3_style_json());
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(tok->vocab_size(), 267);
  EXPECT_EQ(tok->bos_id(), 264);  // From the post-processor's template.
  EXPECT_EQ(tok->eos_id(), 265);  // By name: no tokenizer_config.json.
  // "hello": "h e" (rank 1) goes before "l l" (rank 3), then "ll o"; "he llo" is no merge,
  // so the word never reaches "hello" (262) even though it is in the vocab.
  EXPECT_THAT(tok->encode("hello", false).value(), ElementsAre(257, 260));
  // "ello": "l l", "ll o", "e llo".
  EXPECT_THAT(tok->encode("ello", false).value(), ElementsAre(261));
  // " the": "Ġ t", "h e", "Ġt he".
  EXPECT_THAT(tok->encode(" the", false).value(), ElementsAre(258));
}

TEST(ByteLevelBpe, SpecialTokensAndBos) {
  auto tok = load_json(llama3_style_json());
  ASSERT_NE(tok, nullptr);
  // The regex splits "hello the" into "hello" and " the"; special tokens are cut out first.
  const std::vector<int> ids = tok->encode("hello the<|eot_id|>", true).value();
  EXPECT_THAT(ids, ElementsAre(264, 257, 260, 258, 266));
  EXPECT_EQ(tok->decode(ids), "hello the");  // Special tokens decode to nothing.
  EXPECT_THAT(tok->encode("<|eot_id|><|eot_id|>x", false).value(), ElementsAre(266, 266, 'x'));
}

TEST(ByteLevelBpe, RegexSplitsDigitsInThrees) {
  auto tok = load_json(llama3_style_json());
  ASSERT_NE(tok, nullptr);
  // \p{N}{1,3}: "123" and "45" are separate words, so the "3 4" merge cannot apply...
  EXPECT_THAT(tok->encode("12345", false).value(), ElementsAre('1', '2', '3', '4', '5'));
  // ...but within one word it does.
  EXPECT_THAT(tok->encode("345", false).value(), ElementsAre(263, '5'));
}

TEST(ByteLevelBpe, RoundTripsArbitraryText) {
  auto tok = load_json(llama3_style_json());
  ASSERT_NE(tok, nullptr);
  for (const std::string& text :
       {std::string("Hello, world!  It's 2024.\n\n\tTabs\r\n"),
        std::string("caf\xC3\xA9 \xE4\xB8\x96\xE7\x95\x8C \xF0\x9F\x98\x80\xF0\x9F\x8E\x89"),
        std::string("   "), std::string("\"quoted\\\" <|end_of_text|> done")}) {
    auto ids = tok->encode(text, false);
    ASSERT_TRUE(ids.ok()) << ids.status();
    std::string decoded;
    for (size_t i = 0; i < ids->size(); ++i) {
      decoded += tok->decode_token(i == 0 ? -1 : (*ids)[i - 1], (*ids)[i]);
    }
    // The special token in the last text is dropped on decode.
    std::string expected = text;
    if (const size_t at = expected.find("<|end_of_text|>"); at != std::string::npos) {
      expected.erase(at, 15);
    }
    EXPECT_EQ(decoded, expected);
  }
  // "é" is two bytes, two byte tokens: C3 and A9.
  EXPECT_THAT(tok->encode("\xC3\xA9", false).value(), ElementsAre(0xC3, 0xA9));
  EXPECT_EQ(tok->decode_token(-1, 0xC3), "\xC3");  // Half a character: bytes, not text.
}

TEST(ByteLevelBpe, EncodesLongTextQuickly) {
  auto tok = load_json(llama3_style_json());
  ASSERT_NE(tok, nullptr);
  std::string text;
  while (text.size() < 100000) text += "hello the 12345, caf\xC3\xA9!\n  ello <|eot_id|>";
  const auto start = std::chrono::steady_clock::now();
  auto ids = tok->encode(text, false);
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  ASSERT_TRUE(ids.ok());
  EXPECT_LT(ms, 2000.0);  // Generous for a loaded machine; typically a few tens of ms.
}

TEST(ByteLevelBpe, RejectsInvalidUtf8) {
  auto tok = load_json(llama3_style_json());
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(tok->encode("abc\x80", false).status().code(), absl::StatusCode::kInvalidArgument);
}

// What make-model writes for synthetic models: 256 byte tokens, two specials, no merges.
std::string minimal_json(bool gpt2_regex) {
  return std::string(R"({"version": "1.0",
    "added_tokens": [{"id": 256, "content": "<s>", "special": true},
                     {"id": 257, "content": "</s>", "special": true}],
    "normalizer": null,
    "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "use_regex": )") +
         (gpt2_regex ? "true" : "false") + R"(},
    "post_processor": null,
    "decoder": {"type": "ByteLevel"},
    "model": {"type": "BPE", "vocab": {)" + byte_vocab() + R"(}, "merges": []}})";
}

TEST(ByteLevelBpe, MinimalByteTokenizer) {
  for (bool gpt2_regex : {true, false}) {
    auto tok = load_json(minimal_json(gpt2_regex),
                         R"({"bos_token": "<s>", "eos_token": {"content": "</s>"}, "add_bos_token": true})");
    ASSERT_NE(tok, nullptr);
    EXPECT_EQ(tok->vocab_size(), 258);
    EXPECT_EQ(tok->bos_id(), 256);
    EXPECT_EQ(tok->eos_id(), 257);
    const std::string text = "Hi there, \xC3\xA9!";
    const std::vector<int> ids = tok->encode(text, true).value();
    ASSERT_EQ(ids.size(), text.size() + 1);
    EXPECT_EQ(ids[0], 256);
    for (size_t i = 0; i < text.size(); ++i) EXPECT_EQ(ids[i + 1], static_cast<unsigned char>(text[i]));
    EXPECT_EQ(tok->decode(ids), text);
  }
}

TEST(ByteLevelBpe, ConfigCanTurnBosOff) {
  auto tok = load_json(minimal_json(true), R"({"bos_token": "<s>", "eos_token": "</s>", "add_bos_token": false})");
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(tok->bos_id(), 256);
  EXPECT_THAT(tok->encode("a", true).value(), ElementsAre('a'));
}

TEST(ByteLevelBpe, Gpt2StylePostProcessorAddsNoBos) {
  // GPT-2: a ByteLevel post-processor with no template, and a config that names a BOS
  // without add_bos_token: HF adds no BOS, so neither does encode.
  std::string json = minimal_json(true);
  json.replace(json.find("\"post_processor\": null"), 22,
               R"("post_processor": {"type": "ByteLevel", "add_prefix_space": false})");
  auto tok = load_json(json, R"({"bos_token": "<s>", "eos_token": "</s>"})");
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(tok->bos_id(), 256);
  EXPECT_THAT(tok->encode("a", true).value(), ElementsAre('a'));
}

// A Split on "-" with the given behavior, and merges "a -" -> 256, "- b" -> 257, which show
// which side of the split each "-" ended up on.
std::string dash_split_json(const std::string& behavior) {
  return R"({"pre_tokenizer": {"type": "Sequence", "pretokenizers": [
      {"type": "Split", "pattern": {"String": "-"}, "behavior": ")" + behavior + R"(", "invert": false},
      {"type": "ByteLevel", "add_prefix_space": false, "use_regex": false}]},
    "model": {"type": "BPE", "vocab": {)" + byte_vocab() + R"(, "a-": 256, "-b": 257},
      "merges": ["a -", "- b"]}})";
}

TEST(ByteLevelBpe, SplitBehaviors) {
  const auto encode = [](const std::string& behavior) {
    auto tok = load_json(dash_split_json(behavior));
    return tok ? tok->encode("a-b", false).value() : std::vector<int>{};
  };
  EXPECT_THAT(encode("Isolated"), ElementsAre('a', '-', 'b'));
  EXPECT_THAT(encode("Removed"), ElementsAre('a', 'b'));
  EXPECT_THAT(encode("MergedWithPrevious"), ElementsAre(256, 'b'));
  EXPECT_THAT(encode("MergedWithNext"), ElementsAre('a', 257));
}

TEST(ByteLevelBpe, BadFilesGiveErrors) {
  const auto dir = temp_dir();
  const std::string path = (dir / "tokenizer.json").string();
  const auto load_error = [&](const std::string& json) {
    write_all(path, json);
    auto tok = load_tokenizer(path);
    EXPECT_FALSE(tok.ok());
    if (!tok.ok()) {
      EXPECT_THAT(std::string(tok.status().message()), HasSubstr(path));
    }
    return tok.status().code();
  };
  std::string json = llama3_style_json();
  load_error(json.substr(0, json.size() / 2));  // Truncated.
  load_error(R"({"model": {"type": "BPE", "vocab": {"a": "zero"}, "merges": []}})");  // Wrong type.
  load_error(R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}})");  // No byte pieces.
  // Ids that are no int: negative, fractional, beyond int's range (a float that the fuzzer found
  // made the conversion undefined behaviour), in the vocab and among the added tokens.
  for (const char* id : {"-1", "1.5", "5.11111e+102", "2147483648", "18446744073709551615"}) {
    EXPECT_EQ(load_error(absl::StrCat(R"({"model": {"type": "BPE", "vocab": {"a": )", id, R"(}, "merges": []}})")),
              absl::StatusCode::kInvalidArgument)
        << id;
    std::string added = minimal_json(true);
    added.replace(added.find(R"("id": 256)"), 9, absl::StrCat(R"("id": )", id));
    EXPECT_EQ(load_error(added), absl::StatusCode::kInvalidArgument) << id;
  }
  std::string bad_merge = minimal_json(true);
  bad_merge.replace(bad_merge.find("\"merges\": []"), 12, R"("merges": ["a b"])");
  load_error(bad_merge);  // "ab" is not in the vocab.
  std::string bad_regex = llama3_style_json();
  bad_regex.replace(bad_regex.find("(?i:"), 4, "((?i:");
  load_error(bad_regex);
  EXPECT_EQ(load_error(R"({"model": {"type": "WordPiece", "vocab": {}}})"),
            absl::StatusCode::kUnimplemented);
}

}  // namespace
}  // namespace pdserve::engine
