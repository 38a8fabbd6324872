// head_rmsnorm_cuda (model_kernels.h), Qwen3's per-head RMSNorm of q and k before RoPE: every
// q and k head of a fused q|k|v row (and of separate q and k buffers) against a float64
// reference within the element type's two roundings, and against a host emulation of the
// kernel's rounding points to the bit (where float32's own rounding of the scale does not
// decide); v and anything past a token's heads untouched. The refusals are checked in every
// build; the rest is skipped without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kvvm/kernels/attention.h"
#include "kvvm/kernels/model_kernels.h"
#if defined(KVVM_HAS_CUDA_KERNELS)
#include <cuda_runtime.h>

#include "support/cuda_device.h"
#include "support/device_buffer.h"
#endif

namespace kvvm::head_norm_cuda_test {
namespace {

// A call every check accepts: 2 tokens of 4 q and 2 k heads of 64 in a fused row (v after).
HeadRmsNormParams valid_params(void* somewhere) {
  HeadRmsNormParams p;
  p.element = DType::kBf16;
  p.tokens = 2;
  p.q_heads = 4;
  p.kv_heads = 2;
  p.head_dim = 64;
  p.token_stride = (4 + 2 * 2) * 64;
  p.eps = 1e-6f;
  p.x = somewhere;
  p.q_weight = somewhere;
  p.k_weight = somewhere;
  return p;
}

TEST(HeadNormChecks, MalformedCallsAreRefusedNamingTheValue) {
  alignas(16) static std::uint8_t host[64] = {};
  ASSERT_TRUE(check_head_rmsnorm(valid_params(host)).ok());
  struct Bad {
    std::function<void(HeadRmsNormParams&)> edit;
    std::string words;
  };
  const Bad bad[] = {
      {[](HeadRmsNormParams& p) { p.element = DType::kFp32; }, "element type fp32"},
      {[](HeadRmsNormParams& p) { p.head_dim = 0; }, "head dim 0 is not an even number"},
      {[](HeadRmsNormParams& p) { p.head_dim = 63; }, "head dim 63"},
      {[](HeadRmsNormParams& p) { p.head_dim = 258; }, "head dim 258"},
      {[](HeadRmsNormParams& p) { p.q_heads = p.kv_heads = 0; }, "no heads to normalise"},
      {[](HeadRmsNormParams& p) { p.token_stride = 300; },
       "token_stride 300 is below the 384 elements"},
      {[](HeadRmsNormParams& p) { p.x = nullptr; }, "x is null"},
      {[](HeadRmsNormParams& p) { p.q_weight = nullptr; }, "q_weight is null for 4 q heads"},
      {[](HeadRmsNormParams& p) { p.k_weight = nullptr; }, "k_weight is null for 2 kv heads"},
      {[](HeadRmsNormParams& p) { p.eps = -1.0f; }, "eps -1"},
      {[](HeadRmsNormParams& p) { p.eps = std::numeric_limits<float>::quiet_NaN(); },
       "not a finite number"},
      {[](HeadRmsNormParams& p) { p.eps = std::numeric_limits<float>::infinity(); },
       "not a finite number"},
      {[](HeadRmsNormParams& p) {
         p.tokens = 0xffffffffu;
         p.q_heads = p.kv_heads = 4096;
         p.head_dim = 2;
         p.token_stride = 8192 * 2;
       },
       "more rows than one launch covers"},
  };
  for (const Bad& b : bad) {
    HeadRmsNormParams p = valid_params(host);
    b.edit(p);
    const Status refused = check_head_rmsnorm(p);
    EXPECT_EQ(refused.code(), StatusCode::kInvalidArgument) << b.words;
    EXPECT_NE(refused.message().find("head_rmsnorm: "), std::string::npos) << refused.to_string();
    EXPECT_NE(refused.message().find(b.words), std::string::npos) << refused.to_string();
#if defined(KVVM_HAS_CUDA_KERNELS)
    // The launcher refuses the same call the same way, before any CUDA call.
    EXPECT_EQ(head_rmsnorm_cuda(p, nullptr).message(), refused.message());
#endif
  }
  // Without heads to read, no pointer is needed: only the present heads' weight is.
  HeadRmsNormParams q_only = valid_params(host);
  q_only.kv_heads = 0;
  q_only.k_weight = nullptr;
  EXPECT_TRUE(check_head_rmsnorm(q_only).ok());
  HeadRmsNormParams nothing = valid_params(nullptr);
  nothing.tokens = 0;
  EXPECT_TRUE(check_head_rmsnorm(nothing).ok()) << "zero tokens read and write nothing";
#if !defined(KVVM_HAS_CUDA_KERNELS)
  EXPECT_EQ(head_rmsnorm_cuda(valid_params(host), nullptr).code(), StatusCode::kUnavailable);
#endif
}

#if defined(KVVM_HAS_CUDA_KERNELS)

using testing::DeviceBuffer;

float value_at(DType element, const std::vector<std::uint8_t>& bytes, std::size_t i) {
  return element_to_float(element, &bytes[i * 2]);
}
float rounded(DType element, float value) {
  std::uint8_t at[2];
  float_to_element(element, value, at);
  return element_to_float(element, at);
}
int mantissa_bits(DType element) { return element == DType::kBf16 ? 7 : 10; }
const double kSubnormalUlp = std::ldexp(1.0, -24);  // fp16's
// One unit in the last place of the element type at `value`'s magnitude.
double ulp(DType element, double value) {
  return std::ldexp(1.0, std::ilogb(std::fabs(value) + 1e-30) - mantissa_bits(element));
}

struct Shape {
  std::uint32_t tokens, q_heads, kv_heads, head_dim;
  std::uint64_t token_stride() const { return std::uint64_t{q_heads + 2 * kv_heads} * head_dim; }
};

class HeadNormCuda : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!testing::have_cuda_device()) GTEST_SKIP() << "no CUDA device";
  }

  // Elements in [-range, range], each row scaled by its own factor so rows of very different
  // sizes are normalised; one q row of zeros (eps keeps it finite).
  std::vector<std::uint8_t> rows(DType element, const Shape& s) {
    std::vector<std::uint8_t> bytes(s.tokens * s.token_stride() * 2);
    std::uniform_real_distribution<float> draw(-1.0f, 1.0f);
    std::uniform_real_distribution<float> size(-6.0f, 6.0f);
    const std::uint32_t heads = s.q_heads + 2 * s.kv_heads;
    for (std::uint32_t t = 0; t < s.tokens; ++t) {
      for (std::uint32_t h = 0; h < heads; ++h) {
        const float factor = std::exp2(size(random_));
        for (std::uint32_t i = 0; i < s.head_dim; ++i) {
          const std::size_t at = t * s.token_stride() + std::size_t{h} * s.head_dim + i;
          const float value = t == 1 && h == 0 ? 0.0f : draw(random_) * factor;
          float_to_element(element, value, &bytes[at * 2]);
        }
      }
    }
    return bytes;
  }
  std::vector<std::uint8_t> weights(DType element, std::uint32_t head_dim) {
    std::vector<std::uint8_t> bytes(head_dim * 2);
    std::uniform_real_distribution<float> draw(0.25f, 2.0f);
    for (std::uint32_t i = 0; i < head_dim; ++i)
      float_to_element(element, draw(random_), &bytes[i * 2]);
    return bytes;
  }

  std::mt19937_64 random_{20261207};
};

