// The tokenizer make-model gives its synthetic models: a Hugging Face byte-level BPE
// (tokenizer.json + tokenizer_config.json) with the 256 GPT-2 byte tokens as ids 0..255, no
// merges, and "<s>" (256) / "</s>" (257) as BOS / EOS. Any text encodes, one token per byte.
#pragma once

#include <string>

#include "common/status.h"

namespace pdserve::engine {

constexpr int kByteTokenizerBos = 256;
constexpr int kByteTokenizerEos = 257;
constexpr int kByteTokenizerVocab = 258;

// Writes tokenizer.json and tokenizer_config.json into `dir`.
Status write_byte_level_tokenizer(const std::string& dir);

}  // namespace pdserve::engine
