#include "engine/tokenizer/sentencepiece_bpe.h"

#include <cmath>
#include <cstdio>
#include <cstring>

#include "engine/tokenizer/utf8.h"

namespace pdserve::engine {
namespace {

// llama2.c's fixed ids, which its run.c relies on (byte fallback is id = byte + 3).
constexpr int kLlama2cUnk = 0;
constexpr int kLlama2cBos = 1;
constexpr int kLlama2cEos = 2;
constexpr int kLlama2cFirstByte = 3;
// No real tokenizer has pieces this long; a larger value means the header is garbage.
constexpr int32_t kMaxPieceLength = 1 << 16;

std::string byte_piece(int byte) {
  char buffer[8];
  std::snprintf(buffer, sizeof(buffer), "<0x%02X>", byte);
  return buffer;
}

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

// The byte a "<0xNN>" piece stands for, or -1 for any other piece.
int byte_piece_value(std::string_view piece) {
  if (piece.size() != 6 || piece.substr(0, 3) != "<0x" || piece[5] != '>') return -1;
  const int high = hex_digit(piece[3]);
  const int low = hex_digit(piece[4]);
  return high < 0 || low < 0 ? -1 : high * 16 + low;
}

template <typename T>
T read_le(const char* p) {
  T value;
  std::memcpy(&value, p, sizeof(T));  // The files are little-endian, as is every target.
  return value;
}

}  // namespace

StatusOr<std::unique_ptr<SentencePieceBpe>> SentencePieceBpe::from_llama2c(
    std::string_view bytes, const std::string& name) {
  if (bytes.size() < sizeof(int32_t)) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": tokenizer file too short for its header"));
  }
  const int32_t max_token_length = read_le<int32_t>(bytes.data());
  if (max_token_length <= 0 || max_token_length > kMaxPieceLength) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": implausible max_token_length ", max_token_length));
  }
  std::unique_ptr<SentencePieceBpe> tok(new SentencePieceBpe());
  size_t offset = sizeof(int32_t);
  while (offset < bytes.size()) {
    const size_t index = tok->pieces_.size();
    if (bytes.size() - offset < sizeof(float) + sizeof(int32_t)) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": truncated in the header of token ", index));
    }
    const float score = read_le<float>(bytes.data() + offset);
    const int32_t length = read_le<int32_t>(bytes.data() + offset + sizeof(float));
    offset += sizeof(float) + sizeof(int32_t);
    if (!std::isfinite(score)) {
      return absl::InvalidArgumentError(absl::StrCat(name, ": token ", index, " has a non-finite score"));
    }
    if (length < 0 || length > max_token_length) {
      return absl::InvalidArgumentError(absl::StrCat(name, ": token ", index, " has length ", length,
                                                     " (max_token_length ", max_token_length, ")"));
    }
    if (static_cast<size_t>(length) > bytes.size() - offset) {
      return absl::InvalidArgumentError(absl::StrCat(name, ": token ", index, " (", length,
                                                     " bytes) runs past the end of the file"));
    }
    tok->pieces_.emplace_back(bytes.substr(offset, length));
    tok->scores_.push_back(score);
    offset += length;
  }
  const int byte_pieces_end = kLlama2cFirstByte + 256;
  if (static_cast<int>(tok->pieces_.size()) < byte_pieces_end) {
    return absl::InvalidArgumentError(absl::StrCat(
        name, ": only ", tok->pieces_.size(), " tokens; a llama2.c tokenizer has at least ",
        byte_pieces_end, " (<unk>, BOS, EOS and 256 byte pieces)"));
  }
  for (int byte = 0; byte < 256; ++byte) {
    if (tok->pieces_[kLlama2cFirstByte + byte] != byte_piece(byte)) {
      return absl::InvalidArgumentError(absl::StrCat(name, ": token ", kLlama2cFirstByte + byte,
                                                     " should be the byte piece ", byte_piece(byte)));
    }
  }
  tok->special_.assign(tok->pieces_.size(), false);
  tok->unk_id_ = kLlama2cUnk;
  tok->bos_id_ = kLlama2cBos;
  tok->eos_id_ = kLlama2cEos;
  for (int id : {kLlama2cUnk, kLlama2cBos, kLlama2cEos}) tok->special_[id] = true;
  tok->index_pieces();
  return tok;
}

