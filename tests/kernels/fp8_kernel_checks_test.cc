// The FP8 kernels' argument checks (include/kvvm/kernels/fp8_kernels.h, kernels/fp8_checks.h):
// a malformed GEMV or quantization, and a quantized copy asked of the RMSNorm or the SiLU-mul
// where it cannot be made, refused naming the value. They run in every build.
#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "kernels/fp8/fp8_checks.h"
#include "kvvm/kernels/fp8_kernels.h"
#include "kvvm/kernels/model_kernels.h"

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

}  // namespace
}  // namespace kvvm::fp8_kernels_test
