// The device sampler (sample_cuda, include/kvvm/kernels/model_kernels.h) against the CPU's
// sample_token (include/kvvm/model/sampling.h) on many random rows: vocabularies of 1000 and
// Qwen2's 151936, greedy, temperatures, top-k (1, small, vocab - 1, vocab, above it), top-p
// (tiny to 1), seeds and counters (64-bit, both halves), and rows with ties, NaN, -inf, +inf,
// -0 / +0. Tokens must be equal: the two differ only where u * total falls within float
// rounding (~1e-15 relative) of a cumulative mass, which no row here comes near by chance.
// Skipped without a GPU; the refusals are checked everywhere.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kvvm/kernels/model_kernels.h"
#include "kvvm/model/sampling.h"
#if defined(KVVM_HAS_CUDA_KERNELS)
#include <cuda_runtime.h>

#include "support/cuda_device.h"
#include "support/device_buffer.h"
#endif

namespace kvvm {
namespace {

using model::SamplingParams;

TEST(ModelKernelsSamplingChecks, MalformedCallsAreRefused) {
#if !defined(KVVM_HAS_CUDA_KERNELS)
  EXPECT_EQ(sample_cuda(SampleParams{}, nullptr).code(), StatusCode::kUnavailable);
#else
  EXPECT_TRUE(sample_cuda(SampleParams{}, nullptr).ok());  // zero rows: nothing to launch
  float logits[4] = {};
  SamplingRow row;
  std::int32_t out = 0;
  SampleParams p{.rows = 1, .vocab = 0, .logits = logits, .rows_params = &row, .out = &out};
  Status refused = sample_cuda(p, nullptr);
  EXPECT_EQ(refused.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(refused.message().find("vocab is 0"), std::string::npos) << refused.to_string();
  p.vocab = 4;
  p.rows_params = nullptr;
  refused = sample_cuda(p, nullptr);
  EXPECT_NE(refused.message().find("rows_params is null"), std::string::npos)
      << refused.to_string();
#endif
}

#if defined(KVVM_HAS_CUDA_KERNELS)

struct Case {
  std::vector<float> logits;
  SamplingParams params;
  std::uint64_t counter = 0;
  std::string kind;
};

SamplingRow row_of(const SamplingParams& p, std::uint64_t counter) {
  SamplingRow row;
  row.temperature = p.temperature;
  row.top_k = p.top_k;
  row.top_p = p.top_p;
  row.min_p = p.min_p;
  row.seed_low = static_cast<std::uint32_t>(p.seed);
  row.seed_high = static_cast<std::uint32_t>(p.seed >> 32);
  row.counter_low = static_cast<std::uint32_t>(counter);
  row.counter_high = static_cast<std::uint32_t>(counter >> 32);
  return row;
}

class ModelKernelsSamplingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!testing::have_cuda_device()) GTEST_SKIP() << "no CUDA device";
  }

  // A row of `vocab` logits of the given kind.
  std::vector<float> make_row(std::uint32_t vocab, int kind, std::string* name) {
    std::normal_distribution<float> normal(0.0f, 3.0f);
    std::uniform_int_distribution<int> level(-3, 3);
    std::uniform_int_distribution<std::uint32_t> index(0, vocab - 1);
    std::vector<float> row(vocab);
    const float nan = std::numeric_limits<float>::quiet_NaN();
    const float inf = std::numeric_limits<float>::infinity();
    switch (kind) {
      case 0:
        *name = "normal";
        for (float& v : row) v = normal(rng_);
        break;
      case 1:  // peaked, as a trained model's
        *name = "peaked";
        for (float& v : row) v = normal(rng_);
        for (int i = 0; i < 5; ++i) row[index(rng_)] += 12.0f + static_cast<float>(i);
        break;
      case 2:  // few distinct values: long runs of ties
        *name = "ties";
        for (float& v : row) v = static_cast<float>(level(rng_));
        break;
      case 3:  // -0 and +0 tie; some NaN and -inf
        *name = "signed zeros, NaN, -inf";
        for (float& v : row) v = normal(rng_) > 0 ? 0.0f : -0.0f;
        for (int i = 0; i < 20; ++i) row[index(rng_)] = nan;
        for (int i = 0; i < 20; ++i) row[index(rng_)] = -inf;
        row[index(rng_)] = 1.0f;
        break;
      case 4:
        *name = "NaN and -inf sprinkled";
        for (float& v : row) v = normal(rng_);
        for (std::uint32_t i = 0; i < vocab / 10; ++i) row[index(rng_)] = nan;
        for (std::uint32_t i = 0; i < vocab / 10; ++i) row[index(rng_)] = -inf;
        break;
      case 5:
        *name = "all -inf";
        for (float& v : row) v = -inf;
        break;
      case 6:
        *name = "all NaN but a few -inf";
        for (float& v : row) v = nan;
        row[index(rng_)] = -inf;
        break;
      case 7:
        *name = "a +inf";
        for (float& v : row) v = normal(rng_);
        row[index(rng_)] = inf;
        break;
      default:  // all equal
        *name = "flat";
        for (float& v : row) v = 0.5f;
        break;
    }
    return row;
  }

