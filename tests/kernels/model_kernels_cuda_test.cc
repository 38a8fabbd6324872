// The CUDA model kernels (include/kvvm/kernels/model_kernels.h) against host references on fresh
// random data each run, fp16 and bf16, at Qwen2-0.5B's and Llama-8B's widths (896, 4096) and
// sizes that are not multiples of a block. The references compute in float and round to the
// element type at the points the header names, so outputs agree to within a few ulps of the
// element type: the device's cosf / expf / rsqrtf may differ from the host's in the last
// float bit, which now and then flips the rounding of an intermediate by one ulp; a wrong
// formula or rounding order is off by far more. Outputs are poisoned (NaN) before each run. Skipped
// without a GPU; the refusals are checked everywhere.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "kvvm/kernels/attention.h"
#include "kvvm/kernels/model_kernels.h"
#include "support/pattern.h"
#if defined(KVVM_HAS_CUDA_KERNELS)
#include <cuda_runtime.h>

#include "support/cuda_device.h"
#include "support/device_buffer.h"
#endif

namespace kvvm {
namespace {

TEST(ModelKernelsCudaChecks, MalformedCallsAreRefusedBeforeAnyCudaCall) {
#if !defined(KVVM_HAS_CUDA_KERNELS)
  EXPECT_FALSE(model_kernels_built());
  EXPECT_EQ(rmsnorm_cuda(RmsNormParams{}, nullptr).code(), StatusCode::kUnavailable);
#else
  EXPECT_TRUE(model_kernels_built());
  std::uint32_t dummy[4] = {};
  RmsNormParams norm;
  norm.element = DType::kFp32;
  norm.rows = 1;
  norm.hidden = 4;
  norm.x = norm.out = dummy;
  norm.weight = dummy;
  Status refused = rmsnorm_cuda(norm, nullptr);
  EXPECT_EQ(refused.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(refused.message().find("fp32"), std::string::npos) << refused.to_string();
  norm.element = DType::kBf16;
  norm.weight = nullptr;
  refused = rmsnorm_cuda(norm, nullptr);
  EXPECT_NE(refused.message().find("weight is null"), std::string::npos) << refused.to_string();
  norm.rows = 0;  // nothing to do: no launch, no refusal
  EXPECT_TRUE(rmsnorm_cuda(norm, nullptr).ok());

  RopeParams rope;
  rope.element = DType::kFp16;
  rope.tokens = 1;
  rope.q_heads = 1;
  rope.head_dim = 63;
  rope.q = dummy;
  rope.positions = dummy;
  rope.inv_freq = reinterpret_cast<const float*>(dummy);
  refused = rope_cuda(rope, nullptr);
  EXPECT_NE(refused.message().find("head dim 63"), std::string::npos) << refused.to_string();
  SiluMulParams silu;
  silu.element = DType::kBf16;
  silu.rows = 2;
  silu.gate_up = dummy;
  silu.out = dummy;
  refused = silu_mul_cuda(silu, nullptr);
  EXPECT_NE(refused.message().find("inter is 0"), std::string::npos) << refused.to_string();
  ArgmaxParams argmax;
  argmax.rows = 1;
  argmax.vocab = 10;
  refused = argmax_cuda(argmax, nullptr);
  EXPECT_EQ(refused.code(), StatusCode::kInvalidArgument);
  EmbeddingParams embedding;
  embedding.element = DType::kUnset;
  EXPECT_EQ(embedding_cuda(embedding, nullptr).code(), StatusCode::kInvalidArgument);
#endif
}

#if defined(KVVM_HAS_CUDA_KERNELS)

using testing::DeviceBuffer;

// Host values in the element type: 2 bytes each.
struct Elements {
  DType element;
  std::vector<std::uint8_t> bytes;
  Elements(DType e, std::size_t count) : element(e), bytes(count * 2) {}
  float get(std::size_t i) const { return element_to_float(element, &bytes[i * 2]); }
  void set(std::size_t i, float value) { float_to_element(element, value, &bytes[i * 2]); }
  std::size_t size() const { return bytes.size() / 2; }
};

float round_to(DType element, float value) {
  std::uint8_t bytes[2];
  float_to_element(element, value, bytes);
  return element_to_float(element, bytes);
}

// One unit in the last place of the element type at `value`'s magnitude.
float ulp(DType element, float value) {
  const int mantissa = element == DType::kBf16 ? 7 : 10;
  const float magnitude = std::fabs(value);
  const float smallest = element == DType::kBf16 ? 1e-38f : 6.0e-8f;
  if (magnitude < smallest) return smallest;
  return std::ldexp(1.0f, std::ilogb(magnitude) - mantissa);
}

Elements random_elements(DType element, std::size_t count, std::mt19937_64& random, float low,
                         float high) {
  Elements values(element, count);
  std::uniform_real_distribution<float> draw(low, high);
  for (std::size_t i = 0; i < count; ++i) values.set(i, draw(random));
  return values;
}

Elements download(DType element, const DeviceBuffer& buffer, std::size_t count) {
  Elements values(element, count);
  const auto bytes = buffer.download();
  std::memcpy(values.bytes.data(), bytes.data(), count * 2);
  return values;
}

// Fails, naming the first few indices and values, where |got - want| > tolerance(i).
template <typename Tolerance>
void expect_close(const Elements& got, const std::vector<float>& want, Tolerance tolerance,
                  const std::string& what) {
  std::size_t bad = 0;
  std::ostringstream first;
  for (std::size_t i = 0; i < want.size(); ++i) {
    const float value = got.get(i);
    if (!(std::fabs(value - want[i]) <= tolerance(i))) {
      if (bad < 8) {
        first << " [" << i << "] got " << value << " want " << want[i] << " (tolerance "
              << tolerance(i) << ");";
      }
      ++bad;
    }
  }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << want.size() << " differ:" << first.str();
}

void sync_ok() { ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << "a kernel faulted"; }

class ModelKernelsCudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!testing::have_cuda_device()) GTEST_SKIP() << "no CUDA device";
    seed_ = testing::fresh_seed();
    random_.seed(seed_);
    RecordProperty("seed", std::to_string(seed_));
  }
  std::string trace(DType element, std::uint32_t width) const {
    return std::string(to_string(element)) + " width " + std::to_string(width) + " seed " +
           std::to_string(seed_);
  }
  std::uint64_t seed_ = 0;
  std::mt19937_64 random_;
};

