// The CUDA kernels of an FP8 checkpoint's projections (the CUDA model's, src/model/cuda_*.cc):
// a GEMV for the few rows of a small batch's decode step, and the activations' dynamic
// quantization that feeds it and cuBLASLt's FP8 GEMM (src/model/cuda/fp8_matmul.h) for larger
// steps.
//
// Weights are e4m3 [out][in] row-major as the checkpoint stores them, with float32 scales:
// block-scaled (Hugging Face "fp8"): scales [ceil(out / 128)][ceil(in / 128)] row-major,
// w[n][k] = e4m3(w[n][k]) * s[n / 128][k / 128]; per channel (compressed-tensors
// FP8-dynamic): scales [out], w[n][k] = e4m3(w[n][k]) * s[n].
#pragma once

#include <cstdint>

#include "kvvm/base/dtype.h"
#include "kvvm/base/status.h"

namespace kvvm {

enum class Fp8Scales : std::uint8_t { kBlock128, kChannel };
inline constexpr std::uint32_t kFp8Block = 128;

// y[r][n] = sum over k of x[r][k] * w[n][k] (+ bias[n], or + beta * y[r][n]): float32 sums in
// an order fixed by (in, out) alone, so a row's result is the same bits whatever the batch
// beside it; y rounded once to the element type. Two forms:
//   - x as it is (fp16 / bf16), rows <= kFp8GemvMaxRows: the weights widened exactly in
//     registers and multiplied on the CUDA cores;
//   - x quantized (`xq`: fp8_quantize_cuda's e4m3 rows and scales, the dequantized values
//     being the x multiplied, as the FP8 GEMM takes them), rows <= kFp8MmaGemvRows: the
//     products on the tensor cores (m16n8k32 e4m3, the rows as its 8 columns), so 8 rows cost
//     what one does; each 64 of `in` summed by the tensor core, then scaled and added in float32.
// REQUIRES: `in` a multiple of 16 (of 128 with xq, block-scaled), x / xq and weight 16-byte
// aligned.
inline constexpr std::uint32_t kFp8GemvMaxRows = 16;
inline constexpr std::uint32_t kFp8MmaGemvRows = 8;
struct Fp8GemvArgs {
  DType element = DType::kUnset;  // x, y, bias: fp16 or bf16
  Fp8Scales scales_kind = Fp8Scales::kBlock128;
  std::uint32_t rows = 0;
  std::uint32_t in = 0;
  std::uint32_t out = 0;
  float beta = 0;
  const void* bias = nullptr;    // [out] or null
  const void* x = nullptr;       // [rows][in]; null with xq
  const void* weight = nullptr;  // e4m3 [out][in]
  const float* scales = nullptr;
  void* y = nullptr;  // [rows][out]
  // The quantized form: e4m3 [x_stride][in] and its scales in fp8_quantize_cuda's layout for
  // `scales_kind` (block: [in / 128][x_stride]; channel: [x_stride]); x_stride >= rows.
  const void* xq = nullptr;
  const float* x_scales = nullptr;
  std::uint32_t x_stride = 0;
  // For measuring; 0 lets the kernel choose from (in, out) alone. Warps per output (per 16
  // outputs with xq): 1, 2, 4 or 8. Weight vectors of 16 bytes a lane has in flight: 4, or 8
  // for at most 2 rows or with xq.
  std::uint32_t split = 0;
  std::uint32_t unroll = 0;
};
Status fp8_gemv_cuda(const Fp8GemvArgs& args, void* stream);

// Dynamic quantization of activations x [rows][in] to e4m3 `out` [stride][in] with float32
// scales, each amax / 448 (1 where a group is all zeros): block-scaled checkpoints per row and
// group of 128 along `in`, stored group-major [in / 128][stride] (row r of group g at
// g * stride + r: the layout cuBLASLt's VEC128_32F scales take); per-channel checkpoints per
// row, [stride] (OUTER_VEC_32F). Rows [rows, stride) are written as zeros with scale 1: the
// GEMM runs over `stride` rows (cuBLASLt wants a multiple of 4) and reads defined values.
// REQUIRES: `in` a multiple of 16 (of 128 block-scaled), x and out 16-byte aligned; stride >=
// rows.
struct Fp8QuantizeArgs {
  DType element = DType::kUnset;
  Fp8Scales scales_kind = Fp8Scales::kBlock128;
  std::uint32_t rows = 0;
  std::uint32_t in = 0;
  std::uint32_t stride = 0;  // of the block-scaled layout: fp8_padded_rows(rows)
  const void* x = nullptr;
  void* out = nullptr;
  float* scales = nullptr;
};
Status fp8_quantize_cuda(const Fp8QuantizeArgs& args, void* stream);

// Rows padded to a multiple of 4: each group's scales start 16-byte aligned, as cuBLASLt
// wants its scale tensors.
constexpr std::uint32_t fp8_padded_rows(std::uint32_t rows) { return (rows + 3) / 4 * 4; }

// Whether this build has the kernels (false: the functions above return Unavailable).
bool fp8_kernels_built();

}  // namespace kvvm
