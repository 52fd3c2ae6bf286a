// tokenizer.json files through load_tokenizer: a hand-made Llama-3 style byte-level BPE whose
// encodings are worked out by hand below, the minimal 256-byte kind synthetic models use,
// miniatures of Qwen3 (NFC), Gemma-3 (no dummy prefix) and Llama-2 (Prepend, byte fallback,
// Strip decoder), transformers' BOS/EOS rule, and bad or unsupported files.
#include "engine/tokenizer/hf_tokenizer.h"

#include <chrono>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "engine/tokenizer.h"
#include "engine/tokenizer/byte_level_alphabet.h"
#include "tests/tokenizer/test_files.h"

namespace pdserve::engine {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing::temp_dir;
using testing::write_all;

// JSON string literal body for a byte-level character (escaping '"' and '\\').
std::string json_char(int byte) {
  const std::string& c = byte_level::byte_chars()[byte];
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
                  {"Sequence": {"id": "A", "type_id": 0}}],
       "special_tokens": {"<|begin_of_text|>": {"id": "<|begin_of_text|>", "ids": [264],
                                                "tokens": ["<|begin_of_text|>"]}}}]},
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

TEST(HfTokenizerByteLevel, ByteCharsAreGpt2Map) {
  const auto& chars = byte_level::byte_chars();
  EXPECT_EQ(chars['A'], "A");
  EXPECT_EQ(chars[' '], "\xC4\xA0");   // Ġ U+0120
  EXPECT_EQ(chars['\n'], "\xC4\x8A");  // Ċ U+010A
  EXPECT_EQ(chars[0], "\xC4\x80");     // Ā U+0100
  EXPECT_EQ(chars[0xAD], "\xC5\x83");  // The soft hyphen is the last shifted byte: U+0143.
  EXPECT_EQ(chars[0xC3], "\xC3\x83");  // Printable Latin-1 stands for itself.
}