constexpr DType kElements[] = {DType::kBf16, DType::kFp16};
// 896, 4,096 and 16,384: the 16-byte vector kernel (16,384 its widest); 13 and 16,392: the loop.
constexpr std::uint32_t kWidths[] = {896, 4096, 13, 16384, 16392};

TEST_F(ModelKernelsCudaTest, EmbeddingGathersRowsAndZeroesIdsOutsideTheTable) {
  for (DType element : kElements) {
    for (std::uint32_t hidden : kWidths) {
      SCOPED_TRACE(trace(element, hidden));
      constexpr std::uint32_t kVocab = 1001, kTokens = 37;
      const Elements table = random_elements(element, std::size_t{kVocab} * hidden, random_, -1, 1);
      std::vector<std::int32_t> ids(kTokens);
      for (auto& id : ids) id = static_cast<std::int32_t>(random_() % kVocab);
      ids[3] = kVocab - 1;
      ids[5] = -1;      // outside: zeros
      ids[6] = kVocab;  // outside: zeros
      DeviceBuffer d_table(table.bytes), d_ids(ids), d_out(std::size_t{kTokens} * hidden * 2);
      d_out.poison();
      EmbeddingParams p;
      p.element = element;
      p.tokens = kTokens;
      p.hidden = hidden;
      p.vocab = kVocab;
      p.ids = static_cast<const std::int32_t*>(d_ids.get());
      p.table = d_table.get();
      p.out = d_out.get();
      Status done = embedding_cuda(p, nullptr);
      ASSERT_TRUE(done.ok()) << done.to_string();
      sync_ok();
      const Elements out = download(element, d_out, std::size_t{kTokens} * hidden);
      std::vector<float> want(out.size());
      for (std::uint32_t t = 0; t < kTokens; ++t) {
        const bool inside = ids[t] >= 0 && ids[t] < static_cast<std::int32_t>(kVocab);
        for (std::uint32_t i = 0; i < hidden; ++i) {
          want[std::size_t{t} * hidden + i] =
              inside ? table.get(static_cast<std::size_t>(ids[t]) * hidden + i) : 0.0f;
        }
      }
      expect_close(
          out, want, [](std::size_t) { return 0.0f; }, "embedding");
    }
  }
}

