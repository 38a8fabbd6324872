// The activations' FP8 quantization (include/kvvm/kernels/fp8_kernels.h) bit for bit against the
// host's (codes, scales, the zeroed padding rows), and the same bits from the RMSNorm and the
// SiLU-mul that write the quantized rows themselves. Skipped without a GPU.
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
#include "support/cuda_device.h"
#include "support/device_buffer.h"
#endif

namespace kvvm::fp8_kernels_test {
namespace {

#if defined(KVVM_HAS_CUDA_KERNELS)

TEST(Fp8KernelsCuda, QuantizationIsBitExactAndPadsWithZeros) {
  if (!have_cuda_device()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(11);
  for (const Fp8Scales kind : {Fp8Scales::kBlock128, Fp8Scales::kChannel}) {
    for (const DType type : {DType::kBf16, DType::kFp16}) {
      for (const std::uint32_t rows : {1u, 5u, 64u}) {
        const std::uint32_t in = 512, stride = fp8_padded_rows(rows);
        std::vector<std::uint16_t> x = random_activations(type, std::size_t{rows} * in, rng);
        for (std::uint32_t k = 128; k < 256; ++k) x[k] = 0;  // an all-zero group: scale 1
        DeviceBuffer dx(x), dout(std::size_t{stride} * in),
            dscales(std::size_t{stride} * (in / 128) * 4);
        dout.poison();
        dscales.poison();
        Fp8QuantizeArgs p;
        p.element = type;
        p.scales_kind = kind;
        p.rows = rows;
        p.in = in;
        p.stride = stride;
        p.x = dx.get();
        p.out = dout.get();
        p.scales = static_cast<float*>(dscales.get());
        ASSERT_TRUE(fp8_quantize_cuda(p, nullptr).ok());
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        const Quantized want = quantize_on_host(x, type, kind, rows, in, stride);
        EXPECT_EQ(download<std::uint8_t>(dout), want.codes) << "rows " << rows;
        std::vector<float> scales = download<float>(dscales);
        scales.resize(want.scales.size());
        EXPECT_EQ(scales, want.scales) << "rows " << rows;
      }
    }
  }
}

// The kernel's own quantized copy against its plain output quantized by fp8_quantize_cuda: the
// same codes and scales bit for bit, the padding rows zeros of scale 1, the plain output
// unchanged. Widths: the vector kernels' (RMSNorm up to 16,384; the SiLU-mul's blocks of 1,024
// elements block-scaled, whole or the last one part full) and past them (16,512: the RMSNorm
// falls back to its loop and a separate quantization; 32,896: so does the per-channel SiLU-mul,
// whose row kernel holds 32,768).
TEST(Fp8KernelsCuda, NormAndSiluMulWriteTheQuantizationsBits) {
  if (!have_cuda_device()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(13);
  const auto quantized = [](const DeviceBuffer& codes, const DeviceBuffer& scales, Fp8Scales kind,
                            std::uint32_t stride, std::uint32_t width) {
    Quantized q;
    q.codes = download<std::uint8_t>(codes);
    q.scales = download<float>(scales);
    q.scales.resize(kind == Fp8Scales::kBlock128 ? std::size_t{width / 128} * stride : stride);
    return q;
  };
  for (const Fp8Scales kind : {Fp8Scales::kBlock128, Fp8Scales::kChannel}) {
    for (const DType type : {DType::kBf16, DType::kFp16}) {
      for (const std::uint32_t width : {512u, 4096u, 16512u, 32896u}) {
        for (const std::uint32_t rows : {1u, 5u, 17u, 64u}) {
          if (width > 16512 && rows > 5) continue;  // the fallback once is enough
          SCOPED_TRACE(::testing::Message()
                       << "kind " << static_cast<int>(kind) << ", " << to_string(type) << ", width "
                       << width << ", rows " << rows);
          const std::uint32_t stride = fp8_padded_rows(rows);
          const std::size_t count = std::size_t{rows} * width;
          std::vector<std::uint16_t> x = random_activations(type, count, rng);
          for (std::uint32_t k = 128; k < 256; ++k) x[k] = 0;  // an all-zero group
          const std::vector<std::uint16_t> add = random_activations(type, count, rng);
          const std::vector<std::uint16_t> weight = random_activations(type, width, rng);
          const std::vector<std::uint16_t> gate_up = random_activations(type, 2 * count, rng);
          DeviceBuffer x1(x), x2(x), dadd(add), dweight(weight), dgate_up(gate_up), out1(count * 2),
              out2(count * 2), codes1(std::size_t{stride} * width),
              codes2(std::size_t{stride} * width), scales1(std::size_t{stride} * (width / 128) * 4),
              scales2(std::size_t{stride} * (width / 128) * 4);
          for (DeviceBuffer* b : {&out1, &out2, &codes1, &codes2, &scales1, &scales2}) b->poison();
          QuantizedRows q;
          q.kind = kind;
          q.stride = stride;
          q.out = codes1.get();
          q.scales = static_cast<float*>(scales1.get());
          const auto separately = [&](const void* rows_written) {
            Fp8QuantizeArgs a;
            a.element = type;
            a.scales_kind = kind;
            a.rows = rows;
            a.in = width;
            a.stride = stride;
            a.x = rows_written;
            a.out = codes2.get();
            a.scales = static_cast<float*>(scales2.get());
            return fp8_quantize_cuda(a, nullptr);
          };
          const auto expect_same = [&](const char* kernel) {
            ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << kernel;
            EXPECT_EQ(download<std::uint16_t>(out1), download<std::uint16_t>(out2)) << kernel;
            const Quantized fused = quantized(codes1, scales1, kind, stride, width);
            const Quantized apart = quantized(codes2, scales2, kind, stride, width);
            EXPECT_EQ(fused.codes, apart.codes) << kernel;
            EXPECT_EQ(fused.scales, apart.scales) << kernel;
          };

          RmsNormParams norm;
          norm.element = type;
          norm.rows = rows;
          norm.hidden = width;
          norm.eps = 1e-6f;
          norm.add = dadd.get();
          norm.weight = dweight.get();
          norm.x = x1.get();
          norm.out = out1.get();
          norm.quantized = q;
          ASSERT_TRUE(rmsnorm_cuda(norm, nullptr).ok());
          norm.x = x2.get();
          norm.out = out2.get();
          norm.quantized = QuantizedRows{};
          ASSERT_TRUE(rmsnorm_cuda(norm, nullptr).ok());
          ASSERT_TRUE(separately(out2.get()).ok());
          expect_same("rmsnorm");
          EXPECT_EQ(download<std::uint16_t>(x1), download<std::uint16_t>(x2));  // the residual

          for (DeviceBuffer* b : {&out1, &out2, &codes1, &codes2, &scales1, &scales2}) b->poison();
          SiluMulParams silu;
          silu.element = type;
          silu.rows = rows;
          silu.inter = width;
          silu.gate_up = dgate_up.get();
          silu.out = out1.get();
          silu.quantized = q;
          ASSERT_TRUE(silu_mul_cuda(silu, nullptr).ok());
          silu.out = out2.get();
          silu.quantized = QuantizedRows{};
          ASSERT_TRUE(silu_mul_cuda(silu, nullptr).ok());
          ASSERT_TRUE(separately(out2.get()).ok());
          expect_same("silu_mul");
        }
      }
    }
  }
}

#endif  // KVVM_HAS_CUDA_KERNELS

}  // namespace
}  // namespace kvvm::fp8_kernels_test