void sync_ok() { ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << "a kernel faulted"; }

TEST_F(HeadNormCuda, EveryQAndKHeadOfAFusedRowAndNothingElse) {
  constexpr float kEps = 1e-6f;
  for (const DType element : {DType::kBf16, DType::kFp16}) {
    for (const Shape s : {Shape{5, 4, 2, 64}, Shape{3, 16, 8, 128}, Shape{2, 3, 1, 256},
                          Shape{4, 2, 2, 96}, Shape{1, 1, 1, 2}, Shape{37, 8, 8, 128}}) {
      SCOPED_TRACE(std::string(to_string(element)) + " tokens " + std::to_string(s.tokens) +
                   ", heads " + std::to_string(s.q_heads) + " / " + std::to_string(s.kv_heads) +
                   " of " + std::to_string(s.head_dim));
      const std::vector<std::uint8_t> input = rows(element, s);
      const std::vector<std::uint8_t> q_w = weights(element, s.head_dim);
      const std::vector<std::uint8_t> k_w = weights(element, s.head_dim);
      DeviceBuffer x(input), d_q_w(q_w), d_k_w(k_w);
      HeadRmsNormParams p;
      p.element = element;
      p.tokens = s.tokens;
      p.q_heads = s.q_heads;
      p.kv_heads = s.kv_heads;
      p.head_dim = s.head_dim;
      p.token_stride = s.token_stride();
      p.eps = kEps;
      p.x = x.get();
      p.q_weight = d_q_w.get();
      p.k_weight = d_k_w.get();
      const Status done = head_rmsnorm_cuda(p, nullptr);
      ASSERT_TRUE(done.ok()) << done.to_string();
      sync_ok();
      const std::vector<std::uint8_t> out = x.download();

      std::size_t checked = 0, not_bit_equal = 0;
      for (std::uint32_t t = 0; t < s.tokens; ++t) {
        for (std::uint32_t h = 0; h < s.q_heads + 2 * s.kv_heads; ++h) {
          const std::size_t row = t * s.token_stride() + std::size_t{h} * s.head_dim;
          if (h >= s.q_heads + s.kv_heads) {  // v: the bytes as projected
            ASSERT_EQ(std::memcmp(&out[row * 2], &input[row * 2], s.head_dim * 2), 0)
                << "v head " << h << " of token " << t << " was written";
            continue;
          }
          const std::vector<std::uint8_t>& w = h < s.q_heads ? q_w : k_w;
          double squares = 0;
          float squares_f = 0;
          for (std::uint32_t i = 0; i < s.head_dim; ++i) {
            const double v = value_at(element, input, row + i);
            squares += v * v;
            squares_f += static_cast<float>(v * v);
          }
          const double scale = 1.0 / std::sqrt(squares / s.head_dim + kEps);
          const float scale_f = 1.0f / std::sqrt(squares_f / static_cast<float>(s.head_dim) + kEps);
          for (std::uint32_t i = 0; i < s.head_dim; ++i) {
            const float v = value_at(element, input, row + i);
            const double weight = value_at(element, w, i);
            const double want = weight * v * scale;
            const float got = value_at(element, out, row + i);
            // Two roundings to the element type (the normalised value, then the product):
            // each within half a unit in the last place of its own value, together within two
            // of the result's (fp16's subnormals: their fixed 2^-24 besides).
            ASSERT_LE(std::fabs(got - want), 2 * ulp(element, want) + kSubnormalUlp)
                << "token " << t << " head " << h << " element " << i << ": " << got << " vs "
                << want;
            // The kernel's rounding points, emulated on the host in float32: equal, unless the
            // float32 scale (summed in another order) tips the normalised value's rounding,
            // one unit that the weight (below 2) scales to at most two of the result's.
            const float emulated =
                rounded(element, static_cast<float>(weight) * rounded(element, v * scale_f));
            ASSERT_LE(std::fabs(got - emulated), 2 * ulp(element, emulated) + kSubnormalUlp)
                << "token " << t << " head " << h << " element " << i;
            not_bit_equal += got != emulated;
            ++checked;
          }
        }
      }
      // Only a normalised value within float32's error of a rounding boundary may differ.
      EXPECT_LE(not_bit_equal * 100, checked) << not_bit_equal << " of " << checked;
      std::printf("[ head norm] %s head dim %u: %zu of %zu elements differ from the emulation\n",
                  std::string(to_string(element)).c_str(), s.head_dim, not_bit_equal, checked);
    }
  }
}

