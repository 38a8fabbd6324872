// The FP8 projections' GEMV (include/kvvm/kernels/fp8_kernels.h) against float64 references
// computed on the host from the same e4m3 bytes and scales: 1 to 16 rows, both scalings, bf16
// and fp16, bias and beta, every forced split and unroll; and its tensor-core form over
// quantized activations for 1 to 8 rows. Skipped without a GPU.
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

TEST(Fp8KernelsCuda, GemvMatchesAFloat64ReferenceForEveryRowCount) {
  if (!have_cuda_device()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(7);
  struct Shape {
    std::uint32_t out, in;
  };
  for (const Fp8Scales kind : {Fp8Scales::kBlock128, Fp8Scales::kChannel}) {
    // 6144 x 4096: Llama-3-8B's q|k|v; 200 x 144: partial blocks in both dimensions.
    for (const Shape shape : {Shape{384, 256}, Shape{200, 144}, Shape{6144, 4096}}) {
      const Weights w = make_weights(shape.out, shape.in, kind, rng);
      DeviceBuffer codes(w.codes), scales(w.scales);
      for (const DType type : {DType::kBf16, DType::kFp16}) {
        for (const std::uint32_t rows : {1u, 2u, 3u, 8u, 16u}) {
          const std::vector<std::uint16_t> x =
              random_activations(type, std::size_t{rows} * shape.in, rng);
          const std::vector<std::uint16_t> bias = random_activations(type, shape.out, rng);
          DeviceBuffer dx(x), dbias(bias), dy(std::size_t{rows} * shape.out * 2);
          for (const bool with_bias : {false, true}) {
            Fp8GemvArgs p;
            p.element = type;
            p.scales_kind = kind;
            p.rows = rows;
            p.in = shape.in;
            p.out = shape.out;
            p.bias = with_bias ? dbias.get() : nullptr;
            p.x = dx.get();
            p.weight = codes.get();
            p.scales = static_cast<const float*>(scales.get());
            p.y = dy.get();
            dy.poison();
            ASSERT_TRUE(fp8_gemv_cuda(p, nullptr).ok());
            ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
            const std::vector<std::uint16_t> y = download<std::uint16_t>(dy);
            for (std::uint32_t r = 0; r < rows; ++r) {
              for (std::uint32_t n = 0; n < shape.out; n += (shape.out > 1000 ? 37 : 1)) {
                double sum = 0, magnitude = 0;
                for (std::uint32_t k = 0; k < shape.in; ++k) {
                  const double term =
                      w.at(n, k) * from_bits(type, x[std::size_t{r} * shape.in + k]);
                  sum += term;
                  magnitude += std::fabs(term);
                }
                if (with_bias) sum += from_bits(type, bias[n]);
                const double got = from_bits(type, y[std::size_t{r} * shape.out + n]);
                // One rounding to the 16-bit type, float32 sums.
                EXPECT_NEAR(got, sum, std::fabs(sum) / 128 + magnitude * 1e-5 + 1e-6)
                    << "rows " << rows << " row " << r << " output " << n << " of " << shape.out
                    << "x" << shape.in;
              }
            }
            if (rows > 1) {
              // The first row alone gives the same bits as in the batch.
              DeviceBuffer alone(std::size_t{shape.out} * 2);
              p.rows = 1;
              p.y = alone.get();
              ASSERT_TRUE(fp8_gemv_cuda(p, nullptr).ok());
              ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
              const std::vector<std::uint16_t> first = download<std::uint16_t>(alone);
              EXPECT_TRUE(std::equal(first.begin(), first.end(), y.begin()))
                  << "a row's result depends on the batch beside it";
            }
          }
        }
      }
    }
  }
}

// Every forced split (warps per output) and unroll (loads in flight per lane) computes the same
// function: shapes whose rows end inside a lane's round of loads, whose outputs end inside a
// block, and rows as long as Llama-3-8B's down projection's, at one and two rows.
TEST(Fp8KernelsCuda, GemvMatchesAFloat64ReferenceWithEverySplitAndUnroll) {
  if (!have_cuda_device()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(11);
  struct Shape {
    std::uint32_t out, in;
  };
  for (const Fp8Scales kind : {Fp8Scales::kBlock128, Fp8Scales::kChannel}) {
    for (const Shape shape : {Shape{37, 272}, Shape{200, 2064}, Shape{256, 14336}}) {
      const Weights w = make_weights(shape.out, shape.in, kind, rng);
      DeviceBuffer codes(w.codes), scales(w.scales);
      const DType type = DType::kBf16;
      const std::vector<std::uint16_t> x = random_activations(type, std::size_t{2} * shape.in, rng);
      DeviceBuffer dx(x), dy(std::size_t{2} * shape.out * 2);
      std::vector<double> want(std::size_t{2} * shape.out), magnitude(want.size());
      for (std::uint32_t r = 0; r < 2; ++r) {
        for (std::uint32_t n = 0; n < shape.out; ++n) {
          for (std::uint32_t k = 0; k < shape.in; ++k) {
            const double term = w.at(n, k) * from_bits(type, x[std::size_t{r} * shape.in + k]);
            want[std::size_t{r} * shape.out + n] += term;
            magnitude[std::size_t{r} * shape.out + n] += std::fabs(term);
          }
        }
      }
      for (const std::uint32_t rows : {1u, 2u}) {
        for (const std::uint32_t split : {1u, 2u, 4u, 8u}) {
          for (const std::uint32_t unroll : {4u, 8u}) {
            Fp8GemvArgs p;
            p.element = type;
            p.scales_kind = kind;
            p.rows = rows;
            p.in = shape.in;
            p.out = shape.out;
            p.x = dx.get();
            p.weight = codes.get();
            p.scales = static_cast<const float*>(scales.get());
            p.y = dy.get();
            p.split = split;
            p.unroll = unroll;
            dy.poison();
            ASSERT_TRUE(fp8_gemv_cuda(p, nullptr).ok());
            ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
            const std::vector<std::uint16_t> y = download<std::uint16_t>(dy);
            std::size_t bad = 0;
            for (std::size_t i = 0; i < std::size_t{rows} * shape.out; ++i) {
              const double got = from_bits(type, y[i]);
              if (!(std::fabs(got - want[i]) <=
                    std::fabs(want[i]) / 128 + magnitude[i] * 1e-5 + 1e-6)) {
                ++bad;
              }
            }
            EXPECT_EQ(bad, 0u) << shape.out << "x" << shape.in << " rows " << rows << " split "
                               << split << " unroll " << unroll
                               << (kind == Fp8Scales::kBlock128 ? " block" : " channel");
          }
        }
      }
    }
  }
}

// The tensor-core form (xq): y = dq(xq) . dq(w)^T against float64 from the same codes and
// scales (the activations quantized on the host as fp8_quantize_cuda does, bit for bit above),
// for 1 to 8 rows, with every forced split and unroll or the kernel's own choice, bf16 and
// fp16, with a bias. Each step's 64 products are summed by the tensor core (fewer bits than
// float32 kept), so the bound allows 2^-11 of the terms' magnitude; a k misplaced between the
// operands or a scale of the wrong group or row is off by far more. With the kernel's choice
// a row's bits do not depend on the rows beside it; rows past `rows` are never written.
struct MmaShape {
  std::uint32_t out, in;
};
struct MmaVariant {
  std::uint32_t split, unroll;
};
void expect_mma_gemv_matches(Fp8Scales kind, MmaShape shape,
                             const std::vector<std::uint32_t>& row_counts,
                             const std::vector<MmaVariant>& variants, std::mt19937& rng) {
  constexpr std::uint32_t kRows = kFp8MmaGemvRows, kStride = kRows;
  const bool block = kind == Fp8Scales::kBlock128;
  const Weights w = make_weights(shape.out, shape.in, kind, rng);
  DeviceBuffer codes(w.codes), scales(w.scales);
  for (const DType type : {DType::kBf16, DType::kFp16}) {
    const std::vector<std::uint16_t> x =
        random_activations(type, std::size_t{kRows} * shape.in, rng);
    const std::vector<std::uint16_t> bias = random_activations(type, shape.out, rng);
    const Quantized q = quantize_on_host(x, type, kind, kRows, shape.in, kStride);
    DeviceBuffer dxq(q.codes), dxs(q.scales), dbias(bias);
    // Outputs one row past the last one a call may write, to see it untouched.
    DeviceBuffer dy(std::size_t{kRows + 1} * shape.out * 2);
    std::vector<double> want(std::size_t{kRows} * shape.out), magnitude(want.size());
    for (std::uint32_t r = 0; r < kRows; ++r) {
      for (std::uint32_t n = 0; n < shape.out; ++n) {
        double sum = from_bits(type, bias[n]), size = 0;
        for (std::uint32_t k = 0; k < shape.in; ++k) {
          const double xs = block ? q.scales[std::size_t{k / 128} * kStride + r] : q.scales[r];
          const double term =
              w.at(n, k) * kernels::e4m3_to_float(q.codes[std::size_t{r} * shape.in + k]) * xs;
          sum += term;
          size += std::fabs(term);
        }
        want[std::size_t{r} * shape.out + n] = sum;
        magnitude[std::size_t{r} * shape.out + n] = size;
      }
    }
    std::vector<std::uint16_t> alone;  // row 0 of the one-row call, the kernel's choice
    for (const std::uint32_t rows : row_counts) {
      for (const MmaVariant v : variants) {
        Fp8GemvArgs p;
        p.element = type;
        p.scales_kind = kind;
        p.rows = rows;
        p.in = shape.in;
        p.out = shape.out;
        p.bias = dbias.get();
        p.xq = dxq.get();
        p.x_scales = static_cast<const float*>(dxs.get());
        p.x_stride = kStride;
        p.weight = codes.get();
        p.scales = static_cast<const float*>(scales.get());
        p.y = dy.get();
        p.split = v.split;
        p.unroll = v.unroll;
        dy.poison();
        ASSERT_TRUE(fp8_gemv_cuda(p, nullptr).ok());
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        const std::vector<std::uint16_t> y = download<std::uint16_t>(dy);
        std::size_t bad = 0, first_bad = 0;
        for (std::size_t i = 0; i < std::size_t{rows} * shape.out; ++i) {
          const double got = from_bits(type, y[i]);
          if (!(std::fabs(got - want[i]) <=
                std::fabs(want[i]) / 128 + magnitude[i] * 0x1p-11 + 1e-6)) {
            if (bad++ == 0) first_bad = i;
          }
        }
        EXPECT_EQ(bad, 0u) << shape.out << "x" << shape.in << " rows " << rows << " split "
                           << v.split << " unroll " << v.unroll << " " << to_string(type)
                           << (block ? " block" : " channel") << "; first: output " << first_bad
                           << " got " << from_bits(type, y[first_bad]) << " want "
                           << want[first_bad];
        EXPECT_TRUE(std::all_of(y.begin() + std::size_t{rows} * shape.out, y.end(),
                                [](std::uint16_t value) { return value == 0xffff; }))
            << "a row past `rows` was written";
        if (v.split == 0 && v.unroll == 0) {
          if (alone.empty()) alone.assign(y.begin(), y.begin() + shape.out);
          EXPECT_TRUE(std::equal(alone.begin(), alone.end(), y.begin()))
              << "row 0 differs with " << rows << " rows beside it";
        }
      }
    }
  }
}

// Shapes with partial tiles of 16 outputs, a row ending inside a 64-byte step (per channel)
// and rows as long as Llama-3-8B's down projection's.
TEST(Fp8KernelsCuda, MmaGemvMatchesAFloat64ReferenceWithEverySplitAndUnroll) {
  if (!have_cuda_device()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(17);
  std::vector<MmaVariant> variants = {{0, 0}};
  for (const std::uint32_t split : {1u, 2u, 4u, 8u}) {
    for (const std::uint32_t unroll : {4u, 8u}) variants.push_back({split, unroll});
  }
  for (const Fp8Scales kind : {Fp8Scales::kBlock128, Fp8Scales::kChannel}) {
    const bool block = kind == Fp8Scales::kBlock128;
    for (const MmaShape shape : {MmaShape{200, block ? 384u : 272u},
                                 MmaShape{37, block ? 256u : 48u}, MmaShape{256, 14336}}) {
      expect_mma_gemv_matches(kind, shape, {1, 2, 3, 5, 8}, variants, rng);
    }
  }
}

// Llama-3-8B's q|k|v, as the model calls it.
TEST(Fp8KernelsCuda, MmaGemvMatchesAFloat64ReferenceOnAServedShape) {
  if (!have_cuda_device()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(19);
  for (const Fp8Scales kind : {Fp8Scales::kBlock128, Fp8Scales::kChannel}) {
    expect_mma_gemv_matches(kind, MmaShape{6144, 4096}, {1, 4, 8}, {{0, 0}}, rng);
  }
}

#endif  // KVVM_HAS_CUDA_KERNELS

}  // namespace
}  // namespace kvvm::fp8_kernels_test
