// The llama2.c tokenizer (tok512.bin): run.c's encoder, decoding, and corrupt files.
#include "engine/tokenizer/sentencepiece_bpe.h"

#include <chrono>
#include <cstring>
#include <random>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "engine/tokenizer.h"
#include "tests/tokenizer/test_files.h"

namespace pdserve::engine {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing::read_all;
using testing::stories_dir;
using testing::temp_dir;
using testing::write_all;

std::string tok512_path() { return (stories_dir() / "tok512.bin").string(); }

std::unique_ptr<Tokenizer> load_tok512() {
  auto tok = load_tokenizer(tok512_path());
  EXPECT_TRUE(tok.ok()) << tok.status();
  return tok.ok() ? std::move(tok).value() : nullptr;
}

// run.c's encode written the slow, obvious way (rescan every pair after each merge), over the
// pieces and scores read straight from the file: the reference the fast encoder must match.
std::vector<int> reference_encode(const std::string& file, const std::string& text) {
  std::vector<std::string> pieces;
  std::vector<float> scores;
  size_t offset = 4;
  while (offset < file.size()) {
    float score;
    int32_t length;
    std::memcpy(&score, file.data() + offset, 4);
    std::memcpy(&length, file.data() + offset + 4, 4);
    pieces.push_back(file.substr(offset + 8, length));
    scores.push_back(score);
    offset += 8 + length;
  }
  const auto lookup = [&](const std::string& piece) {
    for (size_t i = 0; i < pieces.size(); ++i) {
      if (pieces[i] == piece) return static_cast<int>(i);
    }
    return -1;
  };
  std::vector<int> tokens{1};
  if (text.empty()) return tokens;
  tokens.push_back(lookup(" "));
  for (size_t i = 0; i < text.size();) {
    size_t j = i + 1;
    while (j < text.size() && (static_cast<unsigned char>(text[j]) & 0xC0) == 0x80) ++j;
    const int id = lookup(text.substr(i, j - i));
    if (id >= 0) {
      tokens.push_back(id);
    } else {
      for (size_t k = i; k < j; ++k) tokens.push_back(static_cast<unsigned char>(text[k]) + 3);
    }
    i = j;
  }
  while (true) {
    float best_score = -1e10f;
    int best_id = -1;
    size_t best_index = 0;
    for (size_t i = 1; i + 1 < tokens.size(); ++i) {
      const int id = lookup(pieces[tokens[i]] + pieces[tokens[i + 1]]);
      if (id >= 0 && scores[id] > best_score) {
        best_score = scores[id];
        best_id = id;
        best_index = i;
      }
    }
    if (best_id < 0) break;
    tokens[best_index] = best_id;
    tokens.erase(tokens.begin() + best_index + 1);
  }
  return tokens;
}

TEST(Llama2cTokenizer, LoadsTok512) {
  auto tok = load_tok512();
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(tok->vocab_size(), 512);
  EXPECT_EQ(tok->bos_id(), 1);
  EXPECT_EQ(tok->eos_id(), 2);
}

TEST(Llama2cTokenizer, EncodesWordsThatArePieces) {
  auto tok = load_tok512();
  ASSERT_NE(tok, nullptr);
  // " Lily" is piece 317: the dummy prefix space joins the word.
  EXPECT_THAT(tok->encode("Lily", true).value(), ElementsAre(1, 317));
  // " Once" 403, " upon" 407, " a" 261, " time" 378.
  EXPECT_THAT(tok->encode("Once upon a time", true).value(), ElementsAre(1, 403, 407, 261, 378));
  EXPECT_THAT(tok->encode("Lily", false).value(), ElementsAre(317));
  EXPECT_THAT(tok->encode("", true).value(), ElementsAre(1));
  EXPECT_TRUE(tok->encode("", false).value().empty());
}

TEST(Llama2cTokenizer, ByteFallbackForUnknownCharacters) {
  auto tok = load_tok512();
  ASSERT_NE(tok, nullptr);
  // U+1F600 (F0 9F 98 80) is no piece: its four bytes become <0xNN> = byte + 3.
  EXPECT_THAT(tok->encode("\xF0\x9F\x98\x80", true).value(), ElementsAre(1, 410, 243, 162, 155, 131));
  // "é" is piece 485 of its own; " h" is 270.
  EXPECT_THAT(tok->encode("h\xC3\xA9", true).value(), ElementsAre(1, 270, 485));
}

TEST(Llama2cTokenizer, MatchesReferenceEncoder) {
  auto tok = load_tok512();
  ASSERT_NE(tok, nullptr);
  const std::string file = read_all(tok512_path());
  const std::string story = read_all(stories_dir() / "greedy_from_bos.txt");
  std::vector<std::string> texts = {story, "a  b", "  leading", "trailing  ", "\n\n", "x",
                                    "caf\xC3\xA9 na\xC3\xAFve \xE2\x80\x9Cquoted\xE2\x80\x9D"};
  std::mt19937 rng(7);
  const std::vector<std::string> alphabet = {"a", "e", "l", "i", "y", " ", "L", "t", "h", ".",
                                             "\xC3\xA9", "\xF0\x9F\x98\x80", "\n", "'"};
  for (int i = 0; i < 50; ++i) {
    std::string text;
    const int length = static_cast<int>(rng() % 40);
    for (int j = 0; j < length; ++j) text += alphabet[rng() % alphabet.size()];
    texts.push_back(text);
  }
  for (const std::string& text : texts) {
    EXPECT_EQ(tok->encode(text, true).value(), reference_encode(file, text)) << text;
  }
}

TEST(Llama2cTokenizer, RoundTripsStoryAndUnicode) {
  auto tok = load_tok512();
  ASSERT_NE(tok, nullptr);
  const std::string story = read_all(stories_dir() / "greedy_from_bos.txt");
  ASSERT_FALSE(story.empty());
  for (const std::string& text :
       {story, std::string("Hello, \xE4\xB8\x96\xE7\x95\x8C! \xF0\x9F\x98\x80\xF0\x9F\x8E\x89 ok"),
        std::string("tabs\tand\nnewlines\r\n"), std::string(" leading space")}) {
    auto ids = tok->encode(text, true);
    ASSERT_TRUE(ids.ok()) << ids.status();
    EXPECT_EQ(tok->decode(*ids), text);
    // Without BOS the first piece is at the start of the sequence (prev = -1): same rule.
    EXPECT_EQ(tok->decode(tok->encode(text, false).value()), text);
  }
}

TEST(Llama2cTokenizer, DecodeTokenRules) {
  auto tok = load_tok512();
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(tok->decode_token(1, 403), "Once");    // After BOS: the leading space goes.
  EXPECT_EQ(tok->decode_token(317, 403), " Once");  // Mid-text: it stays.
  EXPECT_EQ(tok->decode_token(403, 13), "\n");      // <0x0A>
  EXPECT_EQ(tok->decode_token(403, 1), "");         // BOS, EOS and <unk> are not text.
  EXPECT_EQ(tok->decode_token(403, 2), "");
  EXPECT_EQ(tok->decode_token(403, 512), "");       // Out of range.
  EXPECT_EQ(tok->decode_token(403, -5), "");
}

TEST(Llama2cTokenizer, RejectsInvalidUtf8) {
  auto tok = load_tok512();
  ASSERT_NE(tok, nullptr);
  for (const std::string& bad : {std::string("ab\xFF"), std::string("\xC3"), std::string("\xC0\x80"),
                                 std::string("\xED\xA0\x80"), std::string("\xF4\x90\x80\x80")}) {
    auto ids = tok->encode(bad, true);
    EXPECT_EQ(ids.status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
}

TEST(Llama2cTokenizer, EncodesLongTextQuickly) {
  auto tok = load_tok512();
  ASSERT_NE(tok, nullptr);
  std::string story = read_all(stories_dir() / "greedy_from_bos.txt");
  std::string prompt;
  while (prompt.size() < 2048) prompt += story;
  std::string big;
  for (int i = 0; i < 100; ++i) big += story;
  const auto start = std::chrono::steady_clock::now();
  auto small_ids = tok->encode(prompt, true);
  const double small_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  auto big_ids = tok->encode(big, true);
  const double total_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  ASSERT_TRUE(small_ids.ok());
  ASSERT_TRUE(big_ids.ok());
  EXPECT_EQ(tok->decode(*big_ids), big);
  // Generous bounds (a shared, loaded machine); a quadratic encoder takes seconds on `big`.
  EXPECT_LT(small_ms, 100.0);
  EXPECT_LT(total_ms, 2000.0);
}

class CorruptLlama2cFile : public ::testing::Test {
 protected:
  void SetUp() override {
    original_ = read_all(tok512_path());
    ASSERT_EQ(original_.size(), 6227u);
    dir_ = temp_dir();
  }
  // Writes `bytes` as a tokenizer file and loads it; the status must name the file.
  Status load(const std::string& bytes) {
    const std::string path = (dir_ / "tok.bin").string();
    write_all(path, bytes);
    auto tok = load_tokenizer(path);
    if (!tok.ok()) {
      EXPECT_THAT(std::string(tok.status().message()), HasSubstr(path));
    }
    return tok.status();
  }
  // The offset of token `index`'s record (its score) in the file.
  size_t record_offset(int index) const {
    size_t offset = 4;
    for (int i = 0; i < index; ++i) {
      int32_t length;
      std::memcpy(&length, original_.data() + offset + 4, 4);
      offset += 8 + length;
    }
    return offset;
  }
  std::string original_;
  std::filesystem::path dir_;
};

TEST_F(CorruptLlama2cFile, TruncatedFilesFail) {
  for (size_t size : {0, 2, 4, 9, 100, 3000, 6226}) {
    EXPECT_FALSE(load(original_.substr(0, size)).ok()) << size;
  }
}

TEST_F(CorruptLlama2cFile, BadLengthsFail) {
  std::string bytes = original_;
  const int32_t zero = 0;
  std::memcpy(bytes.data(), &zero, 4);  // max_token_length 0.
  EXPECT_FALSE(load(bytes).ok());

  for (int32_t length : {-1, 8, 1 << 30}) {  // Token 300: negative, over max (7), past the end.
    bytes = original_;
    std::memcpy(bytes.data() + record_offset(300) + 4, &length, 4);
    EXPECT_FALSE(load(bytes).ok()) << length;
  }
  bytes = original_;
  const float nan = std::nanf("");
  std::memcpy(bytes.data() + record_offset(400), &nan, 4);
  EXPECT_FALSE(load(bytes).ok());
}

TEST_F(CorruptLlama2cFile, VocabWithoutBytePiecesFails) {
  std::string bytes = original_;
  bytes[record_offset(3 + 0x41) + 8 + 4] = 'Z';  // "<0x41>" -> "<0xZ1>"
  EXPECT_FALSE(load(bytes).ok());
  EXPECT_FALSE(load(original_.substr(0, record_offset(100))).ok());  // Too few tokens.
}

TEST_F(CorruptLlama2cFile, RandomMutationsNeverCrash) {
  std::mt19937 rng(123);
  for (int i = 0; i < 200; ++i) {
    std::string bytes = original_;
    for (int j = 0; j < 3; ++j) bytes[rng() % bytes.size()] = static_cast<char>(rng());
    const std::string path = (dir_ / "mutated.bin").string();
    write_all(path, bytes);
    auto tok = load_tokenizer(path);
    if (!tok.ok()) continue;
    auto ids = (*tok)->encode("Once upon a time, Lily \xF0\x9F\x98\x80", true);
    ASSERT_TRUE(ids.ok());
    for (int id : *ids) EXPECT_LT(id, (*tok)->vocab_size());
  }
}

TEST(LoadTokenizer, MissingFileIsNotFound) {
  auto tok = load_tokenizer("/nonexistent/tok.bin");
  EXPECT_EQ(tok.status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace pdserve::engine