// x[s] = round(x[s] + add[s]); out[r] = round(w * round(x[s] * rsqrt(mean(x[s]^2) + eps))).
TEST_F(ModelKernelsCudaTest, RmsNormWithAndWithoutTheResidualAddAndARowIndex) {
  constexpr float kEps = 1e-6f;
  for (DType element : kElements) {
    for (std::uint32_t hidden : kWidths) {
      for (int variant = 0; variant < 3; ++variant) {  // plain, add, add + row index
        SCOPED_TRACE(trace(element, hidden) + " variant " + std::to_string(variant));
        constexpr std::uint32_t kRows = 37;
        const bool with_add = variant >= 1, with_index = variant == 2;
        const std::vector<std::uint32_t> index = {36, 0, 17, 5};
        const std::uint32_t out_rows =
            with_index ? static_cast<std::uint32_t>(index.size()) : kRows;
        const std::size_t n = std::size_t{kRows} * hidden;
        const Elements x = random_elements(element, n, random_, -3, 3);
        const Elements add = random_elements(element, n, random_, -3, 3);
        const Elements weight = random_elements(element, hidden, random_, 0.5, 1.5);
        DeviceBuffer d_x(x.bytes), d_add(add.bytes), d_w(weight.bytes), d_index(index),
            d_out(std::size_t{out_rows} * hidden * 2);
        d_out.poison();
        RmsNormParams p;
        p.element = element;
        p.rows = out_rows;
        p.hidden = hidden;
        p.eps = kEps;
        p.x = d_x.get();
        p.add = with_add ? d_add.get() : nullptr;
        p.row_index = with_index ? static_cast<const std::uint32_t*>(d_index.get()) : nullptr;
        p.weight = d_w.get();
        p.out = d_out.get();
        Status done = rmsnorm_cuda(p, nullptr);
        ASSERT_TRUE(done.ok()) << done.to_string();
        sync_ok();
        // Reference: the residual stream after the add, then each output row.
        std::vector<float> want_x(n);
        for (std::size_t i = 0; i < n; ++i) {
          want_x[i] = with_add ? round_to(element, x.get(i) + add.get(i)) : x.get(i);
        }
        std::vector<bool> touched(kRows, !with_index);
        std::vector<float> want(std::size_t{out_rows} * hidden);
        for (std::uint32_t r = 0; r < out_rows; ++r) {
          const std::uint32_t s = with_index ? index[r] : r;
          touched[s] = true;
          double squares = 0;
          for (std::uint32_t i = 0; i < hidden; ++i) {
            const double v = want_x[std::size_t{s} * hidden + i];
            squares += v * v;
          }
          const float scale = static_cast<float>(1.0 / std::sqrt(squares / hidden + kEps));
          for (std::uint32_t i = 0; i < hidden; ++i) {
            const float normed = round_to(element, want_x[std::size_t{s} * hidden + i] * scale);
            want[std::size_t{r} * hidden + i] = round_to(element, weight.get(i) * normed);
          }
        }
        const Elements out = download(element, d_out, want.size());
        expect_close(
            out, want, [&](std::size_t i) { return 3 * ulp(element, want[i]); }, "rmsnorm out");
        // Rows the kernel read had the add written back (exactly); the others are untouched.
        const Elements new_x = download(element, d_x, n);
        for (std::size_t i = 0; i < n; ++i) {
          if (!touched[i / hidden]) want_x[i] = x.get(i);
        }
        expect_close(
            new_x, want_x, [](std::size_t) { return 0.0f; }, "rmsnorm x");
      }
    }
  }
}