TEST(HfTokenizerByteLevel, MergesByRank) {
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

TEST(HfTokenizerByteLevel, SpecialTokensAndBos) {
  auto tok = load_json(llama3_style_json());
  ASSERT_NE(tok, nullptr);
  // The regex splits "hello the" into "hello" and " the"; special tokens are cut out first.
  const std::vector<int> ids = tok->encode("hello the<|eot_id|>", true).value();
  EXPECT_THAT(ids, ElementsAre(264, 257, 260, 258, 266));
  EXPECT_EQ(tok->decode(ids), "hello the");  // Special tokens decode to nothing.
  EXPECT_THAT(tok->encode("<|eot_id|><|eot_id|>x", false).value(), ElementsAre(266, 266, 'x'));
}

TEST(HfTokenizerByteLevel, RegexSplitsDigitsInThrees) {
  auto tok = load_json(llama3_style_json());
  ASSERT_NE(tok, nullptr);
  // \p{N}{1,3}: "123" and "45" are separate words, so the "3 4" merge cannot apply...
  EXPECT_THAT(tok->encode("12345", false).value(), ElementsAre('1', '2', '3', '4', '5'));
  // ...but within one word it does.
  EXPECT_THAT(tok->encode("345", false).value(), ElementsAre(263, '5'));
}

TEST(HfTokenizerByteLevel, RoundTripsArbitraryText) {
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

TEST(HfTokenizerByteLevel, EncodesLongTextQuickly) {
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

TEST(HfTokenizerByteLevel, RejectsInvalidUtf8) {
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

TEST(HfTokenizerByteLevel, MinimalByteTokenizer) {
  for (bool gpt2_regex : {true, false}) {
    auto tok = load_json(minimal_json(gpt2_regex),
                         R"({"bos_token": "<s>", "eos_token": {"content": "</s>"}, "add_bos_token": true})");
    ASSERT_NE(tok, nullptr);
    EXPECT_EQ(tok->vocab_size(), 258);
    EXPECT_EQ(tok->bos_id(), 256);
    EXPECT_EQ(tok->eos_id(), 257);
    const std::string text = "Hi there, \xC3\xA9!";
    // No post-processor and no Llama-style class: transformers adds no BOS, add_bos_token or not.
    const std::vector<int> ids = tok->encode(text, true).value();
    ASSERT_EQ(ids.size(), text.size());
    for (size_t i = 0; i < text.size(); ++i) EXPECT_EQ(ids[i], static_cast<unsigned char>(text[i]));
    EXPECT_EQ(tok->decode(ids), text);
  }
}

// transformers' Llama / Gemma / CodeLlama fast tokenizers rebuild the post-processor from
// add_bos_token / add_eos_token (defaults true / false), whatever the file's says.
TEST(HfTokenizerByteLevel, LlamaClassesRebuildThePostProcessor) {
  const auto encode = [](const std::string& json, const std::string& config) {
    auto tok = load_json(json, config);
    return tok ? tok->encode("a", true).value() : std::vector<int>{-1};
  };
  const std::string plain = minimal_json(true);
  EXPECT_THAT(encode(plain, R"({"tokenizer_class": "LlamaTokenizerFast", "bos_token": "<s>"})"),
              ElementsAre(256, 'a'));
  EXPECT_THAT(encode(plain, R"({"tokenizer_class": "GemmaTokenizer", "bos_token": "<s>",
                                "eos_token": "</s>", "add_eos_token": true})"),
              ElementsAre(256, 'a', 257));
  // The file's template adds BOS; the config turns it off.
  EXPECT_THAT(encode(llama3_style_json(), R"({"tokenizer_class": "LlamaTokenizer",
                                              "bos_token": "<|begin_of_text|>", "add_bos_token": false})"),
              ElementsAre('a'));
  // Other classes keep the file's post-processor: add_bos_token does not matter.
  EXPECT_THAT(encode(llama3_style_json(), R"({"tokenizer_class": "PreTrainedTokenizerFast",
                                              "add_bos_token": false})"),
              ElementsAre(264, 'a'));
  // add_bos_token without a BOS token is an error, as in transformers.
  const auto dir = temp_dir();
  write_all(dir / "tokenizer.json", plain);
  write_all(dir / "tokenizer_config.json", R"({"tokenizer_class": "LlamaTokenizerFast", "bos_token": null})");
  EXPECT_EQ(load_tokenizer((dir / "tokenizer.json").string()).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(HfTokenizerByteLevel, Gpt2StylePostProcessorAddsNoBos) {
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

TEST(HfTokenizerByteLevel, SplitBehaviors) {
  const auto encode = [](const std::string& behavior) {
    auto tok = load_json(dash_split_json(behavior));
    return tok ? tok->encode("a-b", false).value() : std::vector<int>{};
  };
  EXPECT_THAT(encode("Isolated"), ElementsAre('a', '-', 'b'));
  EXPECT_THAT(encode("Removed"), ElementsAre('a', 'b'));
  EXPECT_THAT(encode("MergedWithPrevious"), ElementsAre(256, 'b'));
  EXPECT_THAT(encode("MergedWithNext"), ElementsAre('a', 257));
  EXPECT_THAT(encode("Contiguous"), ElementsAre('a', '-', 'b'));
}

TEST(HfTokenizerByteLevel, BadFilesGiveErrors) {
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
  // Ids that are no int: negative, fractional, beyond int's range (a float that the fuzzer found
  // made the conversion undefined behaviour), and ids past kMaxTokenIds (2^22; the fuzzer's
  // 2147483647 made the dense id tables allocate gigabytes), in the vocab and among the added
  // tokens.
  for (const char* id : {"-1", "1.5", "5.11111e+102", "2147483648", "18446744073709551615",
                         "2147483647", "4194304"}) {
    EXPECT_EQ(load_error(absl::StrCat(R"({"model": {"type": "BPE", "vocab": {"a": )", id, R"(}, "merges": []}})")),
              absl::StatusCode::kInvalidArgument)
        << id;
    std::string added = minimal_json(true);
    added.replace(added.find(R"("id": 256)"), 9, absl::StrCat(R"("id": )", id));
    EXPECT_EQ(load_error(added), absl::StatusCode::kInvalidArgument) << id;
  }
  std::string last_id = minimal_json(true);  // The largest id loads.
  last_id.replace(last_id.find(R"("id": 256)"), 9, R"("id": 4194303)");
  write_all(path, last_id);
  auto sparse = load_tokenizer(path);
  ASSERT_TRUE(sparse.ok()) << sparse.status();
  EXPECT_EQ((*sparse)->vocab_size(), 4194304);
  std::string bad_merge = minimal_json(true);
  bad_merge.replace(bad_merge.find("\"merges\": []"), 12, R"("merges": ["a b"])");
  load_error(bad_merge);  // "ab" is not in the vocab.
  std::string bad_regex = llama3_style_json();
  bad_regex.replace(bad_regex.find("(?i:"), 4, "((?i:");
  load_error(bad_regex);
  EXPECT_EQ(load_error(R"({"model": {"type": "WordLevel", "vocab": {}}})"),
            absl::StatusCode::kUnimplemented);
}

// What a file asks for and this does not implement is refused at load, naming the component.
TEST(HfTokenizerByteLevel, UnsupportedComponentsAreRefusedByName) {
  const auto dir = temp_dir();
  const std::string path = (dir / "tokenizer.json").string();
  const std::string base = minimal_json(true);
  const struct {
    const char* from;
    const char* to;
    const char* message;
  } cases[] = {
      {R"("normalizer": null)", R"("normalizer": {"type": "Precompiled", "precompiled_charsmap": ""})",
       "unsupported normalizer Precompiled"},
      {R"("normalizer": null)", R"("normalizer": {"type": "Sequence", "normalizers": [{"type": "NFC"}, {"type": "Nmt"}]})",
       "unsupported normalizer Nmt"},
      {R"("pre_tokenizer": {)", R"("pre_tokenizer": {"type": "UnicodeScripts"}, "unused": {)",
       "unsupported pre_tokenizer UnicodeScripts"},
      {R"("post_processor": null)", R"("post_processor": {"type": "Fancy"})",
       "unsupported post_processor Fancy"},
      {R"("decoder": {"type": "ByteLevel"})", R"("decoder": {"type": "CTC"})", "unsupported decoder CTC"},
      {R"("decoder": {"type": "ByteLevel"})",
       R"("decoder": {"type": "Sequence", "decoders": [{"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 0, "stop": 1}]})",
       "unsupported decoder Strip after the tokens are joined"},
      {R"("merges": [])", R"("merges": [], "dropout": 0.1)", "unsupported BPE dropout"},
  };
  for (const auto& c : cases) {
    std::string json = base;
    ASSERT_NE(json.find(c.from), std::string::npos) << c.from;
    json.replace(json.find(c.from), std::string(c.from).size(), c.to);
    write_all(path, json);
    auto tok = load_tokenizer(path);
    ASSERT_FALSE(tok.ok()) << c.message;
    EXPECT_EQ(tok.status().code(), absl::StatusCode::kUnimplemented) << tok.status();
    EXPECT_THAT(std::string(tok.status().message()), HasSubstr(c.message));
    EXPECT_THAT(std::string(tok.status().message()), HasSubstr(path));
  }
}

