// cuBLASLt's FP8 GEMM (model/fp8_matmul.h) against float64 references computed on the host
// from the same e4m3 bytes and scales, on the shapes of the models it serves, rows 4 to 8,192.
// Skipped without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "kernels/element.h"
#include "kvvm/kernels/fp8_kernels.h"
#include "kvvm/kernels/model_kernels.h"
#if defined(KVVM_HAS_CUDA_KERNELS)
#include <cuda_runtime.h>

#include "fp8_fixture.h"
#include "model/cuda/fp8_matmul.h"
#include "support/cuda_device.h"
#include "support/device_buffer.h"
#endif

namespace kvvm::fp8_kernels_test {
namespace {

#if defined(KVVM_HAS_CUDA_KERNELS)

TEST(Fp8MatmulCuda, MatchesAFloat64ReferenceOnTheServedShapes) {
  if (!have_cuda_device()) GTEST_SKIP() << "no CUDA device";
  DeviceBuffer workspace(std::size_t{32} << 20);
  Result<std::unique_ptr<model::detail::Fp8Matmul>> made =
      model::detail::Fp8Matmul::create(workspace.get(), workspace.bytes());
  ASSERT_TRUE(made.ok()) << made.status().to_string();
  model::detail::Fp8Matmul& gemm = **made;
  std::mt19937 rng(13);
  struct Case {
    std::uint32_t rows, out, in;
  };
  // Llama-3-8B's q|k|v and down, Qwen2.5-0.5B's down (896 = 7 x 128: padded scale rows),
  // Qwen3-8B's k; 17 rows pad to 20.
  const Case cases[] = {
      {17, 6144, 4096}, {4, 4096, 14336}, {128, 896, 4864}, {1000, 1024, 384}, {8192, 256, 256}};
  for (const Fp8Scales kind : {Fp8Scales::kBlock128, Fp8Scales::kChannel}) {
    for (const Case& c : cases) {
      const DType type = c.rows == 128 ? DType::kFp16 : DType::kBf16;
      const Weights w = make_weights(c.out, c.in, kind, rng);
      const std::uint32_t stride = fp8_padded_rows(c.rows);
      const std::vector<std::uint16_t> x =
          random_activations(type, std::size_t{c.rows} * c.in, rng);
      DeviceBuffer codes(w.codes), scales(w.scales), dx(x), xq(std::size_t{stride} * c.in),
          xs(std::size_t{stride} * (c.in / 128) * 4), dy(std::size_t{stride} * c.out * 2);
      Fp8QuantizeArgs q;
      q.element = type;
      q.scales_kind = kind;
      q.rows = c.rows;
      q.in = c.in;
      q.stride = stride;
      q.x = dx.get();
      q.out = xq.get();
      q.scales = static_cast<float*>(xs.get());
      ASSERT_TRUE(fp8_quantize_cuda(q, nullptr).ok());
      model::detail::Fp8MatmulArgs a;
      a.scales_kind = kind;
      a.element = type;
      a.rows = stride;
      a.in = c.in;
      a.out = c.out;
      a.xq = xq.get();
      a.x_scales = static_cast<const float*>(xs.get());
      a.weight = codes.get();
      a.w_scales = static_cast<const float*>(scales.get());
      a.y = dy.get();
      const Status ran = gemm.run(a, nullptr);
      ASSERT_TRUE(ran.ok()) << ran.to_string();
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      const Quantized host = quantize_on_host(x, type, kind, c.rows, c.in, stride);
      const std::vector<std::uint16_t> y = download<std::uint16_t>(dy);
      double error2 = 0, norm2 = 0;
      std::uint32_t checked = 0;
      for (std::uint32_t r = 0; r < c.rows; r += (c.rows > 64 ? 61 : 1)) {
        for (std::uint32_t n = 0; n < c.out; n += (c.out > 512 ? 29 : 1)) {
          double sum = 0, magnitude = 0, exact = 0;
          for (std::uint32_t k = 0; k < c.in; ++k) {
            const double xs_value = kind == Fp8Scales::kBlock128
                                        ? host.scales[std::size_t{k / 128} * stride + r]
                                        : host.scales[r];
            const double xv =
                static_cast<double>(kernels::e4m3_to_float(host.codes[std::size_t{r} * c.in + k])) *
                xs_value;
            const double term = w.at(n, k) * xv;
            sum += term;
            magnitude += std::fabs(term);
            exact += w.at(n, k) * from_bits(type, x[std::size_t{r} * c.in + k]);
          }
          const double got = from_bits(type, y[std::size_t{r} * c.out + n]);
          // bf16 rounding of y, and the FP8 tensor cores' accumulation: Hopper adds an MMA's
          // products in a fixed-point accumulator of limited width before the float32 sum, so
          // a sum that cancels keeps an error of about 2^-14 of its terms' magnitude (measured
          // here: 1.8e-5 on a row of 256 products at 8,192 rows; DeepSeek-V3's report, ~14 bits).
          ASSERT_NEAR(got, sum, std::fabs(sum) / 128 + magnitude / 8192 + 1e-6)
              << (kind == Fp8Scales::kBlock128 ? "block" : "channel") << " rows " << c.rows
              << " row " << r << " output " << n << " of " << c.out << "x" << c.in;
          error2 += (got - exact) * (got - exact);
          norm2 += exact * exact;
          ++checked;
        }
      }
      // Against the unquantized activations: e4m3's 3-bit mantissa, averaged over the sum.
      EXPECT_LT(std::sqrt(error2 / norm2), 0.05) << checked << " outputs, rows " << c.rows;
    }
  }
}

#endif  // KVVM_HAS_CUDA_KERNELS

}  // namespace
}  // namespace kvvm::fp8_kernels_test
