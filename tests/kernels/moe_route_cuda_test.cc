// moe_route_cuda (include/kvvm/kernels/moe_kernels.h) against a float64 softmax and top-k: the
// chosen ids exactly (ties to the lower id: rows of equal logits, and bf16 logits, which repeat
// among 128 experts), the weights to float32's rounding, renormalised or not, for fp32, bf16 and
// fp16 logits, 1 to 512 experts, top_k 1 to 16; a NaN logit ranking below every number. Skipped
// without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "moe_fixture.h"

namespace kvvm::moe_kernels_test {
namespace {

#if defined(KVVM_HAS_CUDA_KERNELS)

struct RouteCase {
  DType element;
  std::uint32_t tokens, experts, top_k;
};

// logits [tokens][experts] as float values already representable in `element`.
std::vector<float> representable(DType element, std::vector<float> logits) {
  if (element == DType::kFp32) return logits;
  for (float& v : logits) v = static_cast<float>(round_to(element, v));
  return logits;
}

std::vector<std::uint8_t> stored(DType element, const std::vector<float>& logits) {
  const std::size_t size = element == DType::kFp32 ? 4 : 2;
  std::vector<std::uint8_t> bytes(logits.size() * size);
  for (std::size_t i = 0; i < logits.size(); ++i) {
    kernels::store_element(element, logits[i], &bytes[i * size]);
  }
  return bytes;
}

// The definition in float64: softmax over the numbers, top k by (p, lower id), NaN last.
void route_on_host(const float* logits, std::uint32_t experts, std::uint32_t top_k,
                   bool renormalize, std::int32_t* ids, double* weights) {
  double top = -std::numeric_limits<double>::infinity();
  for (std::uint32_t e = 0; e < experts; ++e) {
    if (!std::isnan(logits[e])) top = std::max(top, static_cast<double>(logits[e]));
  }
  std::vector<double> p(experts);
  double sum = 0;
  for (std::uint32_t e = 0; e < experts; ++e) {
    p[e] = std::exp(static_cast<double>(logits[e]) - top);
    if (!std::isnan(p[e])) sum += p[e];
  }
  for (double& v : p) v /= sum;
  std::vector<std::uint32_t> order(experts);
  std::iota(order.begin(), order.end(), 0u);
  std::stable_sort(order.begin(), order.end(), [&](std::uint32_t a, std::uint32_t b) {
    if (std::isnan(p[a]) || std::isnan(p[b])) return !std::isnan(p[a]) && std::isnan(p[b]);
    return p[a] > p[b];
  });
  double chosen = 0;
  for (std::uint32_t j = 0; j < top_k; ++j) chosen += p[order[j]];
  for (std::uint32_t j = 0; j < top_k; ++j) {
    ids[j] = static_cast<std::int32_t>(order[j]);
    weights[j] = renormalize ? p[order[j]] / chosen : p[order[j]];
  }
}

void expect_routes(DType element, std::uint32_t tokens, std::uint32_t experts, std::uint32_t top_k,
                   const std::vector<float>& logits, const char* what) {
  DeviceBuffer d_logits(stored(element, logits));
  DeviceBuffer d_ids(std::size_t{tokens} * top_k * 4), d_weights(std::size_t{tokens} * top_k * 4);
  for (const bool renormalize : {false, true}) {
    MoeRouteParams p;
    p.element = element;
    p.tokens = tokens;
    p.experts = experts;
    p.top_k = top_k;
    p.renormalize = renormalize;
    p.logits = d_logits.get();
    p.ids = static_cast<std::int32_t*>(d_ids.get());
    p.weights = static_cast<float*>(d_weights.get());
    d_ids.poison();
    d_weights.poison();
    ASSERT_TRUE(moe_route_cuda(p, nullptr).ok());
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const auto ids = download<std::int32_t>(d_ids, std::size_t{tokens} * top_k);
    const auto weights = download<float>(d_weights, std::size_t{tokens} * top_k);
    std::vector<std::int32_t> want_ids(top_k);
    std::vector<double> want_weights(top_k);
    for (std::uint32_t t = 0; t < tokens; ++t) {
      route_on_host(&logits[std::size_t{t} * experts], experts, top_k, renormalize, want_ids.data(),
                    want_weights.data());
      for (std::uint32_t j = 0; j < top_k; ++j) {
        const std::size_t at = std::size_t{t} * top_k + j;
        ASSERT_EQ(ids[at], want_ids[j])
            << what << ": token " << t << " choice " << j << " experts " << experts << " top_k "
            << top_k << " renormalize " << renormalize;
        if (std::isnan(want_weights[j])) {
          EXPECT_TRUE(std::isnan(weights[at])) << what;
        } else {
          // A few float32 roundings: exp, the sum, the divisions.
          EXPECT_NEAR(weights[at], want_weights[j], want_weights[j] * 5e-6 + 1e-30)
              << what << ": token " << t << " choice " << j;
        }
      }
    }
  }
}

TEST(MoeRouteCuda, ChoosesAndWeighsAsAFloat64SoftmaxTopK) {
  if (!have_cuda_device()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(3);
  std::normal_distribution<float> value(0.0f, 2.0f);
  const RouteCase cases[] = {
      {DType::kBf16, 37, 128, 8}, {DType::kFp16, 5, 8, 2},      {DType::kFp32, 100, 60, 4},
      {DType::kFp32, 3, 512, 16}, {DType::kBf16, 9, 1, 1},      {DType::kFp16, 64, 64, 6},
      {DType::kBf16, 1, 33, 16},  {DType::kFp32, 2000, 128, 8},
  };
  for (const RouteCase& c : cases) {
    std::vector<float> logits(std::size_t{c.tokens} * c.experts);
    for (float& v : logits) v = value(rng);
    expect_routes(c.element, c.tokens, c.experts, c.top_k, representable(c.element, logits),
                  "random logits");
  }
}

TEST(MoeRouteCuda, EqualLogitsGoToTheLowerExpertFirst) {
  if (!have_cuda_device()) GTEST_SKIP() << "no CUDA device";
  const std::uint32_t experts = 128, tokens = 4;
  std::vector<float> logits(std::size_t{tokens} * experts, 0.5f);  // token 0: all equal
  for (std::uint32_t e = 0; e < experts; ++e) {
    logits[experts + e] = static_cast<float>(e % 3);    // token 1: ties among the largest
    logits[2 * experts + e] = e >= 100 ? 1.0f : -1.0f;  // token 2: the ties at high ids
    logits[3 * experts + e] = (e % 16 == 5) ? 2.0f : static_cast<float>(e) / 1000;
  }
  for (const DType element : {DType::kBf16, DType::kFp32}) {
    expect_routes(element, tokens, experts, 8, representable(element, logits), "ties");
  }
}

TEST(MoeRouteCuda, ANanLogitRanksBelowEveryNumber) {
  if (!have_cuda_device()) GTEST_SKIP() << "no CUDA device";
  const std::uint32_t experts = 16, tokens = 3;
  std::vector<float> logits(std::size_t{tokens} * experts);
  for (std::uint32_t i = 0; i < logits.size(); ++i) logits[i] = static_cast<float>(i % 7) - 3;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  logits[0] = nan;  // token 0: one NaN among numbers
  logits[3] = nan;
  for (std::uint32_t e = 0; e < 14; ++e) logits[experts + e] = nan;  // token 1: 2 numbers
  for (std::uint32_t e = 0; e < experts; ++e) logits[2 * experts + e] = e == 9 ? nan : -1.0f;
  for (const DType element : {DType::kFp16, DType::kFp32}) {
    expect_routes(element, tokens, experts, 4, representable(element, logits), "NaN");
  }
}

#endif  // KVVM_HAS_CUDA_KERNELS

}  // namespace
}  // namespace kvvm::moe_kernels_test
