// Where a mixture's tensors sit in a layer block (model/weights/weight_layout.h): the router and
// the shared expert's gate in the element type, each expert's gate|up, down and scales in its own
// stretch at a fixed stride, no two tensors overlapping, every one inside the block; and a dummy
// CPU model of each family that loads.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "kvvm/model/model.h"
#include "model/weights/weight_layout.h"
#include "model/weights/weight_tensors.h"
#include "support/tiny_model.h"

namespace kvvm::model {
namespace {

// tiny_cuda_moe_config's Qwen2-MoE with 128-wide experts, block-scaled FP8.
ModelConfig fp8_qwen2_moe() {
  ModelConfig c = testing::tiny_cuda_moe_config("qwen2_moe", 256);
  c.hidden_size = 256;
  c.moe.expert_intermediate = 128;
  c.moe.shared_intermediate = 256;
  c.weight_quant = WeightQuant::kFp8Block;
  return c;
}

TEST(MoeLayout, ExpertsSitAtAStrideWithTheirScalesAndNothingOverlaps) {
  const ModelConfig c = fp8_qwen2_moe();
  const detail::WeightLayout layout = detail::weight_layout(c, DType::kBf16);
  const detail::SparseOffsets& sparse = layout.sparse;
  // e4m3 gate|up (2 x 128 x 256) and down (256 x 128), then float32 scales: gate|up 2 x 1 x 4,
  // down 2 x 4 (one block row of 128 columns padded to 4 floats), each run 256-aligned.
  EXPECT_EQ(sparse.expert.gate_up, 0u);
  EXPECT_EQ(sparse.expert.down, 2u * 128 * 256);
  EXPECT_EQ(sparse.expert.gate_up_scale, 3u * 128 * 256);
  EXPECT_EQ(sparse.expert.down_scale, 3u * 128 * 256 + 256);
  EXPECT_EQ(sparse.expert_stride, 3u * 128 * 256 + 512);
  EXPECT_EQ(layout.sizes.expert_bytes, sparse.expert_stride);
  EXPECT_EQ(layout.sizes.layer_bytes, sparse.experts + 8 * sparse.expert_stride);

  auto tensors = detail::weight_tensors(c, layout, nullptr);
  ASSERT_TRUE(tensors.ok()) << tensors.status().to_string();
  // Every byte range (tensor and scales) of layer 1's block, none overlapping, all inside it.
  std::vector<std::pair<std::uint64_t, std::uint64_t>> ranges;
  std::map<std::string, const detail::WeightTensor*> by_name;
  for (const detail::WeightTensor& t : *tensors) {
    by_name[t.name] = &t;
    if (t.region != 1) continue;
    const std::uint64_t size = t.quant != WeightQuant::kNone ? 1 : 2;
    ranges.emplace_back(t.offset, t.offset + t.elements * size);
    if (t.scale_offset != detail::kNoTensor) {
      ranges.emplace_back(
          t.scale_offset,
          t.scale_offset + detail::device_scale_count(t.quant, t.shape[0], t.shape[1]) * 4);
    }
  }
  std::sort(ranges.begin(), ranges.end());
  for (std::size_t i = 1; i < ranges.size(); ++i) {
    EXPECT_LE(ranges[i - 1].second, ranges[i].first) << "ranges " << i - 1 << " and " << i;
  }
  EXPECT_LE(ranges.back().second, layout.sizes.layer_bytes);

  const std::string p = "model.layers.1.mlp.";
  const detail::WeightTensor* router = by_name.at(p + "gate.weight");
  EXPECT_EQ(router->offset, sparse.router);
  EXPECT_EQ(router->quant, WeightQuant::kNone);  // never quantized
  EXPECT_EQ(by_name.at(p + "shared_expert_gate.weight")->quant, WeightQuant::kNone);
  const std::uint64_t third = sparse.experts + 3 * sparse.expert_stride;
  const detail::WeightTensor* up = by_name.at(p + "experts.3.up_proj.weight");
  EXPECT_EQ(up->offset, third + 128u * 256);  // up's rows after gate's
  EXPECT_EQ(up->scale_offset, third + sparse.expert.gate_up_scale + 4 * 4);
  EXPECT_EQ(by_name.at(p + "experts.3.down_proj.weight")->scale_offset,
            third + sparse.expert.down_scale);
  EXPECT_EQ(by_name.at(p + "shared_expert.down_proj.weight")->offset, sparse.shared.down);
  // The dense MLP is not placed: every layer is sparse.
  EXPECT_EQ(by_name.count("model.layers.1.mlp.gate_proj.weight"), 0u);
}

TEST(MoeLayout, DummyCpuModelsOfEachFamilyLoad) {
  for (const char* family : {"qwen3_moe", "mixtral", "qwen2_moe"}) {
    const ModelConfig c = testing::tiny_moe_config(family);
    CpuModelOptions options;
    options.limits = {.max_step_tokens = 8, .max_chunks = 1};
    options.weights.format = LoadFormat::kDummy;
    auto made = make_cpu_model(c, ModelWeights{}, options);
    ASSERT_TRUE(made.ok()) << family << ": " << made.status().to_string();
    const WeightStats stats = (*made)->weight_stats();
    EXPECT_EQ(stats.split.sizes.experts, c.moe.experts) << family;
    EXPECT_GE(stats.physical_bytes, stats.split.sizes.total()) << family;
  }
}

}  // namespace
}  // namespace kvvm::model
