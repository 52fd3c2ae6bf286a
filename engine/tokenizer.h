// The tokenizer interface: text to token ids and back. Implementations: llama2.c's
// SentencePiece-style BPE (engine/tokenizer/sentencepiece_bpe.h) and the Hugging Face
// tokenizer.json pipeline (engine/tokenizer/hf_tokenizer.h).
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace pdserve::engine {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  // Encodes UTF-8 `text`; InvalidArgument on invalid UTF-8. `add_bos` is transformers'
  // add_special_tokens: with it the tokenizer's special tokens (BOS, and EOS where the file
  // asks) go around the text. Empty text gives just those (or nothing).
  virtual StatusOr<std::vector<int>> encode(std::string_view text, bool add_bos) const = 0;
  // The bytes `token` stands for when it follows `prev` (-1 at the start). Bytes, not text:
  // a byte-fallback token can be half of a UTF-8 character. Special tokens decode to "".
  virtual std::string decode_token(int prev, int token) const = 0;
  // A special token's own text ("</s>", "<|eot_id|>"), which decode_token leaves out: what
  // streamed text shows for it with skip_special_tokens off. "" for any other token.
  virtual std::string special_token_text(int token) const {
    (void)token;
    return std::string();
  }
  // What a token after `prev` shows in streamed text: decode_token's bytes, and with
  // skip_special_tokens off a special token's own text too. The engine, the router and the
  // OpenAI logprobs objects all use it, so token strings and streamed text agree.
  std::string token_text(int prev, int token, bool skip_special_tokens) const {
    std::string bytes = decode_token(prev, token);
    if (!skip_special_tokens) bytes += special_token_text(token);
    return bytes;
  }
  // The whole sequence's bytes; by default decode_token over it, each after its predecessor.
  virtual std::string decode(const std::vector<int>& tokens) const;
  virtual int vocab_size() const = 0;
  virtual int bos_id() const = 0;  // -1 if none.
  virtual int eos_id() const = 0;  // -1 if none.
};

// Loads a tokenizer file: a llama2.c tokenizer (`tok512.bin`, `tokenizer.bin`) or a Hugging
// Face `tokenizer.json` (with `tokenizer_config.json` beside it when present), chosen by content.
StatusOr<std::unique_ptr<Tokenizer>> load_tokenizer(const std::string& path);

// Turns a stream of bytes into complete UTF-8 text pieces: holds back an incomplete trailing
// character until its remaining bytes arrive, so streamed deltas are always valid UTF-8.
class Utf8StreamDecoder {
 public:
  // Appends `bytes` and returns the longest complete-UTF-8 prefix not yet returned.
  std::string push(std::string_view bytes);
  // Returns what is left (invalid bytes replaced by U+FFFD).
  std::string flush();

 private:
  std::string pending_;
};

}  // namespace pdserve::engine
