// The kvtransfer control decoder on arbitrary bytes: every message a peer sends goes through
// decode_envelope(), which must refuse bad input with a status, never crash or over-allocate;
// what it accepts must survive a re-encode.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "kvtransfer/control/codec.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace pdserve::kvtransfer;
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  auto decoded = decode_envelope(bytes, /*max_bytes=*/1 << 16);
  if (!decoded.ok()) return 0;
  (void)message_type_name(*decoded);
  if (!decode_envelope(encode_envelope(*decoded)).ok()) std::abort();  // Accepted once, accepted again.
  return 0;
}
