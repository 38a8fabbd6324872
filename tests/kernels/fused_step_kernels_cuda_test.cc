// The decode step's fused kernels against what they replace: gemv_cuda (model_kernels.h)
// against a float64 reference on the projection shapes of the supported models, with a row's
// bits independent of the rows beside it; rope_append_kv_cuda (attention.h) against rope_cuda
// followed by append_kv_cuda, byte for byte, on 16-bit and fp8 caches. Refusals are checked
// everywhere; the rest is skipped without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
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

namespace kvvm::fused_step_kernels_cuda_test {
namespace {

TEST(FusedStepKernelsChecks, MalformedCallsAreRefusedByName) {
  GemvParams gemv;
  gemv.element = DType::kBf16;
  gemv.rows = 1;
  RopeAppendParams fused;
  fused.append.tokens = 1;
#if !defined(KVVM_HAS_CUDA_KERNELS)
  EXPECT_EQ(gemv_cuda(gemv, nullptr).code(), StatusCode::kUnavailable);
  EXPECT_EQ(rope_append_kv_cuda(fused, nullptr).code(), StatusCode::kUnavailable);
#else
  alignas(16) std::uint8_t dummy[64] = {};
  gemv.in = 16;
  gemv.out = 4;
  gemv.x = gemv.weight = dummy;
  gemv.y = dummy;
  gemv.rows = kGemvMaxRows + 1;
  Status refused = gemv_cuda(gemv, nullptr);
  EXPECT_NE(refused.message().find("17 rows"), std::string::npos) << refused.to_string();
  gemv.rows = 2;
  gemv.in = 12;
  refused = gemv_cuda(gemv, nullptr);
  EXPECT_NE(refused.message().find("in 12"), std::string::npos) << refused.to_string();
  gemv.in = 16;
  gemv.weight = dummy + 2;
  refused = gemv_cuda(gemv, nullptr);
  EXPECT_NE(refused.message().find("weight is not 16-byte aligned"), std::string::npos)
      << refused.to_string();
  gemv.weight = nullptr;
  refused = gemv_cuda(gemv, nullptr);
  EXPECT_NE(refused.message().find("weight is null"), std::string::npos) << refused.to_string();
  gemv.weight = dummy;
  gemv.split = 3;
  refused = gemv_cuda(gemv, nullptr);
  EXPECT_NE(refused.message().find("split 3 is not 0, 1, 2, 4 or 8"), std::string::npos)
      << refused.to_string();
  gemv.split = 0;
  gemv.rows = 3;
  gemv.unroll = 8;
  refused = gemv_cuda(gemv, nullptr);
  EXPECT_NE(refused.message().find("unroll 8 with 3 rows"), std::string::npos)
      << refused.to_string();
  gemv.unroll = 0;
  gemv.weight = nullptr;
  gemv.element = DType::kFp32;
  refused = gemv_cuda(gemv, nullptr);
  EXPECT_NE(refused.message().find("fp32"), std::string::npos) << refused.to_string();

  fused.append.k = dummy;  // k comes from qkv
  refused = rope_append_kv_cuda(fused, nullptr);
  EXPECT_NE(refused.message().find("append.k"), std::string::npos) << refused.to_string();
#endif
}

#if defined(KVVM_HAS_CUDA_KERNELS)

using testing::DeviceBuffer;

float to_float(DType element, const std::uint8_t* at) { return element_to_float(element, at); }

std::vector<std::uint8_t> random_elements(DType element, std::size_t count, std::mt19937_64& random,
                                          float low, float high) {
  std::vector<std::uint8_t> bytes(count * 2);
  std::uniform_real_distribution<float> draw(low, high);
  for (std::size_t i = 0; i < count; ++i) float_to_element(element, draw(random), &bytes[i * 2]);
  return bytes;
}

void sync_ok() { ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << "a kernel faulted"; }

class FusedStepKernelsCuda : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!testing::have_cuda_device()) GTEST_SKIP() << "no CUDA device";
  }
  std::mt19937_64 random_{20261202};
};

struct GemvShape {
  const char* what;
  std::uint32_t in, out;
};
// Qwen2.5-0.5B's and Llama-3-8B's projections (q|k|v fused, o, gate|up, down), and shapes that
// are not multiples of a warp's stretch or of a block's outputs.
constexpr GemvShape kShapes[] = {
    {"0.5B qkv", 896, 1152},  {"0.5B o", 896, 896},   {"0.5B gate_up", 896, 9728},
    {"0.5B down", 4864, 896}, {"8B qkv", 4096, 6144}, {"8B down", 14336, 4096},
    {"odd", 904, 37},         {"tiny", 8, 3},
};

