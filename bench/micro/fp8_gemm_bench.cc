// The projections of Llama-3-8B side by side, one process, one GPU: for each layer shape and
// rows in {1, 2, 4, 8, 16, 64, 256, 4096}, the time of
//   cublas-bf16    cuBLAS GemmEx on bf16 weights (what an unquantized model runs)
//   gemv-bf16      gemv_cuda (rows <= 16)
//   fp8-gemv-blk   fp8_gemv_cuda, 128x128 block scales (rows <= 16)
//   fp8-gemv-chn   fp8_gemv_cuda, per-channel scales (rows <= 16)
//   fp8-gemm-blk   fp8_quantize_cuda + cuBLASLt's FP8 GEMM (Fp8Matmul), block scales: the
//                  activations' quantization lies between start and stop
//   lt-only-blk    the cuBLASLt GEMM alone, the activations quantized before the clock starts
//   fp8-gemm-chn / lt-only-chn   the same, per-channel scales
// with the weights' rate (their bytes over the time: bf16 or e4m3) and TFLOP/s (2 rows in out).
// Each call reads a different copy of the weights, the copies together over twice the L2, so
// no figure is the cache's. Usage: fp8_gemm_bench [milliseconds per measurement, default 50].
#include <cublas_api.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "cuda_timing.h"
#include "kernels/element.h"
#include "kvvm/kernels/fp8_kernels.h"
#include "kvvm/kernels/model_kernels.h"
#include "model/cuda/cublas_api.h"
#include "model/cuda/fp8_matmul.h"

namespace {

using kvvm::DType;
using kvvm::Fp8Scales;
using kvvm::Status;

using kvvm::bench::check;
using kvvm::bench::Copies;
using kvvm::bench::device;
using kvvm::bench::time_us;

[[noreturn]] void die(const std::string& what) { kvvm::bench::die("fp8_gemm_bench", what); }

struct Shape {
  const char* name;
  std::uint32_t in, out;
};

void report(const Shape& s, std::uint32_t rows, const char* method, double us,
            std::uint64_t weight_bytes) {
  const double flops = 2.0 * rows * s.in * s.out;
  std::printf("%-8s %5u x %5u  rows %5u  %-13s %10.2f us  %6.2f TB/s  %7.1f TFLOP/s\n", s.name,
              s.out, s.in, rows, method, us, weight_bytes / (us * 1e6), flops / (us * 1e6));
}

}  // namespace

