#include "kvtransfer/ucx/stream_copy.h"

#include <cstdint>
#include <cstring>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace pdserve::kvtransfer {
namespace {

// Below this a line or two: the fence and the partial lines cost more than the stores save.
constexpr size_t kStreamMin = 256;

}  // namespace

void stream_copy(void* dst, const void* src, size_t length) {
#if defined(__SSE2__)
  if (length < kStreamMin) {
    std::memcpy(dst, src, length);
    return;
  }
  auto* d = static_cast<uint8_t*>(dst);
  auto* s = static_cast<const uint8_t*>(src);
  // _mm_stream_si128 needs a 16-byte aligned destination; the source may be unaligned.
  const size_t head = (16 - (reinterpret_cast<uintptr_t>(d) & 15)) & 15;
  std::memcpy(d, s, head);
  d += head;
  s += head;
  length -= head;
  auto* out = reinterpret_cast<__m128i*>(d);
  auto* in = reinterpret_cast<const __m128i*>(s);
  for (; length >= 64; length -= 64, out += 4, in += 4) {
    const __m128i a = _mm_loadu_si128(in), b = _mm_loadu_si128(in + 1);
    const __m128i c = _mm_loadu_si128(in + 2), e = _mm_loadu_si128(in + 3);
    _mm_stream_si128(out, a);
    _mm_stream_si128(out + 1, b);
    _mm_stream_si128(out + 2, c);
    _mm_stream_si128(out + 3, e);
  }
  for (; length >= 16; length -= 16) _mm_stream_si128(out++, _mm_loadu_si128(in++));
  std::memcpy(out, in, length);
#else
  std::memcpy(dst, src, length);
#endif
}

void stream_fence() {
#if defined(__SSE2__)
  _mm_sfence();
#endif
}

}  // namespace pdserve::kvtransfer