// y = x . W^T (+ beta y0) by gemv_cuda; returns y's bytes.
std::vector<std::uint8_t> run_gemv(DType element, bool y_float, float beta, std::uint32_t rows,
                                   const GemvShape& shape, const DeviceBuffer& x,
                                   const DeviceBuffer& w, const std::vector<std::uint8_t>& y0,
                                   const DeviceBuffer* bias = nullptr) {
  DeviceBuffer y(y0);
  GemvParams p;
  p.element = element;
  p.rows = rows;
  p.in = shape.in;
  p.out = shape.out;
  p.beta = beta;
  p.bias = bias != nullptr ? bias->get() : nullptr;
  p.y_float = y_float;
  p.x = x.get();
  p.weight = w.get();
  p.y = y.get();
  const Status done = gemv_cuda(p, nullptr);
  EXPECT_TRUE(done.ok()) << done.to_string();
  sync_ok();
  return y.download();
}

TEST_F(FusedStepKernelsCuda, GemvMatchesAFloat64ReferenceOnEveryModelShape) {
  for (const DType element : {DType::kBf16, DType::kFp16}) {
    for (const GemvShape& shape : kShapes) {
      if (element == DType::kFp16 && shape.in * std::uint64_t{shape.out} > 10'000'000) continue;
      const std::uint32_t rows = kGemvMaxRows;
      const auto x = random_elements(element, std::size_t{rows} * shape.in, random_, -1, 1);
      const auto w = random_elements(element, std::size_t{shape.out} * shape.in, random_, -1, 1);
      const auto bias = random_elements(element, std::size_t{rows} * shape.out, random_, -1, 1);
      // The per-output bias of the bias form: the first row of `bias`.
      DeviceBuffer d_x(x), d_w(w),
          d_bias(std::vector<std::uint8_t>(bias.begin(), bias.begin() + shape.out * 2));
      // The float64 products' sum and sum of magnitudes of every (row, output), once.
      std::vector<double> xf(std::size_t{rows} * shape.in), wf(std::size_t{shape.out} * shape.in);
      for (std::size_t i = 0; i < xf.size(); ++i) xf[i] = to_float(element, &x[i * 2]);
      for (std::size_t i = 0; i < wf.size(); ++i) wf[i] = to_float(element, &w[i * 2]);
      std::vector<double> sums(std::size_t{rows} * shape.out), magnitudes(sums.size());
      for (std::uint32_t r = 0; r < rows; ++r) {
        for (std::uint32_t n = 0; n < shape.out; ++n) {
          double sum = 0, magnitude = 0;
          const double* xr = &xf[std::size_t{r} * shape.in];
          const double* wn = &wf[std::size_t{n} * shape.in];
          for (std::uint32_t k = 0; k < shape.in; ++k) {
            sum += xr[k] * wn[k];
            magnitude += std::fabs(xr[k] * wn[k]);
          }
          sums[std::size_t{r} * shape.out + n] = sum;
          magnitudes[std::size_t{r} * shape.out + n] = magnitude;
        }
      }
      for (const std::uint32_t used : {1u, 3u, 8u, 16u}) {
        for (const bool y_float : {false, true}) {
          // The two ways of adding a bias, each on one batch size: beta = 1 over y as
          // broadcast rows, and the kernel's own bias.
          const float beta = used == 3 ? 1.0f : 0.0f;
          const bool with_bias = used == 8;
          SCOPED_TRACE(std::string(to_string(element)) + " " + shape.what + " rows " +
                       std::to_string(used) + (y_float ? " float32 out" : " element out") +
                       " beta " + std::to_string(beta) + (with_bias ? " bias" : ""));
          const std::size_t out_size = y_float ? 4 : 2;
          std::vector<std::uint8_t> y0(std::size_t{rows} * shape.out * out_size);
          for (std::size_t i = 0; i < std::size_t{rows} * shape.out; ++i) {
            const float b = to_float(element, &bias[i * 2]);
            if (y_float) {
              std::memcpy(&y0[i * 4], &b, 4);
            } else {
              std::memcpy(&y0[i * 2], &bias[i * 2], 2);
            }
          }
          const auto y = run_gemv(element, y_float, beta, used, shape, d_x, d_w, y0,
                                  with_bias ? &d_bias : nullptr);
          std::size_t bad = 0;
          std::string first;
          for (std::uint32_t r = 0; r < used; ++r) {
            for (std::uint32_t n = 0; n < shape.out; ++n) {
              const std::size_t at = std::size_t{r} * shape.out + n;
              double sum = sums[at], magnitude = magnitudes[at];
              const double y_in = to_float(element, &bias[at * 2]);
              const double added =
                  with_bias ? double{to_float(element, &bias[n * 2])} : beta * y_in;
              sum += added;
              magnitude += std::fabs(added);
              float got = 0;
              if (y_float) {
                std::memcpy(&got, &y[at * 4], 4);
              } else {
                got = to_float(element, &y[at * 2]);
              }
              // Float32 sums of in / 256 stretches, a butterfly and the warps' partials: well
              // inside (in / 64 + 64) units of 2^-24 of the sum of magnitudes; the element type
              // adds its rounding (at most one ulp of the result).
              double tolerance = (shape.in / 64.0 + 64.0) * std::ldexp(magnitude, -24);
              if (!y_float) {
                const int mantissa = element == DType::kBf16 ? 7 : 10;
                tolerance += std::ldexp(1.0, std::ilogb(std::fabs(sum) + 1e-30) - mantissa);
              }
              if (!(std::fabs(got - sum) <= tolerance)) {
                if (bad++ < 4) {
                  first += " [" + std::to_string(r) + "][" + std::to_string(n) + "] got " +
                           std::to_string(got) + " want " + std::to_string(sum) + ";";
                }
              }
            }
          }
          EXPECT_EQ(bad, 0u) << first;
          // Rows past `used` are not written.
          for (std::size_t i = std::size_t{used} * shape.out * out_size; i < y.size(); ++i) {
            if (y[i] != y0[i]) {
              ADD_FAILURE() << "byte " << i << " past the rows was written";
              break;
            }
          }
        }
      }
    }
  }
}

