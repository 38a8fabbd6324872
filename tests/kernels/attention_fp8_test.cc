// The fp8 (e4m3) KV element: the host conversion against a float64 definition (every code,
// every rounding boundary, saturation, signed zero, subnormals, a sweep over the float
// range), the CPU append's quantization byte for byte, the checks that refuse a malformed
// fp8 call, and (with a GPU) the CUDA append quantizing every bf16 and fp16 value exactly as
// the host does. The attention kernels over an fp8 cache are in the attention suites' Fp8
// instantiations.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "kvvm/kernels/attention.h"
#include "kvvm/vmm/host_driver.h"
#include "support/attention_support.h"
#if defined(KVVM_HAS_CUDA_KERNELS)
#include <cuda_runtime.h>

#include "kvvm/vmm/cuda_driver.h"
#include "support/device_buffer.h"
#endif

namespace kvvm::attention_fp8_test {
namespace {

// The float64 definition of e4m3 ("fn"): codes 0x7f / 0xff are NaN; exponent 0 is
// subnormal (m x 2^-9); otherwise (1 + m / 8) x 2^(e - 7).
double e4m3_value(std::uint8_t code) {
  const int exponent = (code >> 3) & 0xf, mantissa = code & 7;
  if (exponent == 15 && mantissa == 7) return std::numeric_limits<double>::quiet_NaN();
  const double magnitude =
      exponent == 0 ? std::ldexp(mantissa, -9) : std::ldexp(1.0 + mantissa / 8.0, exponent - 7);
  return (code & 0x80) != 0 ? -magnitude : magnitude;
}

std::uint8_t encode(float value) {
  std::uint8_t code = 0;
  float_to_element(DType::kFp8, value, &code);
  return code;
}

float decode(std::uint8_t code) { return element_to_float(DType::kFp8, &code); }

// The code nearest to `value` by the definition: ties to the even code, beyond 448 (and
// infinity) the largest finite code of the sign, NaN a NaN code.
std::uint8_t nearest_code(double value) {
  if (std::isnan(value)) return 0x7f;
  const std::uint8_t sign = std::signbit(value) ? 0x80 : 0x00;
  const double magnitude = std::fabs(value);
  std::uint8_t best = 0;
  for (std::uint8_t code = 1; code <= 0x7e; ++code) {
    const double here = std::fabs(e4m3_value(code) - magnitude);
    const double there = std::fabs(e4m3_value(best) - magnitude);
    if (here < there || (here == there && code % 2 == 0)) best = code;
  }
  return static_cast<std::uint8_t>(sign | best);
}

TEST(Fp8Element, EveryCodeDecodesByTheDefinitionAndRoundTrips) {
  for (int code = 0; code < 256; ++code) {
    const auto c = static_cast<std::uint8_t>(code);
    const double want = e4m3_value(c);
    const float got = decode(c);
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got)) << "code " << code;
      continue;
    }
    EXPECT_EQ(static_cast<double>(got), want) << "code " << code;
    EXPECT_EQ(std::signbit(got), (c & 0x80) != 0) << "code " << code;
    EXPECT_EQ(encode(got), c) << "code " << code << " (" << got << ")";
  }
  EXPECT_EQ(decode(0x7e), 448.0f);
  EXPECT_EQ(decode(0x01), std::ldexp(1.0f, -9));
  EXPECT_EQ(decode(0x08), std::ldexp(1.0f, -6));
}

TEST(Fp8Element, MidpointsRoundToTheEvenCodeAndNeighboursToTheNearest) {
  for (std::uint8_t low = 0; low < 0x7e; ++low) {
    const std::uint8_t high = low + 1;
    // The midpoint of two neighbours has 4 significant bits: exact in float.
    const auto middle = static_cast<float>((e4m3_value(low) + e4m3_value(high)) / 2);
    for (const float sign : {1.0f, -1.0f}) {
      const std::uint8_t s = sign < 0 ? 0x80 : 0x00;
      EXPECT_EQ(encode(sign * middle), s | (low % 2 == 0 ? low : high)) << "midpoint " << middle;
      EXPECT_EQ(encode(sign * std::nextafter(middle, 0.0f)), s | low) << "below " << middle;
      EXPECT_EQ(encode(sign * std::nextafter(middle, 1e9f)), s | high) << "above " << middle;
    }
  }
}

