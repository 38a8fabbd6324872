// The CPU forward pass on the configurations the supported families add beside plain Llama:
// RoPE scaling (`linear`, `llama3`) with its inverse-frequency table pinned to hand-computed
// values, Qwen2's q/k/v biases with a tied lm_head, an o_proj bias, multi-head attention
// without grouping, and BF16 / F16 checkpoints converted at load. Each against the float64
// reference (support/reference_transformer.h).
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "model/rope.h"
#include "support/model_rig.h"

namespace kvvm {
namespace {

using model::ModelConfig;
using model::RopeScaling;
using model::TensorDType;
using testing::ModelRig;
using testing::Sequence;

// Prefill, a second chunk and decode tokens of two sequences, each checked.
void run_mixed(ModelRig& rig, double tolerance = testing::kTolerance) {
  Sequence a = rig.admit(200, 11), b = rig.admit(40, 12);
  rig.step({&a}, {150}, tolerance);
  rig.step({&b, &a}, {30, 40}, tolerance);
  for (int i = 0; i < 6; ++i) rig.step({&a, &b}, {1, 1}, tolerance);
}

ModelConfig llama3_config() {
  ModelConfig c = testing::tiny_config();
  c.rope.scaling = RopeScaling::kLlama3;
  c.rope.factor = 8;
  c.rope.low_freq_factor = 1;
  c.rope.high_freq_factor = 4;
  c.rope.original_max_position = 32;  // wavelengths 8 and 32 split head_dim 16's frequencies
  return c;
}

TEST(RopeInvFreq, DefaultIsThetaToTheMinusTwoIOverD) {
  const std::vector<float> inv_freq = model::rope_inv_freq(testing::tiny_config());
  ASSERT_EQ(inv_freq.size(), 8u);
  EXPECT_EQ(inv_freq[0], 1.0f);
  EXPECT_NEAR(inv_freq[1], 0.31622776601683794, 1e-7);  // 10000^(-1/8)
  EXPECT_NEAR(inv_freq[2], 0.1, 1e-8);
  EXPECT_NEAR(inv_freq[4], 0.01, 1e-9);
}

TEST(RopeInvFreq, LinearDividesByTheFactor) {
  ModelConfig c = testing::tiny_config();
  c.rope.scaling = RopeScaling::kLinear;
  c.rope.factor = 4;
  const std::vector<float> inv_freq = model::rope_inv_freq(c);
  EXPECT_EQ(inv_freq[0], 0.25f);
  EXPECT_NEAR(inv_freq[2], 0.025, 1e-9);
}

TEST(RopeInvFreq, Llama3KeepsHighScalesLowAndBlendsBetween) {
  const std::vector<float> inv_freq = model::rope_inv_freq(llama3_config());
  // wavelength 2 pi < 8: unchanged.
  EXPECT_EQ(inv_freq[0], 1.0f);
  // wavelength 19.87 between 8 and 32: smooth = (32 / 19.869 - 1) / 3 = 0.20351,
  // (1 - smooth) * f / 8 + smooth * f with f = 10000^(-1/8).
  EXPECT_NEAR(inv_freq[1], 0.09583998588296266, 1e-7);
  // wavelength 62.8 > 32: divided by the factor.
  EXPECT_NEAR(inv_freq[2], 0.0125, 1e-9);
  EXPECT_FLOAT_EQ(inv_freq[7], static_cast<float>(std::pow(10000.0, -7.0 / 8) / 8));
}

TEST(RopeInvFreq, RotationIsRotateHalfAtPositionTimesFrequency) {
  std::vector<float> head = {1, 2, 3, 4};  // head_dim 4: pairs (1, 3) and (2, 4)
  const float inv_freq[] = {0.5f, 0.25f};
  model::apply_rope(head.data(), 4, inv_freq, 2);
  EXPECT_NEAR(head[0], 1 * std::cos(1.0) - 3 * std::sin(1.0), 1e-6);
  EXPECT_NEAR(head[2], 3 * std::cos(1.0) + 1 * std::sin(1.0), 1e-6);
  EXPECT_NEAR(head[1], 2 * std::cos(0.5) - 4 * std::sin(0.5), 1e-6);
  EXPECT_NEAR(head[3], 4 * std::cos(0.5) + 2 * std::sin(0.5), 1e-6);
}

TEST(ModelCpuVariants, Llama3RopeScalingMatchesTheReference) {
  ModelRig rig(llama3_config(), TensorDType::kF32, Layout::kTokenMajor);
  ASSERT_TRUE(rig.ready());
  run_mixed(rig);
}

TEST(ModelCpuVariants, LinearRopeScalingMatchesTheReference) {
  ModelConfig c = testing::tiny_config();
  c.rope.scaling = RopeScaling::kLinear;
  c.rope.factor = 2.5;
  c.rope.theta = 500000;
  ModelRig rig(c, TensorDType::kF32, Layout::kHeadMajor);
  ASSERT_TRUE(rig.ready());
  run_mixed(rig);
}

TEST(ModelCpuVariants, QkvBiasesAndTiedLmHeadMatchTheReference) {
  ModelConfig c = testing::tiny_config();
  c.architecture = "Qwen2ForCausalLM";
  c.qkv_bias = true;
  c.tie_word_embeddings = true;
  c.kv_heads = 1;  // a group of four query heads
  ModelRig rig(c, TensorDType::kF32, Layout::kSeqMajor);
  ASSERT_TRUE(rig.ready());
  run_mixed(rig);
}

TEST(ModelCpuVariants, OBiasAndUngroupedHeadsMatchTheReference) {
  ModelConfig c = testing::tiny_config();
  c.qkv_bias = true;
  c.o_bias = true;
  c.kv_heads = c.heads;
  ModelRig rig(c, TensorDType::kF32, Layout::kTokenMajor);
  ASSERT_TRUE(rig.ready());
  run_mixed(rig);
}

// A dimension of one (one layer, one KV head) shares its stride with another in some layouts.
TEST(ModelCpuVariants, OneLayerOfOneKvHeadOnEveryLayout) {
  ModelConfig c = testing::tiny_config();
  c.layers = 1;
  c.kv_heads = 1;
  for (Layout layout : all_layouts()) {
    SCOPED_TRACE(std::string(to_string(layout)));
    ModelRig rig(c, TensorDType::kF32, layout);
    ASSERT_TRUE(rig.ready());
    run_mixed(rig);
  }
}

// The reference reads the same bf16 / f16 values, so the conversion must be exact.
TEST(ModelCpuVariants, Bf16WeightsAreConvertedExactly) {
  ModelRig rig(testing::tiny_config(), TensorDType::kBf16, Layout::kTokenMajor);
  ASSERT_TRUE(rig.ready());
  run_mixed(rig);
}

TEST(ModelCpuVariants, F16WeightsAreConvertedExactly) {
  ModelRig rig(testing::tiny_config(), TensorDType::kF16, Layout::kHeadMajor);
  ASSERT_TRUE(rig.ready());
  run_mixed(rig);
}

}  // namespace
}  // namespace kvvm
