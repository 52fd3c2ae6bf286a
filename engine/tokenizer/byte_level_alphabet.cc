#include "engine/tokenizer/byte_level_alphabet.h"

#include <vector>

#include "engine/tokenizer/utf8.h"

namespace pdserve::engine::byte_level {
namespace {

// Inverse of byte_chars(): code point -> byte, -1 where no byte maps there. All of the
// alphabet lies below U+0144.
const std::vector<int>& char_bytes() {
  static const std::vector<int> table = [] {
    std::vector<int> inverse(0x144, -1);
    const auto& chars = byte_chars();
    for (int byte = 0; byte < 256; ++byte) {
      const std::string& c = chars[byte];
      char32_t cp = static_cast<unsigned char>(c[0]);
      if (c.size() == 2) cp = ((cp & 0x1F) << 6) | (static_cast<unsigned char>(c[1]) & 0x3F);
      inverse[cp] = byte;
    }
    return inverse;
  }();
  return table;
}

}  // namespace

const std::array<std::string, 256>& byte_chars() {
  // Printable Latin-1 bytes stand for themselves; the rest (controls, space, etc.) are
  // shifted, in byte order, to U+0100 onwards so that every piece is visible text.
  static const std::array<std::string, 256> table = [] {
    std::array<std::string, 256> chars;
    int shifted = 0;
    for (int byte = 0; byte < 256; ++byte) {
      const bool printable = (byte >= '!' && byte <= '~') || (byte >= 0xA1 && byte <= 0xAC) ||
                             (byte >= 0xAE && byte <= 0xFF);
      utf8::append_code_point(chars[byte], printable ? byte : 256 + shifted++);
    }
    return chars;
  }();
  return table;
}

std::string encode(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char byte : bytes) out += byte_chars()[byte];
  return out;
}

bool decode(std::string_view piece, std::string& out) {
  const std::vector<int>& bytes_of = char_bytes();
  std::string decoded;
  size_t pos = 0;
  while (pos < piece.size()) {
    const unsigned char lead = static_cast<unsigned char>(piece[pos]);
    char32_t cp = lead;
    size_t length = 1;
    if (lead >= 0xC0 && lead < 0xE0 && pos + 1 < piece.size()) {
      cp = ((cp & 0x1F) << 6) | (static_cast<unsigned char>(piece[pos + 1]) & 0x3F);
      length = 2;
    } else if (lead >= 0x80) {
      return false;  // Three- and four-byte characters are not in the alphabet.
    }
    if (cp >= bytes_of.size() || bytes_of[cp] < 0) return false;
    decoded += static_cast<char>(bytes_of[cp]);
    pos += length;
  }
  out += decoded;
  return true;
}

}  // namespace pdserve::engine::byte_level