TEST_F(FusedStepKernelsCuda, GemvGivesARowTheSameBitsWhateverRowsAreBesideIt) {
  const DType element = DType::kBf16;
  for (const GemvShape& shape : {kShapes[0], kShapes[3], kShapes[6]}) {
    SCOPED_TRACE(shape.what);
    const std::uint32_t rows = kGemvMaxRows;
    const auto x = random_elements(element, std::size_t{rows} * shape.in, random_, -2, 2);
    const auto w = random_elements(element, std::size_t{shape.out} * shape.in, random_, -1, 1);
    DeviceBuffer d_x(x), d_w(w);
    const std::vector<std::uint8_t> y0(std::size_t{rows} * shape.out * 2, 0);
    const auto all = run_gemv(element, false, 0, rows, shape, d_x, d_w, y0);
    for (std::uint32_t used = 1; used < rows; ++used) {
      const auto some = run_gemv(element, false, 0, used, shape, d_x, d_w, y0);
      EXPECT_EQ(std::memcmp(some.data(), all.data(), std::size_t{used} * shape.out * 2), 0)
          << "rows 0.." << used - 1 << " alone differ from the same rows among " << rows;
    }
  }
}

// Every forced split (warps per output) and unroll (loads in flight per lane) computes the same
// function, float32 out against float64: shapes whose rows end inside a lane's round of loads
// and whose outputs end inside a block, and rows as long as Llama-3-8B's down projection's.
TEST_F(FusedStepKernelsCuda, GemvMatchesAFloat64ReferenceWithEverySplitAndUnroll) {
  const DType element = DType::kBf16;
  for (const GemvShape& shape : {kShapes[6], kShapes[3], GemvShape{"long rows", 14336, 256}}) {
    const auto x = random_elements(element, std::size_t{2} * shape.in, random_, -1, 1);
    const auto w = random_elements(element, std::size_t{shape.out} * shape.in, random_, -1, 1);
    DeviceBuffer d_x(x), d_w(w);
    std::vector<double> want(std::size_t{2} * shape.out), magnitude(want.size());
    for (std::uint32_t r = 0; r < 2; ++r) {
      for (std::uint32_t n = 0; n < shape.out; ++n) {
        for (std::uint32_t k = 0; k < shape.in; ++k) {
          const double term = double{to_float(element, &x[(std::size_t{r} * shape.in + k) * 2])} *
                              to_float(element, &w[(std::size_t{n} * shape.in + k) * 2]);
          want[std::size_t{r} * shape.out + n] += term;
          magnitude[std::size_t{r} * shape.out + n] += std::fabs(term);
        }
      }
    }
    for (const std::uint32_t rows : {1u, 2u}) {
      for (const std::uint32_t split : {1u, 2u, 4u, 8u}) {
        for (const std::uint32_t unroll : {4u, 8u}) {
          DeviceBuffer y(std::size_t{2} * shape.out * 4);
          y.poison();
          GemvParams p;
          p.element = element;
          p.rows = rows;
          p.in = shape.in;
          p.out = shape.out;
          p.y_float = true;
          p.x = d_x.get();
          p.weight = d_w.get();
          p.y = y.get();
          p.split = split;
          p.unroll = unroll;
          const Status done = gemv_cuda(p, nullptr);
          ASSERT_TRUE(done.ok()) << done.to_string();
          sync_ok();
          const std::vector<std::uint8_t> got = y.download();
          std::size_t bad = 0;
          for (std::size_t i = 0; i < std::size_t{rows} * shape.out; ++i) {
            float value = 0;
            std::memcpy(&value, &got[i * 4], 4);
            if (!(std::fabs(value - want[i]) <=
                  (shape.in / 64.0 + 64.0) * std::ldexp(magnitude[i], -24))) {
              ++bad;
            }
          }
          EXPECT_EQ(bad, 0u) << shape.what << " rows " << rows << " split " << split << " unroll "
                             << unroll;
        }
      }
    }
  }
}