TEST_F(ModelKernelsCudaTest, RopeRotatesQAndKAtEachTokensPosition) {
  for (DType element : kElements) {
    for (std::uint32_t dim : {64u, 128u}) {
      SCOPED_TRACE(trace(element, dim));
      constexpr std::uint32_t kTokens = 19, kQHeads = 7, kKHeads = 3;
      std::vector<std::uint32_t> positions(kTokens);
      for (auto& position : positions) position = static_cast<std::uint32_t>(random_() % 40000);
      positions[0] = 0;
      std::vector<float> inv_freq(dim / 2);
      for (std::uint32_t i = 0; i < dim / 2; ++i) {
        inv_freq[i] = 1.0f / std::pow(500000.0f, static_cast<float>(2 * i) / dim);
      }
      const Elements q =
          random_elements(element, std::size_t{kTokens} * kQHeads * dim, random_, -4, 4);
      const Elements k =
          random_elements(element, std::size_t{kTokens} * kKHeads * dim, random_, -4, 4);
      DeviceBuffer d_q(q.bytes), d_k(k.bytes), d_positions(positions), d_inv(inv_freq);
      RopeParams p;
      p.element = element;
      p.tokens = kTokens;
      p.q_heads = kQHeads;
      p.k_heads = kKHeads;
      p.head_dim = dim;
      p.q = d_q.get();
      p.k = d_k.get();
      p.positions = static_cast<const std::uint32_t*>(d_positions.get());
      p.inv_freq = static_cast<const float*>(d_inv.get());
      Status done = rope_cuda(p, nullptr);
      ASSERT_TRUE(done.ok()) << done.to_string();
      sync_ok();
      for (const auto& [input, buffer, heads, name] :
           {std::tuple{&q, &d_q, kQHeads, "q"}, std::tuple{&k, &d_k, kKHeads, "k"}}) {
        std::vector<float> want(input->size()), tolerance(input->size());
        const std::uint32_t half = dim / 2;
        for (std::uint32_t t = 0; t < kTokens; ++t) {
          for (std::uint32_t h = 0; h < heads; ++h) {
            const std::size_t row = (std::size_t{t} * heads + h) * dim;
            for (std::uint32_t i = 0; i < half; ++i) {
              const float angle = static_cast<float>(positions[t]) * inv_freq[i];
              const float c = round_to(element, std::cos(angle));
              const float s = round_to(element, std::sin(angle));
              const float x1 = input->get(row + i), x2 = input->get(row + i + half);
              want[row + i] =
                  round_to(element, round_to(element, x1 * c) + round_to(element, -x2 * s));
              want[row + i + half] =
                  round_to(element, round_to(element, x2 * c) + round_to(element, x1 * s));
              // A last-bit difference in cos / sin moves the result by an ulp of the inputs.
              const float bound = 4 * ulp(element, std::max(std::fabs(x1), std::fabs(x2)));
              tolerance[row + i] = tolerance[row + i + half] = bound;
            }
          }
        }
        const Elements out = download(element, *buffer, input->size());
        expect_close(
            out, want, [&](std::size_t i) { return tolerance[i]; }, name);
      }
    }
  }
}

TEST_F(ModelKernelsCudaTest, SiluMulOfTheGateAndUpHalves) {
  for (DType element : kElements) {
    for (std::uint32_t inter : {4864u, 1001u}) {
      SCOPED_TRACE(trace(element, inter));
      constexpr std::uint32_t kRows = 37;
      const Elements gate_up =
          random_elements(element, std::size_t{kRows} * 2 * inter, random_, -8, 8);
      DeviceBuffer d_in(gate_up.bytes), d_out(std::size_t{kRows} * inter * 2);
      d_out.poison();
      SiluMulParams p;
      p.element = element;
      p.rows = kRows;
      p.inter = inter;
      p.gate_up = d_in.get();
      p.out = d_out.get();
      Status done = silu_mul_cuda(p, nullptr);
      ASSERT_TRUE(done.ok()) << done.to_string();
      sync_ok();
      std::vector<float> want(std::size_t{kRows} * inter);
      for (std::uint32_t r = 0; r < kRows; ++r) {
        for (std::uint32_t i = 0; i < inter; ++i) {
          const float g = gate_up.get(std::size_t{r} * 2 * inter + i);
          const float u = gate_up.get(std::size_t{r} * 2 * inter + inter + i);
          const float act = round_to(element, g / (1.0f + std::exp(-g)));
          want[std::size_t{r} * inter + i] = round_to(element, act * u);
        }
      }
      const Elements out = download(element, d_out, want.size());
      expect_close(
          out, want, [&](std::size_t i) { return 3 * ulp(element, want[i]); }, "silu_mul");
    }
  }
}

