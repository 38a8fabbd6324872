// Host conversions between float and the cache's element types (fp16, bf16, fp8 e4m3, fp32),
// rounding to nearest even like the GPU's __float2half_rn / __float2bfloat16_rn /
// __nv_cvt_float_to_fp8(..., __NV_SATFINITE, __NV_E4M3), so the CPU path and the kernels store
// the same bits for the same float.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "kvvm/kv/kv_view.h"

namespace kvvm::kernels {

inline float bits_to_float(std::uint32_t bits) {
  float value;
  std::memcpy(&value, &bits, 4);
  return value;
}

inline std::uint32_t float_to_bits(float value) {
  std::uint32_t bits;
  std::memcpy(&bits, &value, 4);
  return bits;
}

inline float half_to_float(std::uint16_t h) {
  const std::uint32_t sign = std::uint32_t{h & 0x8000u} << 16;
  const std::uint32_t exponent = (h >> 10) & 0x1f;
  const std::uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0) {  // zero or subnormal: mantissa * 2^-24
    const float magnitude = std::ldexp(static_cast<float>(mantissa), -24);
    return sign != 0 ? -magnitude : magnitude;
  }
  if (exponent == 31) return bits_to_float(sign | 0x7f800000u | (mantissa << 13));  // inf, NaN
  return bits_to_float(sign | ((exponent + 112) << 23) | (mantissa << 13));
}

inline std::uint16_t float_to_half(float value) {
  const std::uint32_t bits = float_to_bits(value);
  const std::uint16_t sign = static_cast<std::uint16_t>((bits >> 16) & 0x8000u);
  const float magnitude = std::fabs(value);
  if (std::isnan(value)) return static_cast<std::uint16_t>(sign | 0x7e00u);
  if (magnitude >= 65520.0f) return static_cast<std::uint16_t>(sign | 0x7c00u);  // rounds to inf
  if (magnitude < 6.103515625e-05f) {  // subnormal half: a multiple of 2^-24, nearest even
    const float scaled = magnitude * 16777216.0f;  // exact: power of two
    return static_cast<std::uint16_t>(sign | static_cast<std::uint16_t>(std::nearbyint(scaled)));
  }
  const std::uint32_t abs_bits = bits & 0x7fffffffu;
  // Drop 13 mantissa bits with round to nearest even, then rebias the exponent (127 -> 15).
  const std::uint32_t rounded = abs_bits + 0xfffu + ((abs_bits >> 13) & 1u);
  return static_cast<std::uint16_t>(sign | ((rounded >> 13) - (112u << 10)));
}

inline float bf16_to_float(std::uint16_t b) { return bits_to_float(std::uint32_t{b} << 16); }

inline std::uint16_t float_to_bf16(float value) {
  const std::uint32_t bits = float_to_bits(value);
  if (std::isnan(value)) return static_cast<std::uint16_t>((bits >> 16) | 0x40u);
  const std::uint32_t rounded = bits + 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<std::uint16_t>(rounded >> 16);
}

// e4m3 ("fn": no infinities): sign, 4 exponent bits (bias 7), 3 mantissa bits; 0x7f / 0xff
// are NaN, the largest finite magnitude is 448 (0x7e), the smallest subnormal 2^-9.
inline float e4m3_to_float(std::uint8_t b) {
  const bool negative = (b & 0x80u) != 0;
  const int exponent = (b >> 3) & 0xf;
  const int mantissa = b & 0x7;
  float magnitude;
  if (exponent == 0xf && mantissa == 0x7) return negative ? -NAN : NAN;
  if (exponent == 0) {
    magnitude = std::ldexp(static_cast<float>(mantissa), -9);
  } else {
    magnitude = std::ldexp(1.0f + static_cast<float>(mantissa) / 8.0f, exponent - 7);
  }
  return negative ? -magnitude : magnitude;
}

// Round to nearest even, saturating: every finite value (and infinity) beyond 448 becomes
// +-448, so a finite input never gives NaN; NaN stays NaN.
inline std::uint8_t float_to_e4m3(float value) {
  const std::uint8_t sign = (float_to_bits(value) >> 24) & 0x80u;
  if (std::isnan(value)) return static_cast<std::uint8_t>(sign | 0x7fu);
  const float magnitude = std::fabs(value);
  if (magnitude >= 448.0f) return static_cast<std::uint8_t>(sign | 0x7eu);
  if (magnitude < 0.015625f) {  // below 2^-6: a multiple of 2^-9, nearest even (8 is 2^-6)
    const float scaled = magnitude * 512.0f;  // exact: power of two
    return static_cast<std::uint8_t>(sign | static_cast<std::uint8_t>(std::nearbyint(scaled)));
  }
  const std::uint32_t abs_bits = float_to_bits(magnitude);
  // Drop 20 mantissa bits with round to nearest even, then rebias the exponent (127 -> 7).
  const std::uint32_t rounded = abs_bits + 0x7ffffu + ((abs_bits >> 20) & 1u);
  const std::uint32_t code = (rounded >> 20) - (120u << 3);
  return static_cast<std::uint8_t>(sign | (code > 0x7eu ? 0x7eu : code));
}

inline float load_element(DType element, const unsigned char* at) {
  std::uint16_t h;
  switch (element) {
    case DType::kFp16:
      std::memcpy(&h, at, 2);
      return half_to_float(h);
    case DType::kBf16:
      std::memcpy(&h, at, 2);
      return bf16_to_float(h);
    case DType::kFp32: {
      float f;
      std::memcpy(&f, at, 4);
      return f;
    }
    case DType::kFp8:
      return e4m3_to_float(*at);
    default:
      return NAN;
  }
}

inline void store_element(DType element, float value, unsigned char* at) {
  std::uint16_t h;
  switch (element) {
    case DType::kFp16:
      h = float_to_half(value);
      std::memcpy(at, &h, 2);
      break;
    case DType::kBf16:
      h = float_to_bf16(value);
      std::memcpy(at, &h, 2);
      break;
    case DType::kFp32:
      std::memcpy(at, &value, 4);
      break;
    case DType::kFp8:
      *at = float_to_e4m3(value);
      break;
    default:
      break;
  }
}

}  // namespace kvvm::kernels
