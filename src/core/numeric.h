// Scalar conversions between storage formats and f32 (host side; the CPU reference uses them).
// bf16/f16 round to nearest even on the way down. fp8/e8m0/fp4 decoders follow OCP MX v1.0 / OCP FP8.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

namespace mxserve {

inline float bf16_to_f32(uint16_t v) {
  uint32_t u = static_cast<uint32_t>(v) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // quiet NaN
  const uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>((u + rounding) >> 16);
}

inline float f16_to_f32(uint16_t h) {
  const uint32_t sign = (h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1f;
  const uint32_t mant = h & 0x3ff;
  float f;
  if (exp == 0) {
    f = std::ldexp(static_cast<float>(mant), -24);
  } else if (exp == 31) {
    f = mant ? NAN : INFINITY;
  } else {
    f = std::ldexp(static_cast<float>(mant | 0x400), static_cast<int>(exp) - 25);
  }
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u |= sign;
  std::memcpy(&f, &u, 4);
  return f;
}

// OCP e4m3fn: bias 7, no infinities, S.1111.111 is NaN, max normal 448.
inline float fp8_e4m3_to_f32(uint8_t v) {
  const float sign = (v & 0x80) ? -1.f : 1.f;
  const int exp = (v >> 3) & 0xf;
  const int mant = v & 0x7;
  if (exp == 0xf && mant == 0x7) return NAN;
  if (exp == 0) return sign * std::ldexp(static_cast<float>(mant), -9);
  return sign * std::ldexp(static_cast<float>(8 + mant), exp - 10);
}

// e5m2: bias 15, IEEE-like infinities and NaNs.
inline float fp8_e5m2_to_f32(uint8_t v) {
  const float sign = (v & 0x80) ? -1.f : 1.f;
  const int exp = (v >> 2) & 0x1f;
  const int mant = v & 0x3;
  if (exp == 0x1f) return mant ? NAN : sign * INFINITY;
  if (exp == 0) return sign * std::ldexp(static_cast<float>(mant), -16);
  return sign * std::ldexp(static_cast<float>(4 + mant), exp - 17);
}

// E8M0 scale: 2^(v-127); 0xff is NaN.
inline float e8m0_to_f32(uint8_t v) {
  if (v == 0xff) return NAN;
  return std::ldexp(1.0f, static_cast<int>(v) - 127);
}

// FP4 E2M1 nibble (low 4 bits): values +-{0, 0.5, 1, 1.5, 2, 3, 4, 6}.
inline float fp4_e2m1_to_f32(uint8_t nibble) {
  static constexpr float kValues[8] = {0.f, 0.5f, 1.f, 1.5f, 2.f, 3.f, 4.f, 6.f};
  const float v = kValues[nibble & 0x7];
  return (nibble & 0x8) ? -v : v;
}

}  // namespace mxserve
