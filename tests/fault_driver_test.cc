#include "kvvm/fault_driver.h"

#include <gtest/gtest.h>

#include "kvvm/host_driver.h"

namespace kvvm {
namespace {

class FaultDriverTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto host = make_host_driver();
    ASSERT_TRUE(host.ok()) << host.status().to_string();
    host_ = std::move(host).value();
    fault_ = std::make_unique<FaultDriver>(*host_);
  }
  std::unique_ptr<Driver> host_;
  std::unique_ptr<FaultDriver> fault_;
};

TEST_F(FaultDriverTest, FailsTheKthCallOfAnOpAndNothingHappensBeneath) {
  const std::size_t granule = fault_->granule();
  fault_->fail_nth(DriverOp::kCreate, 2);
  auto first = fault_->create(granule);
  ASSERT_TRUE(first.ok());
  auto second = fault_->create(granule);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), StatusCode::kDriverError);
  EXPECT_EQ(second.status().driver_failure()->error_name, "KVVM_INJECTED_FAULT");
  EXPECT_EQ(second.status().driver_failure()->call, "create");
  auto third = fault_->create(granule);
  ASSERT_TRUE(third.ok());
  EXPECT_EQ(fault_->injected(), 1u);
  // The failed call never reached the host driver.
  EXPECT_EQ(host_->counts().of(DriverOp::kCreate), 2u);
  EXPECT_EQ(fault_->counts().of(DriverOp::kCreate), 3u);
  EXPECT_EQ(fault_->counts().failed(DriverOp::kCreate), 1u);
  EXPECT_EQ(host_driver_tables(*host_).handles, 2u);
  ASSERT_TRUE(fault_->release(*first).ok());
  ASSERT_TRUE(fault_->release(*third).ok());
}

TEST_F(FaultDriverTest, FailsTheKthCallOfAnyKind) {
  const std::size_t granule = fault_->granule();
  fault_->fail_nth_call(3);
  auto base = fault_->reserve(granule);
  ASSERT_TRUE(base.ok());
  auto handle = fault_->create(granule);
  ASSERT_TRUE(handle.ok());
  EXPECT_FALSE(fault_->map(*base, granule, *handle, 0).ok());  // third call
  EXPECT_TRUE(fault_->map(*base, granule, *handle, 0).ok());
  EXPECT_TRUE(fault_->unmap(*base, granule).ok());
  EXPECT_TRUE(fault_->release(*handle).ok());
  EXPECT_TRUE(fault_->free(*base, granule).ok());
}

TEST_F(FaultDriverTest, FractionIsSeededAndReproducible) {
  auto run = [&](std::uint64_t seed) {
    fault_->clear();
    fault_->fail_fraction(DriverOp::kSynchronize, 0.3, seed);
    std::vector<bool> outcomes;
    for (int i = 0; i < 200; ++i) outcomes.push_back(fault_->synchronize().ok());
    return outcomes;
  };
  const auto a = run(42);
  const auto b = run(42);
  EXPECT_EQ(a, b);
  const auto failures = std::count(a.begin(), a.end(), false);
  EXPECT_GT(failures, 30);
  EXPECT_LT(failures, 100);
  fault_->clear();
  for (int i = 0; i < 50; ++i) EXPECT_TRUE(fault_->synchronize().ok());
}

}  // namespace
}  // namespace kvvm
