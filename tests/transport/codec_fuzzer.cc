// libFuzzer target over the control-channel decoder: any byte string must be refused or
// accepted cleanly, never crash. Built only with clang (see CMakeLists.txt); run e.g.
// `transport_codec_fuzzer -max_total_time=60`.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "kvtransfer/control/codec.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto decoded = pdserve::kvtransfer::decode_envelope(
      std::string_view(reinterpret_cast<const char*>(data), size), 4096);
  if (decoded.ok()) {
    // Whatever was accepted must survive a round trip.
    auto again = pdserve::kvtransfer::decode_envelope(
        pdserve::kvtransfer::encode_envelope(*decoded), 1 << 20);
    if (!again.ok()) __builtin_trap();
  }
  return 0;
}
