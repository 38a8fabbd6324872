// The CUDA model's projections, y[rows][out] = x[rows][in] . W^T (+ bias): gemv_cuda for the
// few rows of a decode step, cuBLAS past them, and an FP8 weight's forms (the GEMV on the
// activations as they are, its tensor-core form, cuBLASLt's FP8 GEMM).
#include <cstdint>
#include <string>

#include "kvvm/kernels/fp8_kernels.h"
#include "kvvm/kernels/model_kernels.h"
#include "model/cuda/cublas_api.h"
#include "model/cuda/cuda_model.h"

namespace kvvm::model::detail {
namespace {

Status cublas_gemm_status(cublasStatus_t status) {
  if (status == CUBLAS_STATUS_SUCCESS) return Status::Ok();
  const std::string name = cublas_status_name(status);
  return Status::DriverError("cublasGemmEx failed: " + name,
                             DriverFailure{"cublasGemmEx", name, static_cast<int>(status)});
}

}  // namespace

// The projections of a batch of at most this many rows run as gemv_cuda (fused path): a
// library GEMM of so few rows streams the weights below the memory's rate. Above it the GEMV's
// float32 products (no tensor cores) cost more than the reads they save: measured on the H200
// (docs/PERFORMANCE.md), 4 rows of the 8B shape take 8.8 ms a step against cuBLAS's ~6.4.
constexpr std::uint32_t kGemvRows = 2;

bool CudaModel::gemv_shape(std::uint32_t rows, std::uint32_t in) const {
  return fused_ && rows <= kGemvRows && in % 8 == 0;
}

Status CudaModel::linear(const void* x, const void* weight, const float* scales, const void* bias,
                         void* y, std::uint32_t rows, std::uint32_t in, std::uint32_t out,
                         bool x_quantized) {
  if (scales != nullptr) {
    return linear_fp8(x, weight, scales, bias, y, rows, in, out, x_quantized);
  }
  if (gemv_shape(rows, in)) return gemv(x, weight, bias, y, false, 0.0f, rows, in, out);
  KVVM_RETURN_IF_ERROR(lay_bias_under(bias, y, rows, out));
  return gemm(x, weight, y, data_type_, bias != nullptr ? 1.0f : 0.0f, rows, in, out);
}

Status CudaModel::lay_bias_under(const void* bias, void* y, std::uint32_t rows, std::uint32_t out) {
  if (bias == nullptr) return Status::Ok();
  BroadcastRowsParams under;
  under.element = compute_;
  under.rows = rows;
  under.cols = out;
  under.row = bias;
  under.out = y;
  return broadcast_rows_cuda(under, stream_);
}

// How an FP8 projection of `rows` rows runs, measured on the H200 (docs/PERFORMANCE.md, "The
// FP8 GEMV on the tensor cores"): one row as fp8_gemv_cuda on the activations as they are (the
// tensor-core form saves at most 4 us a layer there, less than its quantizing costs: an 8B step
// took 3.7 ms quantizing first against 3.1); up to kFp8GemvRows rows as its tensor-core form (8
// rows read the weights once, as one does: at 2 rows the widening form took 1.3-2x as long);
// past it cuBLASLt's GEMM. The last two take the activations quantized the same way.
constexpr std::uint32_t kFp8WideningRows = 1;
constexpr std::uint32_t kFp8GemvRows = kFp8MmaGemvRows;

namespace {
Fp8Scales fp8_scales_of(WeightQuant quant) {
  return quant == WeightQuant::kFp8Block ? Fp8Scales::kBlock128 : Fp8Scales::kChannel;
}
}  // namespace

QuantizedRows CudaModel::quantized_input(std::uint32_t rows) const {
  QuantizedRows q;
  if (config().weight_quant == WeightQuant::kNone || !fused_ || rows <= kFp8WideningRows) return q;
  q.kind = fp8_scales_of(config().weight_quant);
  q.stride = fp8_padded_rows(rows);
  q.out = xq_;
  q.scales = xq_scales_;
  return q;
}

Status CudaModel::linear_fp8(const void* x, const void* weight, const float* scales,
                             const void* bias, void* y, std::uint32_t rows, std::uint32_t in,
                             std::uint32_t out, bool x_quantized) {
  const Fp8Scales kind = fp8_scales_of(config().weight_quant);
  // The GEMV's fields but its activations, which depend on the form below.
  Fp8GemvArgs gemv;
  gemv.element = compute_;
  gemv.scales_kind = kind;
  gemv.rows = rows;
  gemv.in = in;
  gemv.out = out;
  gemv.bias = bias;
  gemv.weight = weight;
  gemv.scales = scales;
  gemv.y = y;
  if (rows <= kFp8WideningRows) {
    gemv.x = x;
    return fp8_gemv_cuda(gemv, stream_);
  }
  // Rows are padded to a multiple of 4 (cuBLASLt's): the padding rows are quantized as zeros
  // and the GEMM's outputs for them land in the buffers' padding (allocate_buffers sizes them
  // so), never read; the GEMV writes only `rows`.
  const std::uint32_t padded = fp8_padded_rows(rows);
  if (!x_quantized) {
    Fp8QuantizeArgs quantize;
    quantize.element = compute_;
    quantize.scales_kind = kind;
    quantize.rows = rows;
    quantize.in = in;
    quantize.stride = padded;
    quantize.x = x;
    quantize.out = xq_;
    quantize.scales = xq_scales_;
    KVVM_RETURN_IF_ERROR(fp8_quantize_cuda(quantize, stream_));
  }
  if (rows <= kFp8GemvRows) {
    gemv.xq = xq_;
    gemv.x_scales = xq_scales_;
    gemv.x_stride = padded;
    return fp8_gemv_cuda(gemv, stream_);
  }
  KVVM_RETURN_IF_ERROR(lay_bias_under(bias, y, padded, out));
  Fp8MatmulArgs gemm;
  gemm.scales_kind = kind;
  gemm.element = compute_;
  gemm.rows = padded;
  gemm.in = in;
  gemm.out = out;
  gemm.xq = xq_;
  gemm.x_scales = xq_scales_;
  gemm.weight = weight;
  gemm.w_scales = scales;
  gemm.y = y;
  gemm.beta = bias != nullptr ? 1.0f : 0.0f;
  return fp8_matmul_->run(gemm, stream_);
}

Status CudaModel::gemv(const void* x, const void* weight, const void* bias, void* y, bool y_float,
                       float beta, std::uint32_t rows, std::uint32_t in, std::uint32_t out) {
  GemvParams p;
  p.element = compute_;
  p.rows = rows;
  p.in = in;
  p.out = out;
  p.beta = beta;
  p.bias = bias;
  p.y_float = y_float;
  p.x = x;
  p.weight = weight;
  p.y = y;
  return gemv_cuda(p, stream_);
}

// Row-major y[rows][out] = x[rows][in] . W^T with W [out][in] row-major is, in cuBLAS's
// column-major terms, C[out x rows] = op_T(W as [in x out]) . (x as [in x rows]).
Status CudaModel::gemm(const void* x, const void* weight, void* y, cudaDataType y_type, float beta,
                       std::uint32_t rows, std::uint32_t in, std::uint32_t out) {
  if (gemv_shape(rows, in)) {
    return gemv(x, weight, nullptr, y, y_type == CUDA_R_32F, beta, rows, in, out);
  }
  const float alpha = 1.0f;
  const CublasApi& api = cublas_library().api;
  return cublas_gemm_status(
      api.gemm_ex(cublas_, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(out), static_cast<int>(rows),
                  static_cast<int>(in), &alpha, weight, data_type_, static_cast<int>(in), x,
                  data_type_, static_cast<int>(in), &beta, y, y_type, static_cast<int>(out),
                  CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

}  // namespace kvvm::model::detail
