#include "kvvm/base/status.h"

#include <gtest/gtest.h>

namespace kvvm {
namespace {

TEST(Status, OkByDefault) {
  Status status;
  EXPECT_TRUE(status.ok());
  EXPECT_EQ(status.code(), StatusCode::kOk);
  EXPECT_EQ(status.to_string(), "OK");
}

TEST(Status, ResourceExhaustedCarriesNumbers) {
  Status status = Status::ResourceExhausted("tier 'gpu0' short", Exhaustion{10, 4, 16});
  EXPECT_FALSE(status.ok());
  ASSERT_TRUE(status.exhaustion().has_value());
  EXPECT_EQ(status.exhaustion()->requested, 10u);
  EXPECT_EQ(status.exhaustion()->available, 4u);
  EXPECT_EQ(status.exhaustion()->limit, 16u);
  EXPECT_EQ(status.to_string(), "RESOURCE_EXHAUSTED: tier 'gpu0' short");
}

TEST(Status, DriverErrorCarriesCallAndName) {
  Status status = Status::DriverError("map failed", {"cuMemMap", "CUDA_ERROR_INVALID_VALUE", 1});
  ASSERT_TRUE(status.driver_failure().has_value());
  EXPECT_EQ(status.driver_failure()->call, "cuMemMap");
  EXPECT_EQ(status.driver_failure()->error_name, "CUDA_ERROR_INVALID_VALUE");
  EXPECT_EQ(status.code(), StatusCode::kDriverError);
}

TEST(Status, ContextKeepsCodeAndNumbers) {
  Status status = Status::ResourceExhausted("short", Exhaustion{1, 2, 3}).with_context("commit");
  EXPECT_EQ(status.code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(status.message(), "commit: short");
  EXPECT_EQ(status.exhaustion()->limit, 3u);
  EXPECT_TRUE(Status::Ok().with_context("x").ok());
}

TEST(Status, EveryCodeHasAName) {
  EXPECT_EQ(Status::InvalidArgument("a").to_string(), "INVALID_ARGUMENT: a");
  EXPECT_EQ(Status::FailedPrecondition("b").to_string(), "FAILED_PRECONDITION: b");
  EXPECT_EQ(Status::Unavailable("c").to_string(), "UNAVAILABLE: c");
  EXPECT_EQ(Status::Internal("d").to_string(), "INTERNAL: d");
}

Result<int> half(int value) {
  if (value % 2 != 0) return Status::InvalidArgument(std::to_string(value) + " is odd");
  return value / 2;
}

TEST(Result, HoldsValueOrStatus) {
  Result<int> good = half(8);
  ASSERT_TRUE(good.ok());
  EXPECT_EQ(*good, 4);
  EXPECT_TRUE(good.status().ok());
  Result<int> bad = half(3);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message(), "3 is odd");
}

TEST(Result, OkStatusWithoutValueIsInternal) {
  Result<int> broken = Status::Ok();
  EXPECT_FALSE(broken.ok());
  EXPECT_EQ(broken.status().code(), StatusCode::kInternal);
}

}  // namespace
}  // namespace kvvm