  SamplingParams make_params(std::uint32_t vocab) {
    const float temperatures[] = {0.0f, 0.3f, 0.7f, 1.0f, 1.0f, 1.5f, 5.0f};
    const std::uint32_t top_ks[] = {0, 0, 0, 1, 2, 10, 50, vocab - 1, vocab, vocab + 5};
    const float top_ps[] = {1.0f, 1.0f, 0.95f, 0.9f, 0.5f, 0.1f, 1e-6f};
    const float min_ps[] = {0.0f, 0.0f, 0.0f, 1e-4f, 0.05f, 0.3f, 1.0f};
    auto pick = [&](std::size_t n) {
      return std::uniform_int_distribution<std::size_t>(0, n - 1)(rng_);
    };
    SamplingParams p;
    p.temperature = temperatures[pick(std::size(temperatures))];
    p.top_k = top_ks[pick(std::size(top_ks))];
    p.top_p = top_ps[pick(std::size(top_ps))];
    p.min_p = min_ps[pick(std::size(min_ps))];
    p.seed = rng_();
    return p;
  }

  // Runs every case on the device in one launch and compares each row with the CPU's token.
  // with_argmax: argmax_cuda's answer is passed in, so greedy rows copy it.
  void check(std::uint32_t vocab, int rows, bool with_argmax = false) {
    std::vector<Case> cases;
    std::vector<float> logits;
    std::vector<SamplingRow> params;
    for (int r = 0; r < rows; ++r) {
      Case c;
      c.logits = make_row(vocab, r % 9, &c.kind);
      c.params = make_params(vocab);
      c.counter = r % 3 == 0 ? rng_() : static_cast<std::uint64_t>(r);
      logits.insert(logits.end(), c.logits.begin(), c.logits.end());
      params.push_back(row_of(c.params, c.counter));
      cases.push_back(std::move(c));
    }
    testing::DeviceBuffer device_logits(logits);
    testing::DeviceBuffer device_params(params);
    testing::DeviceBuffer device_out(rows * sizeof(std::int32_t));
    device_out.poison();
    SampleParams p;
    p.rows = static_cast<std::uint32_t>(rows);
    p.vocab = vocab;
    p.logits = static_cast<const float*>(device_logits.get());
    p.rows_params = static_cast<const SamplingRow*>(device_params.get());
    p.out = static_cast<std::int32_t*>(device_out.get());
    testing::DeviceBuffer device_argmax(rows * sizeof(std::int32_t));
    testing::DeviceBuffer workspace(rows * kArgmaxSplits * sizeof(ArgmaxPartial));
    if (with_argmax) {
      device_argmax.poison();
      ArgmaxParams argmax{.rows = p.rows,
                          .vocab = vocab,
                          .logits = p.logits,
                          .out = static_cast<std::int32_t*>(device_argmax.get()),
                          .workspace = static_cast<ArgmaxPartial*>(workspace.get())};
      ASSERT_TRUE(argmax_cuda(argmax, nullptr).ok());
      p.argmax = argmax.out;
    }
    const Status status = sample_cuda(p, nullptr);
    ASSERT_TRUE(status.ok()) << status.to_string();
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const std::vector<std::uint8_t> bytes = device_out.download();
    const auto* out = reinterpret_cast<const std::int32_t*>(bytes.data());
    int differ = 0, not_greedy = 0;
    for (int r = 0; r < rows; ++r) {
      const Case& c = cases[static_cast<std::size_t>(r)];
      const std::int32_t expected = model::sample_token(c.logits, c.params, c.counter);
      const std::int32_t greedy = model::sample_token(c.logits, {}, 0);
      if (expected != greedy) ++not_greedy;
      if (out[r] != expected) {
        ++differ;
        ADD_FAILURE() << "row " << r << " (" << c.kind << ", T " << c.params.temperature
                      << ", top_k " << c.params.top_k << ", top_p " << c.params.top_p << ", min_p "
                      << c.params.min_p << ", seed " << c.params.seed << ", counter " << c.counter
                      << "): device " << out[r] << ", CPU " << expected;
      }
    }
    // The rows must exercise the draw, not only the argmax.
    EXPECT_GT(not_greedy, rows / 5) << "too few rows where sampling differs from greedy";
    EXPECT_EQ(differ, 0);
  }

