// The SentencePiece-style BPE tokenizer of llama2.c tokenizer files (tok512.bin,
// tokenizer.bin), exactly as llama2.c's run.c `encode`: text is split into code points (a
// " " dummy prefix first), unknown ones fall back to <0xNN> byte pieces, then pairs merge
// greedily by piece score. (tokenizer.json files go through hf_tokenizer.h instead.)
// Immutable once built: encode and decode may run concurrently from any thread.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/status.h"
#include "engine/tokenizer.h"
#include "engine/tokenizer/bpe_merge.h"

namespace pdserve::engine {

class SentencePieceBpe final : public Tokenizer {
 public:
  // Parses the bytes of a llama2.c tokenizer file (int32 max_token_length, then per token
  // float32 score, int32 length, bytes; ids 0/1/2 = <unk>/BOS/EOS, 3..258 = <0x00>..<0xFF>).
  // `name` (the path) is quoted in errors about truncated or corrupt contents.
  static StatusOr<std::unique_ptr<SentencePieceBpe>> from_llama2c(std::string_view bytes,
                                                                  const std::string& name);
  StatusOr<std::vector<int>> encode(std::string_view text, bool add_bos) const override;
  // A piece at the start of the text (after BOS, or with prev == -1) drops its leading space:
  // that space is the dummy prefix encode added.
  std::string decode_token(int prev, int token) const override;
  // The control piece without the newlines llama2.c's export wraps <s> and </s> in.
  std::string special_token_text(int token) const override;
  int vocab_size() const override { return static_cast<int>(pieces_.size()); }
  int bos_id() const override { return bos_id_; }
  int eos_id() const override { return eos_id_; }

  // The piece of `token` as stored (spaces as ' ', byte pieces as "<0xNN>"); "" if out of range.
  const std::string& piece(int token) const;

 private:
  SentencePieceBpe() = default;
  void index_pieces();
  // Code points to piece ids (with the dummy prefix), then merges.
  std::vector<int> encode_plain(std::string_view text) const;
  std::optional<MergeCandidate> lookup_merge(int left, int right, std::string& scratch) const;

  std::vector<std::string> pieces_;
  std::vector<float> scores_;          // llama2.c: a merged piece's priority.
  std::vector<bool> special_;          // Control tokens: decode to "".
  std::vector<int> byte_value_;        // For <0xNN> pieces the byte, else -1.
  std::unordered_map<std::string, int> piece_ids_;
  std::array<int, 256> byte_ids_{};    // The <0xNN> piece of each byte, or -1.
  int unk_id_ = -1;
  int bos_id_ = -1;
  int eos_id_ = -1;
};

}  // namespace pdserve::engine
