// The Hugging Face tokenizer.json parser on arbitrary bytes (the file a user's checkpoint
// brings): bad JSON, wrong types, broken vocabularies and merges must give an error, never a
// crash. The first byte picks whether a tokenizer_config.json (the rest, split at its first
// NUL) comes with it.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "engine/tokenizer/hf_tokenizer_json.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  std::string_view rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  std::string_view config;
  if (data[0] & 1) {
    const size_t nul = rest.find('\0');
    if (nul != std::string_view::npos) {
      config = rest.substr(nul + 1);
      rest = rest.substr(0, nul);
    }
  }
  (void)pdserve::engine::parse_hf_tokenizer_json(rest, config, "fuzz");
  return 0;
}