  std::mt19937_64 rng_{20261130};
};

TEST_F(ModelKernelsSamplingTest, MatchesTheCpuOnSmallVocabularies) { check(1000, 3000); }

TEST_F(ModelKernelsSamplingTest, MatchesTheCpuOnQwenSizedVocabularies) { check(151936, 90); }

TEST_F(ModelKernelsSamplingTest, GreedyRowsTakeTheArgmaxTheyAreGiven) {
  check(1000, 900, /*with_argmax=*/true);
  check(151936, 45, /*with_argmax=*/true);
  // The copy is taken, not recomputed: a greedy row answers what it is given.
  const std::vector<float> row(64, std::numeric_limits<float>::quiet_NaN());
  testing::DeviceBuffer logits(row);
  testing::DeviceBuffer rows(std::vector<SamplingRow>{SamplingRow{}});
  testing::DeviceBuffer given(std::vector<std::int32_t>{41});
  testing::DeviceBuffer out(sizeof(std::int32_t));
  SampleParams p{.rows = 1,
                 .vocab = 64,
                 .logits = static_cast<const float*>(logits.get()),
                 .rows_params = static_cast<const SamplingRow*>(rows.get()),
                 .argmax = static_cast<const std::int32_t*>(given.get()),
                 .out = static_cast<std::int32_t*>(out.get())};
  ASSERT_TRUE(sample_cuda(p, nullptr).ok());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<std::uint8_t> bytes = out.download();
  std::int32_t token = 0;
  std::memcpy(&token, bytes.data(), sizeof(token));
  EXPECT_EQ(token, 41);  // the row alone would give 0 (every logit NaN)
}

TEST_F(ModelKernelsSamplingTest, TinyVocabulariesAndOneRowPerTopK) {
  // Every top_k of an 8-token row with ties, at several seeds: the tie cut by id order.
  for (std::uint32_t k = 0; k <= 9; ++k) {
    std::vector<float> row = {1.0f, 2.0f, 2.0f, 0.5f, 2.0f, 1.0f, -1.0f, 2.0f};
    for (std::uint64_t counter = 0; counter < 64; ++counter) {
      SamplingParams params{.temperature = 1.0f, .top_k = k, .top_p = 1.0f, .seed = 7};
      testing::DeviceBuffer logits(row);
      testing::DeviceBuffer rows(std::vector<SamplingRow>{row_of(params, counter)});
      testing::DeviceBuffer out(sizeof(std::int32_t));
      SampleParams p{.rows = 1,
                     .vocab = 8,
                     .logits = static_cast<const float*>(logits.get()),
                     .rows_params = static_cast<const SamplingRow*>(rows.get()),
                     .out = static_cast<std::int32_t*>(out.get())};
      ASSERT_TRUE(sample_cuda(p, nullptr).ok());
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      const std::vector<std::uint8_t> bytes = out.download();
      std::int32_t token = 0;
      std::memcpy(&token, bytes.data(), sizeof(token));
      ASSERT_EQ(token, model::sample_token(row, params, counter))
          << "top_k " << k << ", counter " << counter;
    }
  }
}

#endif

}  // namespace
}  // namespace kvvm
