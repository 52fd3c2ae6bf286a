// GPT-2's byte-to-unicode alphabet, which byte-level BPE vocabularies are spelled in: every
// byte stands for one printable character, so that a piece never contains a space or a
// control character. The ByteLevel pre-tokenizer maps bytes to it, the decoder back.
#pragma once

#include <array>
#include <string>
#include <string_view>

namespace pdserve::engine::byte_level {

// The character (as UTF-8) that stands for each byte.
const std::array<std::string, 256>& byte_chars();

// `bytes` spelled in the alphabet.
std::string encode(std::string_view bytes);

// Appends the bytes `piece` stands for to `out` and returns true; returns false (leaving
// `out` alone) when some character of it is not in the alphabet: such a piece is plain text.
bool decode(std::string_view piece, std::string& out);

}  // namespace pdserve::engine::byte_level