TEST(Fp8Element, SaturatesSignedZerosAndSubnormals) {
  const float infinity = std::numeric_limits<float>::infinity();
  for (const float big : {448.0f, 449.0f, 463.99f, 464.0f, 480.0f, 1e30f, infinity}) {
    EXPECT_EQ(encode(big), 0x7e) << big;
    EXPECT_EQ(encode(-big), 0xfe) << -big;
  }
  EXPECT_TRUE(std::isnan(decode(encode(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_EQ(encode(0.0f), 0x00);
  EXPECT_EQ(encode(-0.0f), 0x80);
  EXPECT_EQ(encode(1e-10f), 0x00);
  EXPECT_EQ(encode(-1e-10f), 0x80);                      // rounds to zero, keeps its sign
  EXPECT_EQ(encode(std::ldexp(1.0f, -10)), 0x00);        // half of the smallest: even (0)
  EXPECT_EQ(encode(3 * std::ldexp(1.0f, -10)), 0x02);    // between 1 and 2: even (2)
  EXPECT_EQ(encode(7.5f * std::ldexp(1.0f, -9)), 0x08);  // subnormal 7 and 2^-6: even (8)
}

TEST(Fp8Element, EveryFloatOfASweepGetsTheNearestCode) {
  // About a million floats spread over every sign, exponent and mantissa (the step is odd,
  // so every low bit pattern is visited too).
  std::uint64_t compared = 0;
  for (std::uint64_t bits = 0; bits < (std::uint64_t{1} << 32); bits += 4099) {
    const auto pattern = static_cast<std::uint32_t>(bits);
    float value;
    std::memcpy(&value, &pattern, 4);
    const std::uint8_t got = encode(value);
    const std::uint8_t want = nearest_code(value);
    if (std::isnan(value)) {
      EXPECT_TRUE(std::isnan(decode(got))) << "bits " << pattern;
    } else {
      ASSERT_EQ(got, want) << "bits 0x" << std::hex << pattern << " (" << value << ")";
    }
    ++compared;
  }
  EXPECT_GT(compared, 1000000u);
}

// A one-layer, one-head fp8 cache on the host driver.
struct Fp8Cache {
  std::unique_ptr<Driver> driver;
  std::unique_ptr<testing::KvArena> kv;
  std::uint32_t slot = 0;

  static Fp8Cache make(std::unique_ptr<Driver> driver, std::uint32_t head_dim,
                       std::uint32_t tokens) {
    Fp8Cache cache;
    cache.driver = std::move(driver);
    cache.kv = testing::KvArena::make(*cache.driver, Geometry{"fp8", 1, 1, head_dim, DType::kFp8},
                                      Layout::kTokenMajor, tokens, 1);
    EXPECT_TRUE(cache.kv);
    if (!cache.kv) return cache;
    auto slot = cache.kv->arena->admit(tokens);
    EXPECT_TRUE(slot.ok()) << slot.status().to_string();
    cache.slot = slot.ok() ? *slot : 0;
    return cache;
  }
};

TEST(Fp8Append, StoresEachValueOverItsScaleRoundedToTheNearestCode) {
  auto driver = make_host_driver();
  ASSERT_TRUE(driver.ok());
  constexpr std::uint32_t kDim = 64, kTokens = 40;
  Fp8Cache cache = Fp8Cache::make(std::move(driver).value(), kDim, kTokens);
  ASSERT_TRUE(cache.kv);
  // Values over the whole range and past it, both signs; K and V differ.
  std::vector<float> k(kTokens * kDim), v(kTokens * kDim);
  for (std::size_t i = 0; i < k.size(); ++i) {
    k[i] = static_cast<float>(std::ldexp(1.0, static_cast<int>(i % 26) - 12) *
                              (i % 3 == 0 ? -1.3 : 0.7));
    v[i] = -k[i] * 0.5f;
  }
  for (const DType activations : {DType::kFp32, DType::kBf16}) {
    std::vector<std::uint8_t> k_in(k.size() * element_bytes(activations)), v_in(k_in.size());
    for (std::size_t i = 0; i < k.size(); ++i) {
      float_to_element(activations, k[i], &k_in[i * element_bytes(activations)]);
      float_to_element(activations, v[i], &v_in[i * element_bytes(activations)]);
    }
    AppendParams append = {};
    append.view = cache.kv->arena->view();
    append.activations = activations;
    append.k_scale = 0.0123f;
    append.v_scale = 3.7f;
    append.kv_heads = 1;
    append.tokens = kTokens;
    append.k = k_in.data();
    append.v = v_in.data();
    append.slot = cache.slot;
    ASSERT_TRUE(append_kv_cpu(append).ok());
    for (std::uint32_t t = 0; t < kTokens; ++t) {
      for (std::uint32_t kv = 0; kv < 2; ++kv) {
        const auto* stored =
            reinterpret_cast<const std::uint8_t*>(append.view.address(cache.slot, 0, kv, 0, t));
        const std::vector<std::uint8_t>& in = kv == 0 ? k_in : v_in;
        const float scale = kv == 0 ? append.k_scale : append.v_scale;
        for (std::uint32_t d = 0; d < kDim; ++d) {
          const std::size_t i = std::size_t{t} * kDim + d;
          const float value = element_to_float(activations, &in[i * element_bytes(activations)]);
          ASSERT_EQ(stored[d], nearest_code(static_cast<double>(value / scale)))
              << to_string(activations) << " token " << t << " kv " << kv << " dim " << d;
        }
      }
    }
  }
}

TEST(Fp8Checks, MalformedFp8CallsAreRefusedNamingTheValue) {
  auto driver = make_host_driver();
  ASSERT_TRUE(driver.ok());
  Fp8Cache cache = Fp8Cache::make(std::move(driver).value(), 64, 16);
  ASSERT_TRUE(cache.kv);
  std::vector<float> rows(64, 1.0f);
  std::uint32_t length = 1;
  DecodeParams decode;
  decode.view = cache.kv->arena->view();
  decode.qo_heads = decode.kv_heads = decode.batch = 1;
  decode.q = rows.data();
  decode.out = rows.data();
  decode.slots = &cache.slot;
  decode.lengths = &length;
  decode.max_length = 16;
  // An fp8 cache must be told its activations' type.
  Status refused = decode_attention_cpu(decode);
  EXPECT_EQ(refused.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(refused.message().find("fp8 cache needs fp16, bf16 or fp32 activations"),
            std::string::npos)
      << refused.to_string();
  decode.activations = DType::kFp32;
  for (const float bad : {0.0f, -1.0f, std::numeric_limits<float>::quiet_NaN(),
                          std::numeric_limits<float>::infinity()}) {
    decode.v_scale = bad;
    refused = decode_attention_cpu(decode);
    EXPECT_EQ(refused.code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(refused.message().find("v_scale"), std::string::npos) << refused.to_string();
  }
  decode.v_scale = 1.0f;
  EXPECT_TRUE(decode_attention_cpu(decode).ok());
  // A 16-bit cache takes only its own type.
  auto host = make_host_driver();
  ASSERT_TRUE(host.ok());
  auto bf16 = testing::KvArena::make(**host, Geometry{"bf16", 1, 1, 64, DType::kBf16},
                                     Layout::kTokenMajor, 16, 1);
  ASSERT_TRUE(bf16);
  PrefillParams prefill;
  prefill.view = bf16->arena->view();
  prefill.activations = DType::kFp32;
  prefill.qo_heads = prefill.kv_heads = 1;
  refused = prefill_attention_cpu(prefill);
  EXPECT_EQ(refused.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(refused.message().find("activations in fp32 over a bf16 cache"), std::string::npos)
      << refused.to_string();
}

#if defined(KVVM_HAS_CUDA_KERNELS)

// Every bf16 and every fp16 value (all 65,536 bit patterns, NaN and infinities included) through
// the CUDA append at two scales: each stored byte is the host's float_to_e4m3(value / scale).
TEST(Fp8AppendCuda, EveryBf16AndFp16ValueQuantizesAsTheHostDoes) {
  auto driver = make_cuda_driver();
  if (!driver.ok()) GTEST_SKIP() << "no CUDA device: " << driver.status().to_string();
  constexpr std::uint32_t kDim = 128, kTokens = 65536 / kDim;
  Fp8Cache cache = Fp8Cache::make(std::move(driver).value(), kDim, kTokens);
  ASSERT_TRUE(cache.kv);
  std::vector<std::uint16_t> patterns(65536);
  for (std::uint32_t i = 0; i < patterns.size(); ++i) patterns[i] = static_cast<std::uint16_t>(i);
  testing::DeviceBuffer input(patterns);
  for (const DType activations : {DType::kBf16, DType::kFp16}) {
    for (const float scale : {1.0f, 0.0371f}) {
      AppendParams append;
      append.view = cache.kv->arena->view();
      append.activations = activations;
      append.k_scale = scale;
      append.v_scale = scale * 3;
      append.kv_heads = 1;
      append.tokens = kTokens;
      append.k = input.get();
      append.v = input.get();
      append.slot = cache.slot;
      Status appended = append_kv_cuda(append, nullptr);
      ASSERT_TRUE(appended.ok()) << appended.to_string();
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      std::vector<std::uint8_t> row(kDim);
      std::uint64_t mismatches = 0;
      for (std::uint32_t t = 0; t < kTokens; ++t) {
        for (std::uint32_t kv = 0; kv < 2; ++kv) {
          ASSERT_EQ(cudaMemcpy(
                        row.data(),
                        reinterpret_cast<const void*>(append.view.address(cache.slot, 0, kv, 0, t)),
                        kDim, cudaMemcpyDeviceToHost),
                    cudaSuccess);
          const float divisor = kv == 0 ? append.k_scale : append.v_scale;
          for (std::uint32_t d = 0; d < kDim; ++d) {
            const float value = element_to_float(activations, &patterns[t * kDim + d]);
            std::uint8_t want = 0;
            float_to_element(DType::kFp8, value / divisor, &want);
            const bool both_nan = std::isnan(value) && (row[d] & 0x7f) == 0x7f;
            if (row[d] != want && !both_nan) ++mismatches;
          }
        }
      }
      EXPECT_EQ(mismatches, 0u) << to_string(activations) << " at scale " << scale;
    }
  }
}

TEST(Fp8AppendCuda, Fp32ActivationsAreRefusedByName) {
  auto driver = make_cuda_driver();
  if (!driver.ok()) GTEST_SKIP() << "no CUDA device: " << driver.status().to_string();
  Fp8Cache cache = Fp8Cache::make(std::move(driver).value(), 64, 16);
  ASSERT_TRUE(cache.kv);
  testing::DeviceBuffer rows(std::vector<float>(64, 1.0f));
  AppendParams append;
  append.view = cache.kv->arena->view();
  append.activations = DType::kFp32;
  append.kv_heads = 1;
  append.tokens = 1;
  append.k = append.v = rows.get();
  append.slot = cache.slot;
  const Status refused = append_kv_cuda(append, nullptr);
  EXPECT_EQ(refused.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(refused.message().find("activations in fp32"), std::string::npos)
      << refused.to_string();
}

#endif  // KVVM_HAS_CUDA_KERNELS

}  // namespace
}  // namespace kvvm::attention_fp8_test
