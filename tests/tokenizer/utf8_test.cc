// Utf8StreamDecoder and the UTF-8 validation the tokenizers rely on.
#include <gtest/gtest.h>

#include "engine/tokenizer.h"
#include "engine/tokenizer/utf8.h"

namespace pdserve::engine {
namespace {

constexpr std::string_view kFffd = "\xEF\xBF\xBD";

TEST(Utf8StreamDecoder, HoldsBackSplitCharacter) {
  Utf8StreamDecoder decoder;
  EXPECT_EQ(decoder.push("a\xE2"), "a");  // "€" = E2 82 AC arrives in pieces.
  EXPECT_EQ(decoder.push("\x82"), "");
  EXPECT_EQ(decoder.push("\xAC" "b"), "\xE2\x82\xAC" "b");
  EXPECT_EQ(decoder.push("\xF0\x9F"), "");
  EXPECT_EQ(decoder.push("\x98\x80"), "\xF0\x9F\x98\x80");
  EXPECT_EQ(decoder.flush(), "");
}

TEST(Utf8StreamDecoder, ReplacesInvalidBytes) {
  Utf8StreamDecoder decoder;
  EXPECT_EQ(decoder.push("x\xFFy"), "x" + std::string(kFffd) + "y");
  // A lead byte followed by a non-continuation: the lead alone is replaced.
  EXPECT_EQ(decoder.push("\xE2z"), std::string(kFffd) + "z");
  EXPECT_EQ(decoder.push("\xE2\x82"), "");
  EXPECT_EQ(decoder.flush(), kFffd);  // The stream ended mid-character.
  EXPECT_EQ(decoder.flush(), "");
}

TEST(Utf8, Validation) {
  EXPECT_EQ(utf8::first_invalid("plain \xC3\xA9 \xF0\x9F\x98\x80"), std::string_view::npos);
  EXPECT_EQ(utf8::first_invalid("ab\xC0\xAF"), 2u);      // Overlong.
  EXPECT_EQ(utf8::first_invalid("\xED\xA0\x80"), 0u);    // Surrogate.
  EXPECT_EQ(utf8::first_invalid("a\xF4\x90\x80\x80"), 1u);  // Past U+10FFFF.
  EXPECT_EQ(utf8::first_invalid("abc\xE2\x82"), 3u);     // Truncated.
}

}  // namespace
}  // namespace pdserve::engine
