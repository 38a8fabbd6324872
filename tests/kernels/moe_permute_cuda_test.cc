// moe_permute_cuda (include/kvvm/kernels/moe_kernels.h) against the host's permutation written
// from the definition, word for word: one token, empty experts, every token on the same experts,
// the largest expert count and top_k, more pairs than one pass of the block, tiles of 1 to 128;
// and the same ids twice give the same bits. Skipped without a GPU
// (moe_permute_cuda_property_test.cc checks the properties over random shapes).
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "moe_fixture.h"

namespace kvvm::moe_kernels_test {
namespace {

#if defined(KVVM_HAS_CUDA_KERNELS)

struct PermuteCase {
  std::uint32_t tokens, top_k, experts, tile;
  Routing routing;
};

TEST(MoePermuteCuda, MatchesTheHostsPermutationWordForWord) {
  if (!have_cuda_device()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(5);
  const PermuteCase cases[] = {
      {1, 1, 1, 16, Routing::kUniform},        {1, 8, 128, 16, Routing::kUniform},
      {3, 2, 8, 16, Routing::kSameExperts},    {64, 8, 128, 16, Routing::kSkewed},
      {1000, 2, 8, 16, Routing::kUniform},     {8192, 8, 128, 16, Routing::kUniform},
      {2048, 16, 512, 16, Routing::kUniform},  {777, 4, 60, 1, Routing::kSkewed},
      {513, 3, 7, 128, Routing::kSameExperts}, {5000, 1, 512, 32, Routing::kSkewed},
  };
  for (const PermuteCase& c : cases) {
    const std::vector<std::int32_t> ids = make_ids(c.tokens, c.top_k, c.experts, c.routing, rng);
    const Permutation want = permute_on_host(ids, c.experts, c.tile);
    DevicePermutation device(c.tokens, c.top_k, c.experts, c.tile);
    device.ids.upload(ids);
    for (int run = 0; run < 2; ++run) {
      device.poison();
      ASSERT_TRUE(moe_permute_cuda(device.params(), nullptr).ok());
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      const Permutation got = device.read();
      const std::string where = "tokens " + std::to_string(c.tokens) + " top_k " +
                                std::to_string(c.top_k) + " experts " + std::to_string(c.experts) +
                                " tile " + std::to_string(c.tile);
      EXPECT_EQ(got.offsets, want.offsets) << where;
      EXPECT_EQ(got.rows, want.rows) << where;
      EXPECT_EQ(got.slot_of_pair, want.slot_of_pair) << where;
      EXPECT_EQ(got.active, want.active) << where;
      EXPECT_LE(want.rows.size(), device.capacity) << where;
    }
  }
}

#endif  // KVVM_HAS_CUDA_KERNELS

}  // namespace
}  // namespace kvvm::moe_kernels_test
