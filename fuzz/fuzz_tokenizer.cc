// The bundled model's tokenizer (stories260K's llama2.c tok512.bin, SentencePiece-style BPE) on
// arbitrary bytes: encoding any text (invalid UTF-8 included) works or fails cleanly, every id
// it returns is in the vocabulary, and decoding them never crashes.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string_view>

#include "engine/tokenizer.h"

namespace {

const pdserve::engine::Tokenizer& tokenizer() {
  static const std::unique_ptr<pdserve::engine::Tokenizer> t = [] {
    const char* env = std::getenv("PDSERVE_MODEL_PATH");
    const std::string dir = env ? env : PDSERVE_SOURCE_DIR "/../shared/models";
    auto loaded = pdserve::engine::load_tokenizer(dir + "/stories260K/tok512.bin");
    if (!loaded.ok()) {
      std::fprintf(stderr, "fuzz_tokenizer: %s (set PDSERVE_MODEL_PATH)\n",
                   std::string(loaded.status().message()).c_str());
      std::abort();
    }
    return std::move(*loaded);
  }();
  return *t;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  auto ids = tokenizer().encode(text, size % 2 == 0);
  if (!ids.ok()) return 0;
  for (int id : *ids)
    if (id < 0 || id >= tokenizer().vocab_size()) std::abort();
  (void)tokenizer().decode(*ids);
  return 0;
}
