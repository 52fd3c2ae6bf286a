// Conversions between float32 and the 16-bit weight formats (IEEE half, bfloat16), bit-exact
// and portable, for writing checkpoints and reading them back on the CPU.
#pragma once

#include <cstdint>
#include <cstring>

namespace pdserve::engine {

inline uint32_t f32_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

inline float f32_from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Round to nearest even, as PyTorch does; NaN stays a (quiet) NaN.
inline uint16_t f32_to_bf16(float f) {
  uint32_t u = f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1);
  return uint16_t(u >> 16);
}

inline float bf16_to_f32(uint16_t h) { return f32_from_bits(uint32_t(h) << 16); }

// Round to nearest even; overflow gives infinity, tiny values become subnormals or zero.
inline uint16_t f32_to_f16(float f) {
  uint32_t u = f32_bits(f);
  uint32_t sign = (u >> 16) & 0x8000u;
  uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return uint16_t(sign | 0x7e00u);  // NaN
  if (abs >= 0x477ff000u) return uint16_t(sign | 0x7c00u);  // Rounds to beyond 65504: inf.
  if (abs < 0x38800000u) {  // Below the smallest normal half (2^-14): subnormal or zero.
    if (abs < 0x33000000u) return uint16_t(sign);  // Below half the smallest subnormal.
    uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
    int shift = 126 - int(abs >> 23);  // 14 + (113 - exp) + ... : aligns to 2^-24 units.
    uint32_t half = mant >> shift;
    uint32_t rem = mant & ((1u << shift) - 1);
    uint32_t mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (half & 1))) ++half;
    return uint16_t(sign | half);
  }
  uint32_t r = abs + 0xfffu + ((abs >> 13) & 1);  // Round the 13 dropped bits to nearest even.
  return uint16_t(sign | ((r - 0x38000000u) >> 13));
}

inline float f16_to_f32(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  if (exp == 0x1f) return f32_from_bits(sign | 0x7f800000u | (mant << 13));
  if (exp == 0) {
    // Subnormal: value = mant * 2^-24, exact in float32.
    float v = float(mant) * (1.0f / 16777216.0f);
    return sign ? -v : v;
  }
  return f32_from_bits(sign | ((exp + 112) << 23) | (mant << 13));
}

}  // namespace pdserve::engine
