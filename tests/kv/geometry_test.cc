// Geometry: the KV shape's arithmetic and the dtypes. Reading a shape from a config.json or a
// built-in model's name is the model layer's (model_config_geometry_test.cc).
#include "kvvm/kv/geometry.h"

#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "support/text_match.h"

namespace kvvm {
namespace {

using test::contains;

TEST(Geometry, DtypeScalesBytesPerToken) {
  // llama-3-8b's shape: 32 layers, 8 KV heads of 128.
  const auto in = [](DType dtype) { return Geometry{"llama-3-8b", 32, 8, 128, dtype}; };
  const std::uint64_t fp16 = in(DType::kFp16).bytes_per_token();
  EXPECT_EQ(fp16, 131'072u) << "L * 2 * H * D * 2";
  EXPECT_EQ(in(DType::kBf16).bytes_per_token(), fp16);
  EXPECT_EQ(in(DType::kFp8).bytes_per_token(), fp16 / 2);
  EXPECT_EQ(in(DType::kFp32).bytes_per_token(), fp16 * 2);
}

TEST(Geometry, DtypeNamesParseAndRoundTrip) {
  const std::vector<std::pair<std::string, DType>> cases = {
      {"fp16", DType::kFp16},           {"float16", DType::kFp16},  {"half", DType::kFp16},
      {"bf16", DType::kBf16},           {"bfloat16", DType::kBf16}, {"BF16", DType::kBf16},
      {"torch.bfloat16", DType::kBf16}, {"fp8", DType::kFp8},       {"float8", DType::kFp8},
      {"float8_e4m3fn", DType::kFp8},   {"fp32", DType::kFp32},     {"float32", DType::kFp32},
      {"float", DType::kFp32},
  };
  for (const auto& [text, dtype] : cases) {
    Result<DType> parsed = parse_dtype(text);
    ASSERT_TRUE(parsed.ok()) << text << ": " << parsed.status().to_string();
    EXPECT_EQ(*parsed, dtype) << text;
  }
  for (DType dtype : {DType::kFp16, DType::kBf16, DType::kFp8, DType::kFp32}) {
    EXPECT_EQ(*parse_dtype(to_string(dtype)), dtype);
  }
  EXPECT_EQ(element_bytes(DType::kFp8), 1u);
  EXPECT_EQ(element_bytes(DType::kFp32), 4u);
}

TEST(Geometry, UnknownDtypeIsRefusedWithTheKnownNames) {
  for (const std::string text : {"", "int8", "fp64", "float16x"}) {
    Result<DType> parsed = parse_dtype(text);
    ASSERT_FALSE(parsed.ok()) << text;
    EXPECT_EQ(parsed.status().code(), StatusCode::kInvalidArgument);
    EXPECT_TRUE(contains(parsed.status().message(), "'" + text + "'"));
    EXPECT_TRUE(contains(parsed.status().message(), "bf16")) << parsed.status().message();
  }
}

}  // namespace
}  // namespace kvvm