// A cache of `slots` slots x 2 layers x K/V x kv_heads x kMaxTokens tokens x head_dim.
constexpr std::uint32_t kMaxTokens = 1024;
constexpr std::uint32_t kLayers = 2;

KvView cache_view(DType element, std::uint32_t kv_heads, std::uint32_t head_dim,
                  std::uint64_t base) {
  KvView view;
  view.element = element;
  view.element_bytes = element_bytes(element);
  view.head_dim = head_dim;
  view.token_stride = std::uint64_t{head_dim} * view.element_bytes;
  view.head_stride = view.token_stride * kMaxTokens;
  view.kv_stride = view.head_stride * kv_heads;
  view.layer_stride = view.kv_stride * 2;
  view.slot_stride = view.layer_stride * kLayers;
  view.base = base;
  return view;
}

TEST_F(FusedStepKernelsCuda, RopeAppendStoresWhatRopeThenAppendStoreByteForByte) {
  constexpr std::uint32_t kQoHeads = 8, kKvHeads = 2, kTokens = 7, kSlots = 3;
  const std::vector<std::uint32_t> slots = {0, 1, 0, 2, 1, 2, 0};
  const std::vector<std::uint32_t> positions = {5, 0, 6, 3, 900, 1023, 7};
  for (const DType activations : {DType::kBf16, DType::kFp16}) {
    for (const bool fp8 : {false, true}) {
      for (const std::uint32_t head_dim : {64u, 128u}) {
        SCOPED_TRACE(std::string(to_string(activations)) + (fp8 ? " fp8 cache" : " 16-bit cache") +
                     " head dim " + std::to_string(head_dim));
        const DType cache_type = fp8 ? DType::kFp8 : activations;
        const std::uint32_t q_dim = kQoHeads * head_dim, kv_dim = kKvHeads * head_dim;
        const std::uint32_t width = q_dim + 2 * kv_dim;
        const auto qkv = random_elements(activations, std::size_t{kTokens} * width, random_, -4, 4);
        // The unfused path's inputs: q, k, v split out of each row.
        std::vector<std::uint8_t> q(std::size_t{kTokens} * q_dim * 2),
            k(std::size_t{kTokens} * kv_dim * 2), v(std::size_t{kTokens} * kv_dim * 2);
        for (std::uint32_t t = 0; t < kTokens; ++t) {
          const std::uint8_t* row = &qkv[std::size_t{t} * width * 2];
          std::memcpy(&q[std::size_t{t} * q_dim * 2], row, q_dim * 2);
          std::memcpy(&k[std::size_t{t} * kv_dim * 2], row + q_dim * 2, kv_dim * 2);
          std::memcpy(&v[std::size_t{t} * kv_dim * 2], row + (q_dim + kv_dim) * 2, kv_dim * 2);
        }
        std::vector<float> inv_freq(head_dim / 2);
        for (std::uint32_t i = 0; i < head_dim / 2; ++i) {
          inv_freq[i] = static_cast<float>(1.0 / std::pow(500000.0, 2.0 * i / head_dim));
        }
        const std::vector<float> scales = {0.021f, 0.0093f, 0.017f, 0.0121f};  // K h0, h1; V
        DeviceBuffer d_qkv(qkv), d_q(q), d_k(k), d_v(v), d_slots(slots), d_positions(positions),
            d_inv_freq(inv_freq), d_scales(scales);
        const std::size_t cache_bytes =
            std::size_t{kSlots} * cache_view(cache_type, kKvHeads, head_dim, 0).slot_stride;
        DeviceBuffer unfused_cache(cache_bytes), fused_cache(cache_bytes);
        for (DeviceBuffer* cache : {&unfused_cache, &fused_cache}) {
          ASSERT_EQ(cudaMemset(cache->get(), 0x5a, cache_bytes), cudaSuccess);
        }
        DeviceBuffer fused_q(q.size()), k_out(k.size()), v_out(v.size());
        fused_q.poison();
        k_out.poison();
        v_out.poison();

        AppendParams append;
        append.activations = activations;
        if (fp8) {
          const auto* device_scales = static_cast<const float*>(d_scales.get());
          append.head_scales = {device_scales, device_scales + kKvHeads};
        }
        append.layer = 1;
        append.kv_heads = kKvHeads;
        append.tokens = kTokens;
        append.row_slots = static_cast<const std::uint32_t*>(d_slots.get());
        append.row_positions = static_cast<const std::uint32_t*>(d_positions.get());

        RopeParams rope;
        rope.element = activations;
        rope.tokens = kTokens;
        rope.q_heads = kQoHeads;
        rope.k_heads = kKvHeads;
        rope.head_dim = head_dim;
        rope.q = d_q.get();
        rope.k = d_k.get();
        rope.positions = append.row_positions;
        rope.inv_freq = static_cast<const float*>(d_inv_freq.get());
        ASSERT_TRUE(rope_cuda(rope, nullptr).ok());
        AppendParams plain = append;
        plain.view = cache_view(cache_type, kKvHeads, head_dim,
                                reinterpret_cast<std::uint64_t>(unfused_cache.get()));
        plain.k = d_k.get();
        plain.v = d_v.get();
        Status done = append_kv_cuda(plain, nullptr);
        ASSERT_TRUE(done.ok()) << done.to_string();

        // First as a calibrating step would: q, k_out, v_out only, the cache untouched.
        RopeAppendParams fused;
        fused.append = append;
        fused.append.view = cache_view(cache_type, kKvHeads, head_dim,
                                       reinterpret_cast<std::uint64_t>(fused_cache.get()));
        fused.qo_heads = kQoHeads;
        fused.qkv = d_qkv.get();
        fused.q_out = fused_q.get();
        fused.inv_freq = rope.inv_freq;
        fused.k_out = k_out.get();
        fused.v_out = v_out.get();
        fused.cache = false;
        done = rope_append_kv_cuda(fused, nullptr);
        ASSERT_TRUE(done.ok()) << done.to_string();
        sync_ok();
        const auto untouched = fused_cache.download();
        EXPECT_EQ(std::count(untouched.begin(), untouched.end(), std::uint8_t{0x5a}),
                  static_cast<std::ptrdiff_t>(cache_bytes))
            << "cache false wrote to the cache";
        EXPECT_EQ(k_out.download(), d_k.download()) << "k_out is not rope's k";
        EXPECT_EQ(v_out.download(), d_v.download()) << "v_out is not v";
        EXPECT_EQ(fused_q.download(), d_q.download()) << "q_out is not rope's q";

        // Then as every other step: into the cache.
        fused.k_out = fused.v_out = nullptr;
        fused.cache = true;
        fused_q.poison();
        done = rope_append_kv_cuda(fused, nullptr);
        ASSERT_TRUE(done.ok()) << done.to_string();
        sync_ok();
        EXPECT_EQ(fused_q.download(), d_q.download()) << "q_out is not rope's q";
        const auto want = unfused_cache.download(), got = fused_cache.download();
        std::size_t differ = 0, first = 0;
        for (std::size_t i = 0; i < want.size(); ++i) {
          if (want[i] != got[i] && differ++ == 0) first = i;
        }
        EXPECT_EQ(differ, 0u) << differ << " cache bytes differ, the first at " << first;
        // And the append wrote something: each token's K row is no longer the fill.
        EXPECT_LE(std::count(got.begin(), got.end(), std::uint8_t{0x5a}),
                  static_cast<std::ptrdiff_t>(cache_bytes - kTokens * kv_dim));
      }
    }
  }
}

#endif  // KVVM_HAS_CUDA_KERNELS

}  // namespace
}  // namespace kvvm::fused_step_kernels_cuda_test
