// The weights' layout of an FP8 checkpoint: the CUDA backend keeps the projections in e4m3 with
// their float32 scales in the layer block; the CPU backend's float32 layout is the unquantized
// one; the bytes by stored type add up to the layout's.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "kvvm/model/kv_config.h"
#include "kvvm/model/weight_memory.h"
#include "model/weights/weight_layout.h"

namespace kvvm::model {
namespace {

ModelConfig llama_8b(WeightQuant quant) {
  Result<ModelConfig> config = builtin_model_config("llama-3-8b");
  EXPECT_TRUE(config.ok()) << config.status().to_string();
  ModelConfig c = *config;
  c.weight_quant = quant;
  return c;
}

std::uint64_t bytes_of(const WeightSizes& sizes, const std::string& type) {
  for (const auto& [name, bytes] : sizes.bytes_by_type()) {
    if (name == type) return bytes;
  }
  return 0;
}

TEST(WeightLayoutFp8, CudaKeepsTheProjectionsInFp8WithTheirScalesAfterThem) {
  const ModelConfig c = llama_8b(WeightQuant::kFp8Block);
  const detail::WeightLayout layout = detail::weight_layout(c, DType::kBf16);
  EXPECT_EQ(layout.projection, DType::kFp8);
  const std::uint64_t hidden = 4096, q = 4096, kv = 1024, inter = 14336;
  EXPECT_EQ(layout.block.k, layout.block.q + q * hidden);  // one byte an element
  EXPECT_EQ(layout.block.v, layout.block.k + kv * hidden);
  EXPECT_EQ(layout.block.o, layout.block.q + (q + 2 * kv) * hidden);
  EXPECT_EQ(layout.block.gate_up, layout.block.o + hidden * q);
  EXPECT_EQ(layout.block.down, layout.block.gate_up + 2 * inter * hidden);
  // Scales: one per 128 x 128 block, q's, k's and v's in one run.
  EXPECT_EQ(layout.block.qkv_scale, layout.block.down + hidden * inter);
  EXPECT_EQ(layout.block.o_scale - layout.block.qkv_scale, (48 * 32 * 4 + 255) / 256 * 256);
  EXPECT_EQ(layout.block.down_scale - layout.block.gate_up_scale, 2 * 112 * 32 * 4u);
  const std::uint64_t scales = 48 * 32 + 32 * 32 + 2 * 112 * 32 + 32 * 112;
  EXPECT_EQ(layout.sizes.layer_scale_bytes, layout.sizes.layer_bytes - layout.block.qkv_scale);
  EXPECT_GE(layout.sizes.layer_scale_bytes, scales * 4);
  EXPECT_LT(layout.sizes.layer_scale_bytes, scales * 4 + 4 * 256);
  // Half the bf16 block, plus the scales.
  const detail::WeightLayout bf16 =
      detail::weight_layout(llama_8b(WeightQuant::kNone), DType::kBf16);
  EXPECT_EQ(bf16.block.qkv_scale, detail::kNoTensor);
  EXPECT_EQ(layout.block.qkv_scale * 2, bf16.sizes.layer_bytes);
  EXPECT_EQ(layout.sizes.base_bytes, bf16.sizes.base_bytes);
}

TEST(WeightLayoutFp8, PerChannelScalesAreOnePerRow) {
  const ModelConfig c = llama_8b(WeightQuant::kFp8Channel);
  const detail::WeightLayout layout = detail::weight_layout(c, DType::kFp16);
  EXPECT_EQ(layout.projection, DType::kFp8);
  EXPECT_EQ(layout.block.o_scale - layout.block.qkv_scale, (4096 + 2 * 1024) * 4u);
  EXPECT_EQ(layout.block.down_scale - layout.block.gate_up_scale, 2 * 14336 * 4u);
  EXPECT_EQ(detail::weight_scale_count(WeightQuant::kFp8Channel, 6144, 4096), 6144u);
  EXPECT_EQ(detail::weight_scale_count(WeightQuant::kFp8Block, 130, 129), 4u);  // partial blocks
  EXPECT_EQ(detail::weight_scale_count(WeightQuant::kNone, 130, 129), 0u);
}

TEST(WeightLayoutFp8, TheCpuBackendDequantizesSoItsLayoutIsTheUnquantizedOne) {
  const detail::WeightLayout fp8 =
      detail::weight_layout(llama_8b(WeightQuant::kFp8Block), DType::kFp32);
  const detail::WeightLayout plain =
      detail::weight_layout(llama_8b(WeightQuant::kNone), DType::kFp32);
  EXPECT_EQ(fp8.projection, DType::kFp32);
  EXPECT_EQ(fp8.sizes.layer_bytes, plain.sizes.layer_bytes);
  EXPECT_EQ(fp8.sizes.layer_scale_bytes, 0u);
  EXPECT_EQ(fp8.block.qkv_scale, detail::kNoTensor);
}

TEST(WeightLayoutFp8, BytesByTypeAddUpAndNameEachType) {
  const WeightSizes sizes = weight_sizes(llama_8b(WeightQuant::kFp8Block), DType::kBf16);
  std::uint64_t sum = 0;
  for (const auto& [type, bytes] : sizes.bytes_by_type()) sum += bytes;
  EXPECT_EQ(sum, sizes.total());
  EXPECT_EQ(bytes_of(sizes, "bf16"), sizes.base_bytes);
  EXPECT_EQ(bytes_of(sizes, "fp32"), 32 * sizes.layer_scale_bytes);
  EXPECT_EQ(bytes_of(sizes, "fp8"), 32 * (sizes.layer_bytes - sizes.layer_scale_bytes));
  EXPECT_EQ(sizes.bytes_by_type().front().first, "fp8");  // the largest first
  const std::string line = sizes.describe_types();
  EXPECT_EQ(line.find("fp8 "), 0u) << line;
  EXPECT_NE(line.find(", bf16 "), std::string::npos) << line;
  EXPECT_NE(line.find(", fp32 "), std::string::npos) << line;

  const WeightSizes plain = weight_sizes(llama_8b(WeightQuant::kNone), DType::kBf16);
  ASSERT_EQ(plain.bytes_by_type().size(), 1u);
  EXPECT_EQ(plain.bytes_by_type()[0].second, plain.total());
  auto split = plan_weight_split(plain, std::uint64_t{2} << 20, 0);
  ASSERT_TRUE(split.ok());
  EXPECT_NE(split->describe().find("resident [bf16 "), std::string::npos) << split->describe();
}

}  // namespace
}  // namespace kvvm::model
