// The one byte formatter and parser (kvvm/base/bytes.h) and the one element type
// (kvvm/base/dtype.h).
#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "kvvm/base/bytes.h"
#include "kvvm/base/dtype.h"
#include "kvvm/kv/geometry.h"
#include "kvvm/kv/layout.h"
#include "kvvm/model/kv_config.h"

namespace kvvm {
namespace {

TEST(Bytes, FormatsBinaryUnits) {
  EXPECT_EQ(format_bytes(0), "0 B");
  EXPECT_EQ(format_bytes(123), "123 B");
  EXPECT_EQ(format_bytes(1023), "1023 B");
  EXPECT_EQ(format_bytes(4096), "4 KiB");
  EXPECT_EQ(format_bytes(1536), "1.50 KiB");
  EXPECT_EQ(format_bytes(2ull << 20), "2 MiB");
  EXPECT_EQ(format_bytes(1ull << 60), "1 EiB");
  EXPECT_EQ(format_bytes(UINT64_MAX), "16.00 EiB");
}

TEST(Bytes, ExactMultiplesRoundTrip) {
  for (std::uint64_t unit : {1ull, 1ull << 10, 1ull << 20, 1ull << 30, 1ull << 40}) {
    for (std::uint64_t n : {0ull, 1ull, 2ull, 3ull, 512ull, 1000ull, 1023ull}) {
      const std::uint64_t bytes = n * unit;
      const std::string text = format_bytes(bytes);
      Result<std::uint64_t> parsed = parse_byte_size(text);
      ASSERT_TRUE(parsed.ok()) << text << ": " << parsed.status().to_string();
      EXPECT_EQ(*parsed, bytes) << text;
    }
  }
}

TEST(Bytes, FractionsDoNotParseBack) {
  const std::string text = format_bytes(1536);
  Result<std::uint64_t> parsed = parse_byte_size(text);
  ASSERT_FALSE(parsed.ok());
  EXPECT_NE(parsed.status().message().find("'" + text + "'"), std::string::npos)
      << parsed.status().message();
}

TEST(DType, OneSizeTableAndNames) {
  EXPECT_EQ(element_bytes(DType::kFp16), 2u);
  EXPECT_EQ(element_bytes(DType::kBf16), 2u);
  EXPECT_EQ(element_bytes(DType::kFp8), 1u);
  EXPECT_EQ(element_bytes(DType::kFp32), 4u);
  EXPECT_EQ(element_bytes(DType::kUnset), 0u);
  static_assert(element_bytes(DType::kFp32) == 4);  // usable in constant expressions
  for (DType d : {DType::kFp16, DType::kBf16, DType::kFp8, DType::kFp32}) {
    Result<DType> parsed = parse_dtype(to_string(d));
    ASSERT_TRUE(parsed.ok()) << to_string(d);
    EXPECT_EQ(*parsed, d);
  }
  EXPECT_FALSE(parse_dtype("unset").ok());
}

TEST(DType, TheViewCarriesTheGeometrysType) {
  for (DType d : {DType::kFp16, DType::kBf16, DType::kFp8, DType::kFp32}) {
    Result<Geometry> g = model::builtin_geometry("qwen2.5-0.5b", d);
    ASSERT_TRUE(g.ok());
    Result<LayoutPlan> plan = plan_layout(*g, Layout::kHeadMajor, 2 << 20, 1024);
    ASSERT_TRUE(plan.ok()) << plan.status().to_string();
    const KvView view = plan->view(0);
    EXPECT_EQ(view.element, d);
    EXPECT_EQ(view.element_bytes, element_bytes(d));
  }
}

}  // namespace
}  // namespace kvvm
