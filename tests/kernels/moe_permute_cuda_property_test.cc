// moe_permute_cuda's properties over random shapes and routings (rapidcheck): every pair appears
// exactly once; rows are grouped by expert in id order, each expert's run starting at a multiple
// of the tile and holding its pairs in ascending order, then only padding up to the next run;
// slot_of_pair is the inverse of rows; the active list names exactly the experts with a pair,
// ascending. Skipped without a GPU.
#include <gtest/gtest.h>
#include <rapidcheck.h>

#include <cstdint>
#include <vector>

#include "moe_fixture.h"

namespace kvvm::moe_kernels_test {
namespace {

#if defined(KVVM_HAS_CUDA_KERNELS)

TEST(MoePermuteCudaProperty, EveryPairOnceGroupedStableAlignedAndInverse) {
  if (!have_cuda_device()) GTEST_SKIP() << "no CUDA device";
  const bool held = rc::check("the permutation's properties", [] {
    const std::uint32_t experts = *rc::gen::inRange<std::uint32_t>(1, kMoeMaxExperts + 1);
    const std::uint32_t most_k = std::min(experts, kMoeMaxTopK);
    const std::uint32_t top_k = *rc::gen::inRange<std::uint32_t>(1, most_k + 1);
    const std::uint32_t tokens = *rc::gen::inRange<std::uint32_t>(1, 8193);
    const std::uint32_t tile = 1u << *rc::gen::inRange<std::uint32_t>(0, 8);
    // How concentrated the routing is: each token's choices among the first `hot` experts.
    const std::uint32_t hot = *rc::gen::inRange<std::uint32_t>(top_k, experts + 1);
    const std::uint32_t seed = *rc::gen::arbitrary<std::uint32_t>();
    std::mt19937 rng(seed);
    std::vector<std::int32_t> ids(std::size_t{tokens} * top_k);
    std::vector<std::int32_t> order(hot);
    for (std::uint32_t t = 0; t < tokens; ++t) {
      for (std::uint32_t e = 0; e < hot; ++e) order[e] = static_cast<std::int32_t>(e);
      std::shuffle(order.begin(), order.end(), rng);
      for (std::uint32_t j = 0; j < top_k; ++j) ids[std::size_t{t} * top_k + j] = order[j];
    }
    DevicePermutation device(tokens, top_k, experts, tile);
    device.ids.upload(ids);
    device.poison();
    RC_ASSERT(moe_permute_cuda(device.params(), nullptr).ok());
    RC_ASSERT(cudaDeviceSynchronize() == cudaSuccess);
    const Permutation got = device.read();
    const std::uint32_t pairs = tokens * top_k;
    RC_ASSERT(got.offsets[0] == 0u);
    RC_ASSERT(got.offsets[experts] <= device.capacity);
    std::vector<int> seen(pairs, 0);
    std::vector<std::uint32_t> count(experts, 0);
    for (const std::int32_t id : ids) ++count[static_cast<std::uint32_t>(id)];
    std::vector<std::uint32_t> active;
    for (std::uint32_t e = 0; e < experts; ++e) {
      const std::uint32_t begin = got.offsets[e], end = got.offsets[e + 1];
      RC_ASSERT(begin % tile == 0);
      RC_ASSERT(end >= begin + count[e]);
      RC_ASSERT(end - begin < count[e] + tile);  // only the padding to the next multiple
      if (count[e] > 0) active.push_back(e);
      for (std::uint32_t r = begin; r < end; ++r) {
        if (r >= begin + count[e]) {
          RC_ASSERT(got.rows[r] == kMoePadRow);
          continue;
        }
        const std::uint32_t p = got.rows[r];
        RC_ASSERT(p < pairs);
        RC_ASSERT(ids[p] == static_cast<std::int32_t>(e));
        if (r > begin) RC_ASSERT(got.rows[r - 1] < p);  // stable: ascending within the expert
        RC_ASSERT(got.slot_of_pair[p] == r);
        ++seen[p];
      }
    }
    for (std::uint32_t p = 0; p < pairs; ++p) RC_ASSERT(seen[p] == 1);
    RC_ASSERT(got.active.size() == active.size() + 1);
    RC_ASSERT(got.active[0] == active.size());
    for (std::size_t i = 0; i < active.size(); ++i) RC_ASSERT(got.active[1 + i] == active[i]);
  });
  EXPECT_TRUE(held);
}

#endif  // KVVM_HAS_CUDA_KERNELS

}  // namespace
}  // namespace kvvm::moe_kernels_test
