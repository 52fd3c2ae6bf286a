// tokenizer.json decoders, one table row per behaviour: the decoder JSON, token pieces (the
// first is the text's first) and the text the tokenizers library decodes them to.
#include "engine/tokenizer/decoders.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace pdserve::engine {
namespace {

struct DecoderCase {
  const char* json;
  std::vector<std::string> pieces;
  const char* expected;
};

std::string decode_all(const Decoder& decoder, const std::vector<std::string>& pieces) {
  std::string out;
  for (size_t i = 0; i < pieces.size(); ++i) out += decoder.decode(pieces[i], i == 0, false).value();
  return out;
}

TEST(Decoders, Table) {
  const DecoderCase cases[] = {
      {"null", {"a", "b"}, "a b"},  // No decoder: the library joins with spaces.
      {R"({"type": "ByteLevel"})", {"Hi", "Ġthere", "Ċ", "Ã©"}, "Hi there\n\xC3\xA9"},
      // A piece outside the alphabet is taken as text.
      {R"({"type": "ByteLevel"})", {"\xE4\xB8\x96"}, "\xE4\xB8\x96"},
      {R"({"type": "ByteFallback"})", {"<0xE4>", "<0xB8>", "<0x96>", "<0xZZ>"}, "\xE4\xB8\x96<0xZZ>"},
      {R"({"type": "Fuse"})", {"a", "b"}, "ab"},
      // Before Fuse, Strip acts on each token; after it, on the joined string's start.
      {R"({"type": "Strip", "content": " ", "start": 1, "stop": 1})", {" a ", "  b"}, "a b"},
      {R"({"type": "Sequence", "decoders": [{"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}]})",
       {" a", " b"}, "a b"},
      {R"({"type": "Replace", "pattern": {"String": "▁"}, "content": " "})", {"▁a▁", "b"}, " a b"},
      {R"({"type": "Replace", "pattern": {"Regex": "_+"}, "content": "-"})", {"a__b", "_"}, "a-b-"},
      // Metaspace drops every replacement of the first token (prepend_scheme always / first).
      {R"({"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always"})", {"▁▁a", "▁b"}, "a b"},
      {R"({"type": "Metaspace", "replacement": "▁", "prepend_scheme": "never"})", {"▁a", "▁b"}, " a b"},
      {R"({"type": "WordPiece", "prefix": "##", "cleanup": true})", {"un", "##aff", "able", "."}, "unaff able."},
      // Llama-2's chain.
      {R"({"type": "Sequence", "decoders": [{"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
           {"type": "ByteFallback"}, {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}]})",
       {"▁Hello", "▁", "<0xF0>", "<0x9F>", "<0x98>", "<0x80>"}, "Hello \xF0\x9F\x98\x80"},
  };
  for (const DecoderCase& c : cases) {
    auto decoder = Decoder::from_json(nlohmann::json::parse(c.json));
    ASSERT_TRUE(decoder.ok()) << c.json << ": " << decoder.status();
    EXPECT_EQ(decode_all(*decoder, c.pieces), c.expected) << c.json;
  }
}

TEST(Decoders, AddedTokensPassByteLevelAsText) {
  auto decoder = Decoder::from_json({{"type", "ByteLevel"}});
  ASSERT_TRUE(decoder.ok());
  EXPECT_EQ(decoder->decode("Ġ<think>", false, true).value(), "Ġ<think>");
  EXPECT_EQ(decoder->decode("Ġ<think>", false, false).value(), " <think>");
}

// Steps that would need to see across tokens once they are joined are refused, not guessed.
TEST(Decoders, RefusesWhatCannotStream) {
  for (const char* json : {
           R"({"type": "Sequence", "decoders": [{"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 0, "stop": 1}]})",
           R"({"type": "Sequence", "decoders": [{"type": "ByteLevel"}, {"type": "Replace", "pattern": {"String": "ab"}, "content": "c"}]})",
           R"({"type": "Sequence", "decoders": [{"type": "Fuse"}, {"type": "ByteFallback"}]})",
           R"({"type": "CTC"})", R"({"type": "BPEDecoder", "suffix": "</w>"})"}) {
    auto decoder = Decoder::from_json(nlohmann::json::parse(json));
    EXPECT_EQ(decoder.status().code(), absl::StatusCode::kUnimplemented) << json;
  }
}

}  // namespace
}  // namespace pdserve::engine