// Qwen3's shape: an NFC normalizer before the byte-level split, so a decomposed accent
// ("e" + U+0301) encodes as the precomposed "é" (bytes C3 A9) does.
TEST(HfTokenizerByteLevel, NfcNormalizerComposes) {
  std::string json = minimal_json(false);
  json.replace(json.find(R"("normalizer": null)"), 18, R"("normalizer": {"type": "NFC"})");
  auto tok = load_json(json);
  ASSERT_NE(tok, nullptr);
  EXPECT_THAT(tok->encode("e\xCC\x81", false).value(), ElementsAre(0xC3, 0xA9));
  EXPECT_EQ(tok->encode("e\xCC\x81", false).value(), tok->encode("\xC3\xA9", false).value());
}

// SentencePiece-converted vocabularies: "▁" spaces, byte pieces <0x00>..<0xFF> at ids 3..258.
std::string sentencepiece_vocab(const std::string& extra) {
  std::string vocab = R"("<unk>": 0, "<s>": 1, "</s>": 2)";
  for (int byte = 0; byte < 256; ++byte) {
    char piece[16];
    std::snprintf(piece, sizeof(piece), "<0x%02X>", byte);
    vocab += ", \"" + std::string(piece) + "\": " + std::to_string(3 + byte);
  }
  return vocab + ", " + extra;
}