void SentencePieceBpe::index_pieces() {
  byte_ids_.fill(-1);
  byte_value_.assign(pieces_.size(), -1);
  piece_ids_.reserve(pieces_.size());
  for (size_t id = 0; id < pieces_.size(); ++id) {
    const std::string& piece = pieces_[id];
    // Duplicated pieces resolve to the lowest id.
    if (!special_[id]) piece_ids_.emplace(piece, static_cast<int>(id));
    if (const int byte = byte_piece_value(piece); byte >= 0) {
      byte_value_[id] = byte;
      if (byte_ids_[byte] < 0) byte_ids_[byte] = static_cast<int>(id);
    }
  }
}

const std::string& SentencePieceBpe::piece(int token) const {
  static const std::string kEmpty;
  if (token < 0 || token >= vocab_size()) return kEmpty;
  return pieces_[token];
}

std::optional<MergeCandidate> SentencePieceBpe::lookup_merge(int left, int right,
                                                             std::string& scratch) const {
  scratch.assign(pieces_[left]);
  scratch.append(pieces_[right]);
  const auto it = piece_ids_.find(scratch);
  if (it == piece_ids_.end()) return std::nullopt;
  return MergeCandidate{scores_[it->second], it->second};
}

std::vector<int> SentencePieceBpe::encode_plain(std::string_view text) const {
  std::vector<int> symbols;
  symbols.reserve(text.size() + 1);
  const auto push_unit = [&](std::string_view unit) {
    if (auto it = piece_ids_.find(std::string(unit)); it != piece_ids_.end()) {
      symbols.push_back(it->second);
      return;
    }
    for (unsigned char byte : unit) {
      symbols.push_back(byte_ids_[byte] >= 0 ? byte_ids_[byte] : unk_id_);
    }
  };
  push_unit(" ");  // The dummy prefix, so a word spells the same at the start as elsewhere.
  size_t pos = 0;
  while (pos < text.size()) {
    const size_t length = utf8::next_sequence(text.substr(pos)).length;  // Validated already.
    push_unit(text.substr(pos, length));
    pos += length;
  }
  std::string scratch;
  return merge_symbols(symbols, [&](int left, int right) {
    return lookup_merge(left, right, scratch);
  });
}

StatusOr<std::vector<int>> SentencePieceBpe::encode(std::string_view text, bool add_bos) const {
  if (const size_t bad = utf8::first_invalid(text); bad != std::string_view::npos) {
    return absl::InvalidArgumentError(absl::StrCat("text is not valid UTF-8 (at byte ", bad, ")"));
  }
  std::vector<int> ids;
  if (add_bos) ids.push_back(bos_id_);
  if (text.empty()) return ids;
  std::vector<int> plain = encode_plain(text);
  ids.insert(ids.end(), plain.begin(), plain.end());
  return ids;
}

std::string SentencePieceBpe::special_token_text(int token) const {
  if (token < 0 || token >= vocab_size() || !special_[token]) return std::string();
  std::string_view piece = pieces_[token];
  while (!piece.empty() && piece.front() == '\n') piece.remove_prefix(1);
  while (!piece.empty() && piece.back() == '\n') piece.remove_suffix(1);
  return std::string(piece);
}

std::string SentencePieceBpe::decode_token(int prev, int token) const {
  if (token < 0 || token >= vocab_size() || special_[token]) return std::string();
  if (byte_value_[token] >= 0) return std::string(1, static_cast<char>(byte_value_[token]));
  std::string_view piece = pieces_[token];
  if ((prev == -1 || (prev == bos_id_ && bos_id_ >= 0)) && !piece.empty() && piece[0] == ' ') {
    piece.remove_prefix(1);
  }
  return std::string(piece);
}

}  // namespace pdserve::engine
