// The Hugging Face tokenizer.json loader on arbitrary bytes (the file a user's checkpoint
// brings): bad JSON, wrong types, broken vocabularies, merges and components must give an
// error, never a crash; a file that loads must encode and decode a fixed text cleanly. The
// first byte picks whether a tokenizer_config.json (the rest, split at its first NUL) comes
// with it.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "engine/tokenizer/hf_tokenizer.h"

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
  auto tok = pdserve::engine::HfTokenizer::from_json(rest, config);
  if (!tok.ok()) return 0;
  auto ids = (*tok)->encode("Hello, w\xC3\xB6rld! 12345 <s>\n\t \xE4\xB8\x96\xF0\x9F\x98\x80", true);
  if (!ids.ok()) return 0;
  for (int id : *ids) {
    if (id < 0 || id >= (*tok)->vocab_size()) std::abort();
  }
  (void)(*tok)->decode(*ids);
  return 0;
}