// The unfused path's separate q and k buffers, one call each, give the fused call's bits.
TEST_F(HeadNormCuda, SeparateQAndKBuffersGiveTheFusedRowsBits) {
  const DType element = DType::kBf16;
  const Shape s{6, 4, 2, 128};
  const std::vector<std::uint8_t> fused = rows(element, s);
  const std::vector<std::uint8_t> q_w = weights(element, s.head_dim);
  const std::vector<std::uint8_t> k_w = weights(element, s.head_dim);
  const std::size_t q_dim = std::size_t{s.q_heads} * s.head_dim;
  const std::size_t kv_dim = std::size_t{s.kv_heads} * s.head_dim;
  std::vector<std::uint8_t> q(s.tokens * q_dim * 2), k(s.tokens * kv_dim * 2);
  for (std::uint32_t t = 0; t < s.tokens; ++t) {
    std::memcpy(&q[t * q_dim * 2], &fused[t * s.token_stride() * 2], q_dim * 2);
    std::memcpy(&k[t * kv_dim * 2], &fused[(t * s.token_stride() + q_dim) * 2], kv_dim * 2);
  }
  DeviceBuffer d_fused(fused), d_q(q), d_k(k), d_q_w(q_w), d_k_w(k_w);
  HeadRmsNormParams p;
  p.element = element;
  p.tokens = s.tokens;
  p.head_dim = s.head_dim;
  p.eps = 1e-6f;
  p.q_weight = d_q_w.get();
  p.k_weight = d_k_w.get();
  HeadRmsNormParams one = p;
  one.q_heads = s.q_heads;
  one.kv_heads = s.kv_heads;
  one.token_stride = s.token_stride();
  one.x = d_fused.get();
  ASSERT_TRUE(head_rmsnorm_cuda(one, nullptr).ok());
  HeadRmsNormParams q_call = p;
  q_call.q_heads = s.q_heads;
  q_call.token_stride = q_dim;
  q_call.x = d_q.get();
  q_call.k_weight = nullptr;
  ASSERT_TRUE(head_rmsnorm_cuda(q_call, nullptr).ok());
  HeadRmsNormParams k_call = p;
  k_call.kv_heads = s.kv_heads;
  k_call.token_stride = kv_dim;
  k_call.x = d_k.get();
  k_call.q_weight = nullptr;
  ASSERT_TRUE(head_rmsnorm_cuda(k_call, nullptr).ok());
  sync_ok();
  const std::vector<std::uint8_t> got_fused = d_fused.download();
  const std::vector<std::uint8_t> got_q = d_q.download(), got_k = d_k.download();
  for (std::uint32_t t = 0; t < s.tokens; ++t) {
    EXPECT_EQ(std::memcmp(&got_q[t * q_dim * 2], &got_fused[t * s.token_stride() * 2], q_dim * 2),
              0)
        << "q of token " << t;
    EXPECT_EQ(std::memcmp(&got_k[t * kv_dim * 2], &got_fused[(t * s.token_stride() + q_dim) * 2],
                          kv_dim * 2),
              0)
        << "k of token " << t;
  }
  // And zero tokens launch nothing: the buffer keeps its bytes.
  one.tokens = 0;
  ASSERT_TRUE(head_rmsnorm_cuda(one, nullptr).ok());
  sync_ok();
  EXPECT_EQ(d_fused.download(), got_fused);
}

#endif  // KVVM_HAS_CUDA_KERNELS

}  // namespace
}  // namespace kvvm::head_norm_cuda_test
