#include "kvvm/vmm/fault_driver.h"

#include <gtest/gtest.h>

#include "kvvm/vmm/host_driver.h"

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

TEST_F(FaultDriverTest, ACopyIsInFlightUntilAFenceAfterItOnItsStreamCompletes) {
  const std::size_t g = fault_->granule();
  auto base = fault_->reserve(2 * g);
  ASSERT_TRUE(base.ok());
  auto a = fault_->create(g);
  auto b = fault_->create(g);
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_TRUE(fault_->map(*base, g, *a, 0).ok());
  ASSERT_TRUE(fault_->map(*base + g, g, *b, 0).ok());
  ASSERT_TRUE(fault_->set_access(*base, 2 * g, Access::kReadWrite).ok());
  const auto other_stream = reinterpret_cast<Stream>(std::uintptr_t{0x10});

  // A fence recorded before the copy does not cover it; one on another stream neither.
  auto before = fault_->record_fence(nullptr);
  ASSERT_TRUE(before.ok());
  ASSERT_TRUE(fault_->copy(*base + g, *base, g, nullptr).ok());
  EXPECT_EQ(fault_->copies_in_flight(), 1u);
  ASSERT_TRUE(fault_->wait_fence(*before).ok());
  EXPECT_EQ(fault_->copies_in_flight(), 1u);
  auto elsewhere = fault_->record_fence(other_stream);
  ASSERT_TRUE(elsewhere.ok());
  ASSERT_TRUE(fault_->wait_fence(*elsewhere).ok());
  EXPECT_EQ(fault_->copies_in_flight(), 1u);
  // A failed wait, or a held fence, leaves it running.
  auto after = fault_->record_fence(nullptr);
  ASSERT_TRUE(after.ok());
  fault_->fail_nth(DriverOp::kFence, 1);
  EXPECT_FALSE(fault_->wait_fence(*after).ok());
  EXPECT_EQ(fault_->copies_in_flight(), 1u);
  fault_->hold_fences(true);
  auto held = fault_->record_fence(nullptr);
  ASSERT_TRUE(held.ok());
  EXPECT_FALSE(*fault_->fence_done(*held));
  EXPECT_EQ(fault_->copies_in_flight(), 1u);
  fault_->hold_fences(false);

  // Unmapping either side now is a violation, named, and still carried out.
  ASSERT_TRUE(fault_->unmap(*base, g).ok());
  const auto violations = fault_->in_flight_violations();
  ASSERT_EQ(violations.size(), 1u);
  EXPECT_NE(violations[0].find("still reads it"), std::string::npos) << violations[0];

  // A fence after it that completes ends it: unmapping is fine from then on.
  Result<bool> done = fault_->fence_done(*after);
  ASSERT_TRUE(done.ok());
  EXPECT_TRUE(*done);
  EXPECT_EQ(fault_->copies_in_flight(), 0u);
  ASSERT_TRUE(fault_->unmap(*base + g, g).ok());
  EXPECT_EQ(fault_->in_flight_violations().size(), 1u);
  for (Fence f : {*before, *elsewhere, *after, *held}) ASSERT_TRUE(fault_->destroy_fence(f).ok());
  ASSERT_TRUE(fault_->release(*a).ok());
  ASSERT_TRUE(fault_->release(*b).ok());
  ASSERT_TRUE(fault_->free(*base, 2 * g).ok());
}

TEST_F(FaultDriverTest, SynchronizeEndsEveryCopyAndADelayRunsBeforeEach) {
  const std::size_t g = fault_->granule();
  auto base = fault_->reserve(2 * g);
  ASSERT_TRUE(base.ok());
  auto a = fault_->create(2 * g);
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(fault_->map(*base, 2 * g, *a, 0).ok());
  ASSERT_TRUE(fault_->set_access(*base, 2 * g, Access::kReadWrite).ok());
  int delayed = 0;
  fault_->delay_copies([&](Stream) {
    ++delayed;
    return delayed == 2 ? Status::Unavailable("the stream is busy") : Status::Ok();
  });
  ASSERT_TRUE(fault_->copy(*base + g, *base, g, nullptr).ok());
  EXPECT_FALSE(fault_->copy(*base + g, *base, g, nullptr).ok()) << "the delay's error stops it";
  EXPECT_EQ(delayed, 2);
  EXPECT_EQ(fault_->copies_in_flight(), 1u);
  fault_->delay_copies(nullptr);
  ASSERT_TRUE(fault_->synchronize().ok());
  EXPECT_EQ(fault_->copies_in_flight(), 0u);
  ASSERT_TRUE(fault_->unmap(*base, 2 * g).ok());
  EXPECT_TRUE(fault_->in_flight_violations().empty());
  ASSERT_TRUE(fault_->release(*a).ok());
  ASSERT_TRUE(fault_->free(*base, 2 * g).ok());
}

}  // namespace
}  // namespace kvvm
