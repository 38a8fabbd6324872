// e4m3 on the device: the append's rounding, and the readers' exact widening.
//
// Why fp16 for the widening: every e4m3 value (subnormals included) is exactly an fp16 value,
// and sm_89+ converts two of them in one instruction (cvt.rn.f16x2.e4m3x2), so a reader
// spends one instruction per two elements; the tensor-core products then run in fp16 with
// fp32 accumulation. The host's float_to_e4m3 (kernels/element.h) rounds as
// __nv_cvt_float_to_fp8(..., __NV_SATFINITE, __NV_E4M3) does: nearest even, +-448 at most.
#pragma once

#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

namespace kvvm::kernels {

// Two e4m3 bytes (the lower in the low 8 bits) as an fp16 pair (the lower in the low half).
__device__ __forceinline__ std::uint32_t e4m3x2_to_half2(std::uint16_t pair) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  std::uint32_t out;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;\n" : "=r"(out) : "h"(pair));
  return out;
#else
  const __half2_raw raw = __nv_cvt_fp8x2_to_halfraw2(pair, __NV_E4M3);
  return static_cast<std::uint32_t>(raw.x) | (static_cast<std::uint32_t>(raw.y) << 16);
#endif
}

// Bytes 0-1 and 2-3 of a word as two fp16 pairs.
__device__ __forceinline__ void e4m3x4_to_half2x2(std::uint32_t word, std::uint32_t& low,
                                                  std::uint32_t& high) {
  low = e4m3x2_to_half2(static_cast<std::uint16_t>(word & 0xffffu));
  high = e4m3x2_to_half2(static_cast<std::uint16_t>(word >> 16));
}

// Round to nearest even, saturating at +-448 (a finite value never becomes NaN).
__device__ __forceinline__ std::uint8_t float_to_e4m3(float value) {
  return static_cast<std::uint8_t>(__nv_cvt_float_to_fp8(value, __NV_SATFINITE, __NV_E4M3));
}

// Two floats in e4m3 (the lower in the low byte), rounded as float_to_e4m3 rounds each: one
// instruction for the pair on sm_89+.
__device__ __forceinline__ std::uint16_t floats_to_e4m3x2(float low, float high) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  std::uint16_t pair;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;\n" : "=h"(pair) : "f"(high), "f"(low));
  return pair;
#else
  return static_cast<std::uint16_t>(float_to_e4m3(low) |
                                    (static_cast<std::uint16_t>(float_to_e4m3(high)) << 8));
#endif
}

// The dynamic scale of a group of activations whose largest magnitude is amax: amax maps to
// e4m3's 448; an all-zero group gets 1 (its bytes are zeros either way). Every quantizer of
// activations (fp8_quantize_cuda, and the RMSNorm and SiLU-mul that write the quantized rows
// beside their own) takes its scale here and divides by it, so they agree bit for bit.
__device__ __forceinline__ float e4m3_scale_of(float amax) {
  return amax > 0.0f ? amax / 448.0f : 1.0f;
}

// Bytes of a and b picked by a prmt selector (nibble i: byte of {a, b} for result byte i).
__device__ __forceinline__ std::uint32_t byte_perm(std::uint32_t a, std::uint32_t b,
                                                   std::uint32_t selector) {
  return __byte_perm(a, b, selector);
}

}  // namespace kvvm::kernels