TEST_F(ModelKernelsCudaTest, BroadcastRowsCopiesTheRowUnderEveryRow) {
  for (DType element : kElements) {
    for (std::uint32_t cols : kWidths) {
      SCOPED_TRACE(trace(element, cols));
      constexpr std::uint32_t kRows = 37;
      const Elements row = random_elements(element, cols, random_, -1, 1);
      DeviceBuffer d_row(row.bytes), d_out(std::size_t{kRows} * cols * 2);
      d_out.poison();
      BroadcastRowsParams p;
      p.element = element;
      p.rows = kRows;
      p.cols = cols;
      p.row = d_row.get();
      p.out = d_out.get();
      Status done = broadcast_rows_cuda(p, nullptr);
      ASSERT_TRUE(done.ok()) << done.to_string();
      sync_ok();
      std::vector<float> want(std::size_t{kRows} * cols);
      for (std::size_t i = 0; i < want.size(); ++i) want[i] = row.get(i % cols);
      expect_close(
          download(element, d_out, want.size()), want, [](std::size_t) { return 0.0f; },
          "broadcast");
    }
  }
}

TEST_F(ModelKernelsCudaTest, ArgmaxTakesTheLowestIndexAmongEqualsAndSkipsNaN) {
  for (std::uint32_t vocab : {151936u, 128256u, 4097u, 1001u, 7u}) {
    SCOPED_TRACE("vocab " + std::to_string(vocab) + " seed " + std::to_string(seed_));
    constexpr std::uint32_t kRows = 6;
    std::vector<float> logits(std::size_t{kRows} * vocab);
    std::uniform_real_distribution<float> draw(-30, 30);
    for (float& value : logits) value = draw(random_);
    auto row = [&](std::uint32_t r) { return &logits[std::size_t{r} * vocab]; };
    // Row 1: the maximum twice; the lower index wins.
    row(1)[vocab - 1] = 100.0f;
    row(1)[vocab / 2] = 100.0f;
    // Row 2: NaN everywhere but one value.
    for (std::uint32_t i = 0; i < vocab; ++i) row(2)[i] = std::numeric_limits<float>::quiet_NaN();
    row(2)[vocab - 2] = -5.0f;
    // Row 3: all NaN -> 0. Row 4: all -inf -> 0. Row 5: the maximum at index 0.
    for (std::uint32_t i = 0; i < vocab; ++i) {
      row(3)[i] = std::numeric_limits<float>::quiet_NaN();
      row(4)[i] = -std::numeric_limits<float>::infinity();
    }
    row(5)[0] = 1000.0f;
    std::vector<std::int32_t> want(kRows);
    for (std::uint32_t r = 0; r < kRows; ++r) {
      std::int32_t best = -1;
      for (std::uint32_t i = 0; i < vocab; ++i) {
        if (std::isnan(row(r)[i])) continue;
        if (best < 0 || row(r)[i] > row(r)[best]) best = static_cast<std::int32_t>(i);
      }
      want[r] = best < 0 ? 0 : best;
    }
    ASSERT_EQ(want[1], static_cast<std::int32_t>(vocab / 2));
    DeviceBuffer d_logits(logits), d_out(kRows * sizeof(std::int32_t));
    DeviceBuffer d_partials(std::size_t{kRows} * kArgmaxSplits * sizeof(ArgmaxPartial));
    // One block a row, then split over blocks (at 151,936 the two maxima of row 1 fall in
    // different splits, so the merge decides the tie).
    for (const bool split : {false, true}) {
      SCOPED_TRACE(split ? "split over blocks" : "one block a row");
      d_out.poison();
      d_partials.poison();
      ArgmaxParams p;
      p.rows = kRows;
      p.vocab = vocab;
      p.logits = static_cast<const float*>(d_logits.get());
      p.out = static_cast<std::int32_t*>(d_out.get());
      p.workspace = split ? static_cast<ArgmaxPartial*>(d_partials.get()) : nullptr;
      Status done = argmax_cuda(p, nullptr);
      ASSERT_TRUE(done.ok()) << done.to_string();
      sync_ok();
      const auto bytes = d_out.download();
      std::vector<std::int32_t> got(kRows);
      std::memcpy(got.data(), bytes.data(), kRows * sizeof(std::int32_t));
      EXPECT_EQ(got, want);
    }
  }
}

#endif  // KVVM_HAS_CUDA_KERNELS

}  // namespace
}  // namespace kvvm
