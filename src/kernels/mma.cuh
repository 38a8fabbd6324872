// Tensor-core building blocks (sm_80+): ldmatrix loads of 8x8 b16 matrices from shared
// memory, the m16n8k16 MMA with fp32 accumulation for fp16 and bf16 (and m16n8k32 for e4m3,
// sm_89+), and the packing of two floats into one 32-bit register of two elements (an A / B
// operand register).
//
// Fragment layout of mma.m16n8k16 (PTX ISA, "Matrix fragments for mma.m16n8k16"), lane =
// 4 * group + quad (group = lane / 4, quad = lane % 4):
//   A (16x16, row-major, 4 registers of 2 elements): a[0] = (row group, cols 2quad..+1),
//     a[1] = (row group + 8, same cols), a[2] = (row group, cols 8 + 2quad..+1), a[3] =
//     (row group + 8, cols 8 + 2quad..+1).
//   B (16x8, "col": element (k, n)), 2 registers: b[0] = (k 2quad..+1, n group), b[1] =
//     (k 8 + 2quad..+1, n group).
//   C / D (16x8 fp32), 4 floats: c[0], c[1] = (row group, cols 2quad, 2quad + 1), c[2], c[3]
//     = (row group + 8, same cols).
// So the C fragments of two adjacent n8 tiles, converted to 16 bits, are exactly the A
// fragment of one k16 step (FlashAttention-2's reuse of P as an operand without shared
// memory).
//
// ldmatrix .x4: lanes 8i..8i+7 give the row addresses (16 bytes each) of matrix i; register
// i of every lane receives matrix i's (row lane / 4, elements 2(lane % 4)..+1); .trans gives
// the transposed matrix instead.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace kvvm::kernels {

__device__ __forceinline__ std::uint32_t shared_address(const void* pointer) {
  return static_cast<std::uint32_t>(__cvta_generic_to_shared(pointer));
}

// Four 8x8 matrices of 16-bit elements; `row` is this lane's row address (16-byte aligned).
__device__ __forceinline__ void ldmatrix_x4(std::uint32_t (&r)[4], std::uint32_t row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(row));
}

// The same, each matrix transposed (a row-major [k][n] tile becomes a B operand).
__device__ __forceinline__ void ldmatrix_x4_trans(std::uint32_t (&r)[4], std::uint32_t row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(row));
}

// c += a * b for one 16x8x16 tile, fp32 accumulation; T is __half or __nv_bfloat16.
template <typename T>
__device__ __forceinline__ void mma_m16n8k16(float (&c)[4], const std::uint32_t (&a)[4],
                                             const std::uint32_t (&b)[2]);

template <>
__device__ __forceinline__ void mma_m16n8k16<__half>(float (&c)[4], const std::uint32_t (&a)[4],
                                                     const std::uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

template <>
__device__ __forceinline__ void mma_m16n8k16<__nv_bfloat16>(float (&c)[4],
                                                            const std::uint32_t (&a)[4],
                                                            const std::uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// c += a * b for one 16x8x32 tile of e4m3 (sm_89+), fp32 accumulation. Fragments as
// m16n8k16's with four 8-bit elements a register where that has two 16-bit ones (PTX ISA,
// "Matrix fragments for mma.m16n8k32"): a[0] = (row group, k 4quad..+3), a[1] = (row group + 8,
// same k), a[2] = (row group, k 16 + 4quad..+3), a[3] = (row group + 8, same k); b[0] = (k
// 4quad..+3, n group), b[1] = (k 16 + 4quad..+3, n group); the lowest k in the lowest byte.
__device__ __forceinline__ void mma_m16n8k32_e4m3(float (&c)[4], const std::uint32_t (&a)[4],
                                                  const std::uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// Two floats rounded to T and packed into one register: `lo` in the low 16 bits (the lower
// column / k index of an operand pair).
template <typename T>
__device__ __forceinline__ std::uint32_t pack_float2(float lo, float hi);

template <>
__device__ __forceinline__ std::uint32_t pack_float2<__half>(float lo, float hi) {
  const __half2 pair = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const std::uint32_t*>(&pair);
}

template <>
__device__ __forceinline__ std::uint32_t pack_float2<__nv_bfloat16>(float lo, float hi) {
  const __nv_bfloat162 pair = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const std::uint32_t*>(&pair);
}

}  // namespace kvvm::kernels
