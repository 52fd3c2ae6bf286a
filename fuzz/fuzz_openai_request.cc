// The OpenAI HTTP request parser on arbitrary bodies (completions and chat, every chat format):
// malformed JSON, wrong types and out-of-range numbers must give InvalidArgument, never a crash.
#include <cstddef>
#include <cstdint>
#include <string>

#include "router/openai_api.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace pdserve;
  if (size == 0) return 0;
  const bool chat = data[0] & 1;
  const auto format = static_cast<engine::ChatFormat>((data[0] >> 1) % 4);
  const std::string body(reinterpret_cast<const char*>(data) + 1, size - 1);
  (void)router::parse_openai_request(body, chat, format);
  return 0;
}