int main(int argc, char** argv) {
  const double budget_ms = argc > 1 ? std::atof(argv[1]) : 50.0;
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) die("no CUDA device");
  cudaDeviceProp props{};
  check(cudaGetDeviceProperties(&props, 0), "cudaGetDeviceProperties");
  std::printf("fp8_gemm_bench on %s (L2 %d MiB), %.0f ms per figure\n", props.name,
              props.l2CacheSize >> 20, budget_ms);
  const std::uint64_t l2 = static_cast<std::uint64_t>(props.l2CacheSize);

  cudaStream_t stream;
  check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  constexpr std::uint64_t kWorkspace = std::uint64_t{32} << 20;
  void* workspace = device(kWorkspace);

  const auto& cublas = kvvm::model::detail::cublas_library();
  if (!cublas.usable()) die(cublas.error);
  cublasHandle_t handle = nullptr;
  if (cublas.api.create(&handle) != CUBLAS_STATUS_SUCCESS ||
      cublas.api.set_stream(handle, stream) != CUBLAS_STATUS_SUCCESS ||
      cublas.api.set_workspace(handle, workspace, kWorkspace) != CUBLAS_STATUS_SUCCESS) {
    die("cuBLAS setup failed");
  }
  auto made = kvvm::model::detail::Fp8Matmul::create(workspace, kWorkspace);
  check(made.status(), "Fp8Matmul::create");
  std::unique_ptr<kvvm::model::detail::Fp8Matmul> fp8_matmul = std::move(made).value();

  const Shape shapes[] = {
      {"qkv", 4096, 6144}, {"o", 4096, 4096}, {"gate_up", 4096, 28672}, {"down", 14336, 4096}};
  const std::uint32_t row_counts[] = {1, 2, 4, 8, 16, 64, 256, 4096};
  const std::uint32_t most_rows = 4096, widest = 28672, deepest = 14336;

  // Activations and outputs, shared by every shape (sized for the largest).
  std::vector<std::uint8_t> x_host(std::uint64_t{most_rows} * deepest * 2);
  for (std::uint64_t i = 0; i < x_host.size() / 2; ++i) {
    kvvm::kernels::store_element(DType::kBf16,
                                 static_cast<float>((i * 2654435761u) % 2001) / 1000.0f - 1.0f,
                                 &x_host[i * 2]);
  }
  void* x = device(x_host.size());
  check(cudaMemcpy(x, x_host.data(), x_host.size(), cudaMemcpyHostToDevice), "cudaMemcpy");
  const std::uint32_t padded = kvvm::fp8_padded_rows(most_rows);
  void* y = device(std::uint64_t{padded} * widest * 2);
  void* xq = device(std::uint64_t{padded} * deepest);
  auto* xq_scales =
      static_cast<float*>(device(std::uint64_t{padded} * (deepest / kvvm::kFp8Block) * 4));

  for (const Shape& s : shapes) {
    const std::uint64_t elements = std::uint64_t{s.in} * s.out;
    std::vector<std::uint8_t> bf16(elements * 2), fp8(elements);
    for (std::uint64_t i = 0; i < elements; ++i) {
      const float value = static_cast<float>((i * 2246822519u) % 1999) / 1000.0f - 1.0f;
      kvvm::kernels::store_element(DType::kBf16, value * 0.02f, &bf16[i * 2]);
      fp8[i] = kvvm::kernels::float_to_e4m3(value * 400.0f);
    }
    Copies w_bf16(bf16, l2), w_fp8(fp8, l2);
    // Enough floats for either layout: block [out / 128][padded in / 128], channel [out].
    const std::vector<float> scale_host(
        std::max<std::uint64_t>(std::uint64_t{(s.out + 127) / 128} * ((s.in / 128 + 3) / 4 * 4),
                                s.out),
        1.0f / 16384.0f);
    auto* w_scales = static_cast<float*>(device(scale_host.size() * 4));
    check(cudaMemcpy(w_scales, scale_host.data(), scale_host.size() * 4, cudaMemcpyHostToDevice),
          "cudaMemcpy");

    for (const std::uint32_t rows : row_counts) {
      const float alpha = 1.0f, beta = 0.0f;
      report(s, rows, "cublas-bf16",
             time_us(
                 [&] {
                   if (cublas.api.gemm_ex(handle, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(s.out),
                                          static_cast<int>(rows), static_cast<int>(s.in), &alpha,
                                          w_bf16.take(), CUDA_R_16BF, static_cast<int>(s.in), x,
                                          CUDA_R_16BF, static_cast<int>(s.in), &beta, y,
                                          CUDA_R_16BF, static_cast<int>(s.out), CUBLAS_COMPUTE_32F,
                                          CUBLAS_GEMM_DEFAULT) != CUBLAS_STATUS_SUCCESS) {
                     die("cublasGemmEx failed");
                   }
                 },
                 stream, budget_ms),
             elements * 2);
      if (rows <= kvvm::kGemvMaxRows) {
        report(s, rows, "gemv-bf16",
               time_us(
                   [&] {
                     kvvm::GemvParams p;
                     p.element = DType::kBf16;
                     p.rows = rows;
                     p.in = s.in;
                     p.out = s.out;
                     p.x = x;
                     p.weight = w_bf16.take();
                     p.y = y;
                     check(kvvm::gemv_cuda(p, stream), "gemv_cuda");
                   },
                   stream, budget_ms),
               elements * 2);
      }
      for (const Fp8Scales kind : {Fp8Scales::kBlock128, Fp8Scales::kChannel}) {
        const bool block = kind == Fp8Scales::kBlock128;
        if (rows <= kvvm::kFp8GemvMaxRows) {
          report(s, rows, block ? "fp8-gemv-blk" : "fp8-gemv-chn",
                 time_us(
                     [&] {
                       kvvm::Fp8GemvArgs p;
                       p.element = DType::kBf16;
                       p.scales_kind = kind;
                       p.rows = rows;
                       p.in = s.in;
                       p.out = s.out;
                       p.x = x;
                       p.weight = w_fp8.take();
                       p.scales = w_scales;
                       p.y = y;
                       check(kvvm::fp8_gemv_cuda(p, stream), "fp8_gemv_cuda");
                     },
                     stream, budget_ms),
                 elements);
        }
        kvvm::Fp8QuantizeArgs q;
        q.element = DType::kBf16;
        q.scales_kind = kind;
        q.rows = rows;
        q.in = s.in;
        q.stride = kvvm::fp8_padded_rows(rows);
        q.x = x;
        q.out = xq;
        q.scales = xq_scales;
        kvvm::model::detail::Fp8MatmulArgs g;
        g.scales_kind = kind;
        g.element = DType::kBf16;
        g.rows = q.stride;
        g.in = s.in;
        g.out = s.out;
        g.xq = xq;
        g.x_scales = xq_scales;
        g.w_scales = w_scales;
        g.y = y;
        report(s, rows, block ? "fp8-gemm-blk" : "fp8-gemm-chn",
               time_us(
                   [&] {
                     check(kvvm::fp8_quantize_cuda(q, stream), "fp8_quantize_cuda");
                     g.weight = w_fp8.take();
                     check(fp8_matmul->run(g, stream), "Fp8Matmul::run");
                   },
                   stream, budget_ms),
               elements);
        report(s, rows, block ? "lt-only-blk" : "lt-only-chn",
               time_us(
                   [&] {
                     g.weight = w_fp8.take();
                     check(fp8_matmul->run(g, stream), "Fp8Matmul::run");
                   },
                   stream, budget_ms),
               elements);
      }
    }
    (void)cudaFree(w_scales);
  }
  fp8_matmul.reset();
  (void)cudaFree(x);
  (void)cudaFree(y);
  (void)cudaFree(xq);
  (void)cudaFree(xq_scales);
  (void)cudaFree(workspace);
  (void)cublas.api.destroy(handle);
  (void)cudaStreamDestroy(stream);
  return 0;
}
