// The projections launched overlapping the kernel before them (programmatic dependent launch:
// the GEMVs, 16-bit and FP8 in both forms, and the FP8 activations' quantization) read that
// kernel's output, not what its memory held before (support/late_copy_test.h says how); the
// step's other kernels are in overlapped_step_kernels_cuda_test.cc. Skipped without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "kernels/element.h"
#include "kvvm/kernels/fp8_kernels.h"
#include "kvvm/kernels/model_kernels.h"
#if defined(KVVM_HAS_CUDA_KERNELS)
#include <cuda_runtime.h>

#include "support/device_buffer.h"
#include "support/late_copy_test.h"
#endif

namespace kvvm::overlapped_launch_cuda_test {
namespace {

#if defined(KVVM_HAS_CUDA_KERNELS)
using testing::DeviceBuffer;

constexpr std::uint32_t kOut = 4096, kIn = 4096;  // Llama-3-8B's o projection

using OverlappedLaunch = testing::LateCopyTest;
using testing::bytes_of;
using testing::random_bf16;

std::vector<std::uint8_t> random_e4m3(std::size_t count, std::mt19937& rng) {
  std::normal_distribution<float> value(0.0f, 100.0f);
  std::vector<std::uint8_t> out(count);
  for (std::uint8_t& c : out) c = kernels::float_to_e4m3(value(rng));
  return out;
}

// Scales in fp8_gemv_cuda's layouts (block: [ceil(out / 128)][blocks along in, padded to 4]).
std::vector<float> weight_scales(Fp8Scales kind, std::mt19937& rng) {
  std::uniform_int_distribution<int> exponent(-3, 3);
  const std::size_t count = kind == Fp8Scales::kBlock128
                                ? std::size_t{(kOut + 127) / 128} * ((kIn / 128 + 3) / 4 * 4)
                                : kOut;
  std::vector<float> scales(count);
  for (float& s : scales) s = std::ldexp(1.0f / 512, exponent(rng));
  return scales;
}

TEST_F(OverlappedLaunch, TheGemvReadsThePreviousKernelsActivations) {
  const std::vector<std::uint16_t> weights = random_bf16(std::size_t{kOut} * kIn, rng_);
  DeviceBuffer dw(weights);
  for (const std::uint32_t rows : {1u, 2u, 8u}) {
    DeviceBuffer out(std::size_t{rows} * kOut * 2);
    const auto read = [&](const void* x) {
      GemvParams p;
      p.element = DType::kBf16;
      p.rows = rows;
      p.in = kIn;
      p.out = kOut;
      p.x = x;
      p.weight = dw.get();
      p.y = out.get();
      return gemv_cuda(p, stream_);
    };
    expect_reads_the_late_copy(bytes_of(random_bf16(std::size_t{rows} * kIn, rng_)),
                               bytes_of(random_bf16(std::size_t{rows} * kIn, rng_)), out, read,
                               "gemv_cuda, " + std::to_string(rows) + " rows");
  }
}

TEST_F(OverlappedLaunch, TheFp8GemvReadsThePreviousKernelsActivationsInBothForms) {
  const std::vector<std::uint8_t> codes = random_e4m3(std::size_t{kOut} * kIn, rng_);
  DeviceBuffer dw(codes);
  for (const Fp8Scales kind : {Fp8Scales::kBlock128, Fp8Scales::kChannel}) {
    const std::string scaling = kind == Fp8Scales::kBlock128 ? "block" : "channel";
    DeviceBuffer dscales(weight_scales(kind, rng_));
    Fp8GemvArgs base;
    base.element = DType::kBf16;
    base.scales_kind = kind;
    base.in = kIn;
    base.out = kOut;
    base.weight = dw.get();
    base.scales = static_cast<const float*>(dscales.get());
    // The widening form, over the 16-bit activations.
    for (const std::uint32_t rows : {1u, 2u}) {
      DeviceBuffer out(std::size_t{rows} * kOut * 2);
      const auto read = [&](const void* x) {
        Fp8GemvArgs p = base;
        p.rows = rows;
        p.x = x;
        p.y = out.get();
        return fp8_gemv_cuda(p, stream_);
      };
      expect_reads_the_late_copy(
          bytes_of(random_bf16(std::size_t{rows} * kIn, rng_)),
          bytes_of(random_bf16(std::size_t{rows} * kIn, rng_)), out, read,
          "fp8_gemv_cuda " + scaling + ", " + std::to_string(rows) + " rows");
    }
    // The tensor-core form: the quantized rows and their scales, one buffer the copy writes.
    const std::uint32_t stride = kFp8MmaGemvRows;
    const std::size_t code_bytes = std::size_t{stride} * kIn;
    const std::size_t scale_count = kind == Fp8Scales::kBlock128 ? kIn / 128 * stride : stride;
    const auto quantized = [&] {
      std::vector<std::uint8_t> bytes = random_e4m3(code_bytes, rng_);
      std::uniform_int_distribution<int> exponent(-6, 0);
      for (std::size_t i = 0; i < scale_count; ++i) {
        const float scale = std::ldexp(1.0f, exponent(rng_));
        const auto* raw = reinterpret_cast<const std::uint8_t*>(&scale);
        bytes.insert(bytes.end(), raw, raw + sizeof scale);
      }
      bytes.resize((bytes.size() + 15) / 16 * 16, 0);
      return bytes;
    };
    for (const std::uint32_t rows : {2u, 8u}) {
      DeviceBuffer out(std::size_t{rows} * kOut * 2);
      const auto read = [&](const void* input) {
        Fp8GemvArgs p = base;
        p.rows = rows;
        p.xq = input;
        p.x_scales =
            reinterpret_cast<const float*>(static_cast<const std::uint8_t*>(input) + code_bytes);
        p.x_stride = stride;
        p.y = out.get();
        return fp8_gemv_cuda(p, stream_);
      };
      expect_reads_the_late_copy(
          quantized(), quantized(), out, read,
          "fp8_gemv_cuda on the tensor cores " + scaling + ", " + std::to_string(rows) + " rows");
    }
  }
}

TEST_F(OverlappedLaunch, TheActivationQuantizationReadsThePreviousKernelsActivations) {
  for (const Fp8Scales kind : {Fp8Scales::kBlock128, Fp8Scales::kChannel}) {
    for (const std::uint32_t rows : {1u, 8u, 64u}) {
      const std::uint32_t stride = fp8_padded_rows(rows);
      const std::size_t code_bytes = std::size_t{stride} * kIn;
      // The codes, then the scales (block: [in / 128][stride]; channel: [stride]).
      DeviceBuffer out(code_bytes + std::size_t{kIn / 128} * stride * sizeof(float));
      const auto read = [&](const void* x) {
        Fp8QuantizeArgs p;
        p.element = DType::kBf16;
        p.scales_kind = kind;
        p.rows = rows;
        p.in = kIn;
        p.stride = stride;
        p.x = x;
        p.out = out.get();
        p.scales = reinterpret_cast<float*>(static_cast<std::uint8_t*>(out.get()) + code_bytes);
        return fp8_quantize_cuda(p, stream_);
      };
      expect_reads_the_late_copy(bytes_of(random_bf16(std::size_t{rows} * kIn, rng_)),
                                 bytes_of(random_bf16(std::size_t{rows} * kIn, rng_)), out, read,
                                 std::string("fp8_quantize_cuda ") +
                                     (kind == Fp8Scales::kBlock128 ? "block" : "channel") + ", " +
                                     std::to_string(rows) + " rows");
    }
  }
}
#endif  // KVVM_HAS_CUDA_KERNELS

}  // namespace
}  // namespace kvvm::overlapped_launch_cuda_test