constexpr const char* kSentencePieceAdded = R"("added_tokens": [
      {"id": 0, "content": "<unk>", "special": true, "normalized": false},
      {"id": 1, "content": "<s>", "special": true, "normalized": false},
      {"id": 2, "content": "</s>", "special": true, "normalized": false}])";

constexpr const char* kBosTemplate = R"({"type": "TemplateProcessing",
      "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
      "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}})";

// A miniature of Llama-2's tokenizer.json: Prepend "▁" and Replace " " by "▁", byte fallback,
// merges by rank, and a decoder that strips the prepended space again.
std::string llama2_style_json() {
  return std::string("{") + kSentencePieceAdded + R"(,
    "normalizer": {"type": "Sequence", "normalizers": [
      {"type": "Prepend", "prepend": "▁"},
      {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]},
    "pre_tokenizer": null,
    "post_processor": )" + kBosTemplate + R"(,
    "decoder": {"type": "Sequence", "decoders": [
      {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
      {"type": "ByteFallback"}, {"type": "Fuse"},
      {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
    "model": {"type": "BPE", "unk_token": "<unk>", "byte_fallback": true, "fuse_unk": true,
      "vocab": {)" + sentencepiece_vocab(R"("▁": 259, "h": 260, "i": 261, "▁h": 262, "▁hi": 263)") + R"(},
      "merges": ["▁ h", "▁h i"]}})";
}

TEST(HfTokenizerSentencePiece, Llama2Style) {
  auto tok = load_json(llama2_style_json(),
                       R"({"tokenizer_class": "LlamaTokenizer", "bos_token": "<s>", "eos_token": "</s>"})");
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(tok->bos_id(), 1);
  EXPECT_EQ(tok->eos_id(), 2);
  // "▁hi", then "▁" and the four bytes of U+1F600.
  const std::string text = "hi \xF0\x9F\x98\x80";
  const std::vector<int> ids = tok->encode(text, true).value();
  EXPECT_THAT(ids, ElementsAre(1, 263, 259, 243, 162, 155, 131));
  EXPECT_EQ(tok->decode(ids), text);
  // Each segment between added tokens is normalized on its own: both get the "▁" prefix...
  const std::vector<int> split = tok->encode("hi</s>hi", false).value();
  EXPECT_THAT(split, ElementsAre(263, 2, 263));
  // ...and decoding skips the special token before the decoders run, so only the text's
  // first space is stripped.
  EXPECT_EQ(tok->decode(split), "hi hi");
  // Streaming: after -1 or a special token the piece is the text's first.
  EXPECT_EQ(tok->decode_token(-1, 263), "hi");
  EXPECT_EQ(tok->decode_token(1, 263), "hi");
  EXPECT_EQ(tok->decode_token(263, 263), " hi");
  EXPECT_EQ(tok->decode_token(263, 1), "");
}

// Gemma-3's shape: spaces become "▁" in the normalizer, a Split on " " (which no longer
// occurs), and no Prepend: unlike Llama-2 there is no dummy prefix.
TEST(HfTokenizerSentencePiece, Gemma3StyleHasNoDummyPrefix) {
  const std::string json = std::string("{") + kSentencePieceAdded + R"(,
    "normalizer": {"type": "Replace", "pattern": {"String": " "}, "content": "▁"},
    "pre_tokenizer": {"type": "Split", "pattern": {"String": " "}, "behavior": "MergedWithPrevious", "invert": false},
    "post_processor": )" + kBosTemplate + R"(,
    "decoder": {"type": "Sequence", "decoders": [
      {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
      {"type": "ByteFallback"}, {"type": "Fuse"}]},
    "model": {"type": "BPE", "unk_token": "<unk>", "byte_fallback": true, "fuse_unk": true,
      "vocab": {)" + sentencepiece_vocab(R"("▁": 259, "h": 260, "i": 261, "▁h": 262, "▁hi": 263, "hi": 264)") + R"(},
      "merges": ["▁ h", "▁h i", "h i"]}})";
  auto tok = load_json(json, R"({"tokenizer_class": "GemmaTokenizer", "bos_token": "<s>", "add_bos_token": true})");
  ASSERT_NE(tok, nullptr);
  const std::vector<int> ids = tok->encode("hi hi", true).value();
  EXPECT_THAT(ids, ElementsAre(1, 264, 263));
  EXPECT_EQ(tok->decode(ids), "hi hi");
  EXPECT_THAT(tok->encode(" hi", false).value(), ElementsAre(263));
}

// A Unigram model (T5-style): the best-scoring segmentation, unknown characters as <unk>.
TEST(HfTokenizerUnigram, ViterbiSegmentation) {
  const std::string json = R"({"added_tokens": [{"id": 0, "content": "<unk>", "special": true}],
    "normalizer": null,
    "pre_tokenizer": {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always", "split": true},
    "decoder": {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always", "split": true},
    "model": {"type": "Unigram", "unk_id": 0, "vocab": [["<unk>", 0.0], ["▁", -2.0], ["▁ab", -3.0],
      ["▁a", -1.0], ["b", -1.5], ["ab", -0.5], ["c", -4.0]]}})";
  auto tok = load_json(json);
  ASSERT_NE(tok, nullptr);
  // "▁ab": "▁" + "ab" and "▁a" + "b" both score -2.5, beating "▁ab" (-3); the lattice is
  // filled from the left, "▁" + "ab" reaches the end first, and a tie keeps the first.
  EXPECT_THAT(tok->encode("ab", false).value(), ElementsAre(1, 5));
  // "d" and "e" are unknown; adjacent unknowns fuse into one <unk>.
  EXPECT_THAT(tok->encode("cde", false).value(), ElementsAre(1, 6, 0));
  EXPECT_EQ(tok->decode({3, 4, 1, 6}), "ab c");
}

// BERT's shape: BertNormalizer, BertPreTokenizer, WordPiece, [CLS] A [SEP], WordPiece decoder.
TEST(HfTokenizerWordPiece, BertStyle) {
  const std::string json = R"({"added_tokens": [
      {"id": 0, "content": "[UNK]", "special": true}, {"id": 1, "content": "[CLS]", "special": true},
      {"id": 2, "content": "[SEP]", "special": true}],
    "normalizer": {"type": "BertNormalizer", "clean_text": true, "handle_chinese_chars": true,
                   "strip_accents": null, "lowercase": true},
    "pre_tokenizer": {"type": "BertPreTokenizer"},
    "post_processor": {"type": "BertProcessing", "sep": ["[SEP]", 2], "cls": ["[CLS]", 1]},
    "decoder": {"type": "WordPiece", "prefix": "##", "cleanup": true},
    "model": {"type": "WordPiece", "unk_token": "[UNK]", "continuing_subword_prefix": "##",
      "max_input_chars_per_word": 100,
      "vocab": {"[UNK]": 0, "[CLS]": 1, "[SEP]": 2, "un": 3, "##aff": 4, "##able": 5, "hi": 6, "!": 7}}})";
  auto tok = load_json(json);
  ASSERT_NE(tok, nullptr);
  // Lowercased and accents stripped; "unaffable" longest-first: un ##aff ##able; "xyz" has no
  // pieces and is [UNK] as a whole.
  const std::vector<int> ids = tok->encode("Unaff\xC3\xA1" "ble hi! xyz", true).value();
  EXPECT_THAT(ids, ElementsAre(1, 3, 4, 5, 6, 7, 0, 2));
  EXPECT_EQ(tok->decode({3, 4, 5, 6, 7}), "unaffable hi!");
}

}  // namespace
}  // namespace pdserve::engine
