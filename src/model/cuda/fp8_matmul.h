// cuBLASLt's FP8 GEMM on the tensor cores for an FP8 checkpoint's projections, with the
// checkpoint's own scales: y[rows][out] = (xq . w^T) scaled, xq the activations quantized by
// fp8_quantize_cuda (include/kvvm/kernels/fp8_kernels.h).
//
// In cuBLAS's column-major terms D[out x rows] = op_T(A) . B with A the weights (e4m3
// [out][in] row-major, i.e. [in x out] with ld in: the "TN" form Hopper's FP8 GEMMs take) and B
// the activations ([in x rows], ld in). Scale modes: block-scaled checkpoints A
// BLK128x128_32F (the store's [ceil(out / 128)][device_scale_row(in)] floats: each row of
// blocks padded to 4) and B VEC128_32F (group-major [in / 128][rows]); per-channel checkpoints
// OUTER_VEC_32F for both (A: one per output, B: one per row). `rows` must be a multiple of 4
// (fp8_padded_rows): cuBLASLt reads the activations' scales 16-byte aligned per group, so the
// caller pads the rows (quantized as zeros) and y holds the padded rows.
//
// Why plans are cached: the heuristic query costs tens of microseconds; a decode step's shapes
// repeat, so each (scaling, type, rows, in, out, beta) is planned once and its descriptor,
// layouts and algorithm kept. A call allocates nothing and never synchronizes, so a CUDA graph
// can capture it.
#pragma once

#include <cublasLt.h>

#include <cstdint>
#include <map>
#include <memory>
#include <tuple>

#include "kvvm/base/dtype.h"
#include "kvvm/base/status.h"
#include "kvvm/kernels/fp8_kernels.h"

namespace kvvm::model::detail {

struct Fp8MatmulArgs {
  Fp8Scales scales_kind = Fp8Scales::kBlock128;
  DType element = DType::kUnset;  // y's: bf16 or fp16
  std::uint32_t rows = 0;         // a multiple of 4
  std::uint32_t in = 0;
  std::uint32_t out = 0;
  const void* xq = nullptr;         // e4m3 [rows][in]
  const float* x_scales = nullptr;  // fp8_quantize_cuda's, for `rows` rows
  const void* weight = nullptr;     // e4m3 [out][in]
  const float* w_scales = nullptr;
  void* y = nullptr;  // [rows][out]
  float beta = 0;     // 1: add to what y holds (a bias broadcast before)
};

class Fp8Matmul {
 public:
  // `workspace` (device memory, `bytes` of it) is lent for the object's life; steps on one
  // stream may share it with cuBLAS. Unavailable naming why when cuBLASLt cannot be loaded.
  static Result<std::unique_ptr<Fp8Matmul>> create(void* workspace, std::uint64_t bytes);
  Fp8Matmul(const Fp8Matmul&) = delete;
  Fp8Matmul& operator=(const Fp8Matmul&) = delete;
  ~Fp8Matmul();

  // InvalidArgument naming the value for a bad shape or pointer; Unavailable naming the shape
  // when cuBLASLt has no algorithm for it; DriverError naming the call and its status.
  Status run(const Fp8MatmulArgs& args, void* stream);

 private:
  struct Plan {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
    cublasLtMatmulAlgo_t algo{};
  };
  using Key = std::tuple<int, int, std::uint32_t, std::uint32_t, std::uint32_t, bool>;

  Fp8Matmul() = default;
  Result<Plan*> plan_for(const Fp8MatmulArgs& args);
  void destroy(Plan& plan);

  cublasLtHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  std::uint64_t workspace_bytes_ = 0;
  std::map<Key, Plan> plans_;
};

}  // namespace kvvm::model::detail
