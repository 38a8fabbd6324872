// The FP8 projections' kernels (include/kvvm/kernels/fp8_kernels.h) and cuBLASLt's FP8 GEMM
// (model/fp8_matmul.h) against float64 references computed on the host from the same e4m3
// bytes and scales: the GEMV for 1 to 16 rows, both scalings, bf16 and fp16, bias and beta; the
// activations' quantization bit for bit (codes, scales, the zeroed padding rows), and the same
// bits from the RMSNorm and the SiLU-mul that write the quantized rows themselves; the GEMV's
// tensor-core form over quantized activations for 1 to 8 rows; the GEMM on
// the shapes of the models it serves, rows 4 to 8,192. Scales differ block by block (powers of
// two from 1/8 to 8), so a scale read from the wrong block or in the wrong layout fails. The
// argument checks run in every build; the rest is skipped without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "kernels/element.h"
#include "kernels/fp8_checks.h"
#include "kvvm/kernels/fp8_kernels.h"
#include "kvvm/kernels/model_kernels.h"
#if defined(KVVM_HAS_CUDA_KERNELS)
#include <cuda_runtime.h>

#include "model/fp8_matmul.h"
#include "support/cuda_device.h"
#include "support/device_buffer.h"
#endif

namespace kvvm::fp8_kernels_test {
namespace {

TEST(Fp8KernelChecks, MalformedCallsAreRefusedNamingTheValue) {
  alignas(16) static std::uint8_t host[64] = {};
  const auto gemv = [&] {
    Fp8GemvArgs p;
    p.element = DType::kBf16;
    p.rows = 2;
    p.in = 32;
    p.out = 4;
    p.x = host;
    p.weight = host;
    p.scales = reinterpret_cast<const float*>(host);
    p.y = host;
    return p;
  };
  ASSERT_TRUE(kernels::check_fp8_gemv(gemv()).ok());
  constexpr std::size_t kWidening = 10;  // the cases of x as it is, then those of xq
  const std::pair<std::function<void(Fp8GemvArgs&)>, std::string> bad[] = {
      {[](Fp8GemvArgs& p) { p.element = DType::kFp32; }, "element type fp32"},
      {[](Fp8GemvArgs& p) { p.rows = 17; }, "17 rows, more than 16"},
      {[](Fp8GemvArgs& p) { p.in = 24; }, "in 24 x out 4"},
      {[](Fp8GemvArgs& p) { p.out = 0; }, "in 32 x out 0"},
      {[](Fp8GemvArgs& p) { p.x = host + 1; }, "x is not 16-byte aligned"},
      {[](Fp8GemvArgs& p) { p.weight = nullptr; }, "weight is null"},
      {[](Fp8GemvArgs& p) { p.scales = nullptr; }, "scales is null"},
      {[](Fp8GemvArgs& p) { p.split = 3; }, "split 3 is not 0, 1, 2, 4 or 8"},
      {[](Fp8GemvArgs& p) { p.unroll = 6; }, "unroll 6 with 2 rows"},
      {[](Fp8GemvArgs& p) {
         p.rows = 3;
         p.unroll = 8;
       },
       "unroll 8 with 3 rows"},
      // The tensor-core form (xq; `quantized` below sets it up).
      {[](Fp8GemvArgs& p) { p.x = p.xq; }, "both x and xq given"},
      {[](Fp8GemvArgs& p) { p.x_scales = nullptr; }, "x_scales is null"},
      {[](Fp8GemvArgs& p) { p.x_stride = 1; }, "x_stride 1 is below rows 2"},
      {[](Fp8GemvArgs& p) {
         p.x_stride = 12;
         p.rows = 9;
       },
       "9 rows, more than 8 with xq"},
      {[](Fp8GemvArgs& p) { p.xq = host + 8; }, "xq is not 16-byte aligned"},
      // Block-scaled activations come in groups of 128.
      {[](Fp8GemvArgs& p) { p.in = 144; }, "in 144 x out 4: both positive, in a multiple of 128"},
  };
  const auto quantized = [&] {
    Fp8GemvArgs p = gemv();
    std::swap(p.x, p.xq);
    p.x_scales = reinterpret_cast<const float*>(host);
    p.x_stride = 4;
    p.in = 128;
    return p;
  };
  ASSERT_TRUE(kernels::check_fp8_gemv(quantized()).ok());
  for (std::size_t i = 0; i < std::size(bad); ++i) {
    const auto& [edit, words] = bad[i];
    Fp8GemvArgs p = i < kWidening ? gemv() : quantized();
    edit(p);
    const Status status = kernels::check_fp8_gemv(p);
    EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << words;
    EXPECT_NE(status.message().find(words), std::string::npos) << status.message();
  }
  Fp8GemvArgs mma = quantized();
  mma.x_stride = 8;
  mma.rows = 8;
  mma.unroll = 8;  // 8 vectors in flight: allowed for any rows of the tensor-core form
  mma.in = 128;
  EXPECT_TRUE(kernels::check_fp8_gemv(mma).ok()) << kernels::check_fp8_gemv(mma).message();
  mma.scales_kind = Fp8Scales::kChannel;
  mma.in = 48;
  EXPECT_TRUE(kernels::check_fp8_gemv(mma).ok()) << kernels::check_fp8_gemv(mma).message();
  Fp8QuantizeArgs q;
  q.element = DType::kFp16;
  q.rows = 3;
  q.stride = 4;
  q.in = 256;
  q.x = host;
  q.out = host;
  q.scales = reinterpret_cast<float*>(host);
  ASSERT_TRUE(kernels::check_fp8_quantize(q).ok());
  q.in = 200;  // block-scaled: whole groups of 128
  EXPECT_NE(
      kernels::check_fp8_quantize(q).message().find("in 200 is not a positive multiple of 128"),
      std::string::npos);
  q.scales_kind = Fp8Scales::kChannel;  // per row: any multiple of 16
  EXPECT_NE(
      kernels::check_fp8_quantize(q).message().find("in 200 is not a positive multiple of 16"),
      std::string::npos);
  q.in = 208;
  EXPECT_TRUE(kernels::check_fp8_quantize(q).ok());
  q.stride = 2;
  EXPECT_NE(kernels::check_fp8_quantize(q).message().find("stride 2 is below rows 3"),
            std::string::npos);
  EXPECT_EQ(fp8_padded_rows(1), 4u);
  EXPECT_EQ(fp8_padded_rows(8), 8u);
  EXPECT_EQ(fp8_padded_rows(17), 20u);
}

#if defined(KVVM_HAS_CUDA_KERNELS)

using testing::DeviceBuffer;
using testing::have_cuda_device;

// A projection's e4m3 weights, their scales in the store's layout and the dequantized values.
struct Weights {
  std::uint32_t out = 0, in = 0;
  Fp8Scales kind = Fp8Scales::kBlock128;
  std::vector<std::uint8_t> codes;  // [out][in]
  std::vector<float> scales;        // block: [ceil(out / 128)][padded row]; channel: [out]
  std::uint32_t scale_row = 0;
  double at(std::uint32_t n, std::uint32_t k) const {
    const double s =
        kind == Fp8Scales::kBlock128 ? scales[(n / 128) * scale_row + k / 128] : scales[n];
    return static_cast<double>(kernels::e4m3_to_float(codes[std::size_t{n} * in + k])) * s;
  }
};

Weights make_weights(std::uint32_t out, std::uint32_t in, Fp8Scales kind, std::mt19937& rng) {
  Weights w;
  w.out = out;
  w.in = in;
  w.kind = kind;
  std::normal_distribution<float> value(0.0f, 100.0f);
  std::uniform_int_distribution<int> exponent(-3, 3);
  w.codes.resize(std::size_t{out} * in);
  for (std::uint8_t& c : w.codes) c = kernels::float_to_e4m3(value(rng));
  if (kind == Fp8Scales::kBlock128) {
    w.scale_row = ((in + 127) / 128 + 3) / 4 * 4;
    w.scales.assign(std::size_t{(out + 127) / 128} * w.scale_row, 0.0f);
    for (std::uint32_t nb = 0; nb < (out + 127) / 128; ++nb) {
      for (std::uint32_t kb = 0; kb < (in + 127) / 128; ++kb) {
        w.scales[nb * w.scale_row + kb] = std::ldexp(1.0f / 512, exponent(rng));
      }
    }
  } else {
    w.scales.resize(out);
    for (float& s : w.scales) s = std::ldexp(1.0f / 512, exponent(rng));
  }
  return w;
}

std::uint16_t to_bits(DType type, float value) {
  return type == DType::kBf16 ? kernels::float_to_bf16(value) : kernels::float_to_half(value);
}
float from_bits(DType type, std::uint16_t bits) {
  return type == DType::kBf16 ? kernels::bf16_to_float(bits) : kernels::half_to_float(bits);
}

std::vector<std::uint16_t> random_activations(DType type, std::size_t count, std::mt19937& rng) {
  std::normal_distribution<float> value(0.0f, 1.0f);
  std::vector<std::uint16_t> x(count);
  for (std::uint16_t& v : x) v = to_bits(type, value(rng));
  return x;
}

template <typename T>
std::vector<T> download(const DeviceBuffer& buffer) {
  const std::vector<std::uint8_t> bytes = buffer.download();
  std::vector<T> out(bytes.size() / sizeof(T));
  std::memcpy(out.data(), bytes.data(), out.size() * sizeof(T));
  return out;
}

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

// The host's quantization, as the kernel's contract says it: scale amax / 448 (1 for zeros),
// codes x / scale rounded to e4m3.
struct Quantized {
  std::vector<std::uint8_t> codes;
  std::vector<float> scales;
};
Quantized quantize_on_host(const std::vector<std::uint16_t>& x, DType type, Fp8Scales kind,
                           std::uint32_t rows, std::uint32_t in, std::uint32_t stride) {
  Quantized q;
  q.codes.assign(std::size_t{stride} * in, 0);
  const std::uint32_t group = kind == Fp8Scales::kBlock128 ? 128 : in;
  const std::uint32_t groups = in / group;
  q.scales.assign(kind == Fp8Scales::kBlock128 ? std::size_t{groups} * stride : stride, 1.0f);
  for (std::uint32_t r = 0; r < rows; ++r) {
    for (std::uint32_t g = 0; g < groups; ++g) {
      float amax = 0;
      for (std::uint32_t k = g * group; k < (g + 1) * group; ++k) {
        amax = std::fmax(amax, std::fabs(from_bits(type, x[std::size_t{r} * in + k])));
      }
      const float scale = amax > 0 ? amax / 448.0f : 1.0f;
      for (std::uint32_t k = g * group; k < (g + 1) * group; ++k) {
        q.codes[std::size_t{r} * in + k] =
            kernels::float_to_e4m3(from_bits(type, x[std::size_t{r} * in + k]) / scale);
      }
      q.scales[kind == Fp8Scales::kBlock128 ? std::size_t{g} * stride + r : r] = scale;
    }
  }
  return q;
}

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

TEST(Fp8KernelChecks, AQuantizedCopyIsRefusedWhereItCannotBeMade) {
  if (!model_kernels_built()) GTEST_SKIP() << "built without the CUDA kernels";
  alignas(16) static std::uint8_t host[256] = {};
  static const std::uint32_t index[2] = {0, 1};
  RmsNormParams p;
  p.element = DType::kBf16;
  p.rows = 2;
  p.hidden = 128;
  p.x = host;
  p.weight = host;
  p.out = host;
  p.quantized.stride = 4;
  p.quantized.out = host;
  p.quantized.scales = reinterpret_cast<float*>(host);
  const std::pair<std::function<void(RmsNormParams&)>, std::string> bad[] = {
      {[](RmsNormParams& q) { q.quantized.scales = nullptr; }, "quantized.scales is null"},
      {[](RmsNormParams& q) { q.quantized.stride = 1; }, "quantized.stride 1 is below rows 2"},
      {[](RmsNormParams& q) { q.hidden = 200; }, "quantized width of 200 is not a multiple of 128"},
      {[](RmsNormParams& q) { q.row_index = index; }, "a quantized copy of gathered rows"},
  };
  for (const auto& [edit, words] : bad) {
    RmsNormParams q = p;
    edit(q);
    const Status status = rmsnorm_cuda(q, nullptr);
    EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << words;
    EXPECT_NE(status.message().find(words), std::string::npos) << status.message();
  }
  SiluMulParams silu;
  silu.element = DType::kFp16;
  silu.rows = 2;
  silu.inter = 200;
  silu.gate_up = host;
  silu.out = host;
  silu.quantized = p.quantized;
  silu.quantized.kind = Fp8Scales::kChannel;
  const Status status = silu_mul_cuda(silu, nullptr);
  EXPECT_NE(status.message().find("silu_mul: a quantized width of 200 is not a multiple of 16"),
            std::string::npos)
      << status.message();
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
