#include "kvvm/vmm/handle_pool.h"

#include <gtest/gtest.h>

#include "kvvm/vmm/fault_driver.h"
#include "kvvm/vmm/host_driver.h"
#include "support/backends.h"

namespace kvvm {
namespace {

template <typename Backend>
class HandlePoolTest : public ::testing::Test {
 protected:
  void SetUp() override {
    KVVM_MAKE_DRIVER_OR_SKIP(Backend, real_);
    fault_ = std::make_unique<FaultDriver>(*real_);
    g_ = real_->granule();
    tier_ = governor_.add_tier("pool", 64 * g_);
  }
  std::unique_ptr<HandlePool> make_pool(std::uint64_t max_pooled_granules) {
    return std::make_unique<HandlePool>(
        *fault_, PoolOptions{.max_pooled_bytes = max_pooled_granules * g_}, &governor_, tier_);
  }
  std::unique_ptr<Driver> real_;
  std::unique_ptr<FaultDriver> fault_;
  std::size_t g_ = 0;
  Governor governor_;
  TierId tier_ = 0;
};
TYPED_TEST_SUITE(HandlePoolTest, testing::AllBackends, testing::BackendNames);

TYPED_TEST(HandlePoolTest, CheckoutCreatesThenReusesAndChargesOnce) {
  auto pool = this->make_pool(8);
  for (std::size_t granules : {1u, 2u, 5u, 64u}) {
    SCOPED_TRACE(granules);
    const std::size_t bytes = granules * this->g_;
    Grant grant = *this->governor_.prepare(this->tier_, bytes);
    auto handle = pool->checkout(bytes, &grant);
    ASSERT_TRUE(handle.ok()) << handle.status().to_string();
    grant.commit_charged();
    EXPECT_EQ(this->governor_.stats(this->tier_).used, bytes);
    auto info = pool->describe(*handle);
    ASSERT_TRUE(info.ok());
    EXPECT_EQ(info->state, HandleState::kInUse);
    EXPECT_EQ(info->bytes, bytes);
    pool->give_back(*handle);
    // Above the bound (8 granules) the handle is released at once.
    const bool kept = bytes <= 8 * this->g_;
    EXPECT_EQ(pool->snapshot().pooled_bytes, kept ? bytes : 0u);
    EXPECT_EQ(this->governor_.stats(this->tier_).used, kept ? bytes : 0u);
    if (kept) {
      auto again = pool->checkout(bytes, nullptr);  // a hit needs no grant
      ASSERT_TRUE(again.ok()) << again.status().to_string();
      EXPECT_EQ(*again, *handle);
      pool->give_back(*again);
      EXPECT_GE(pool->snapshot().pool_hits, 1u);
      EXPECT_EQ(pool->trim(UINT64_MAX), bytes);
    }
    EXPECT_EQ(this->governor_.stats(this->tier_).used, 0u);
    EXPECT_EQ(pool->snapshot().owned_bytes, 0u);
  }
  const PoolSnapshot snapshot = pool->snapshot();
  EXPECT_EQ(snapshot.creates, 4u);
  EXPECT_EQ(snapshot.releases, 4u);
}

TYPED_TEST(HandlePoolTest, MappingCountReturnsTheHandleOnlyAtTheLastUnmap) {
  auto pool = this->make_pool(8);
  Grant grant = *this->governor_.prepare(this->tier_, this->g_);
  auto handle = pool->checkout(this->g_, &grant);
  ASSERT_TRUE(handle.ok());
  grant.commit_charged();
  pool->note_mapped(*handle);
  pool->note_mapped(*handle);
  pool->note_mapped(*handle);
  EXPECT_EQ(pool->describe(*handle)->mappings, 3u);
  pool->note_unmapped(*handle);
  pool->note_unmapped(*handle);
  EXPECT_EQ(pool->describe(*handle)->state, HandleState::kInUse);
  pool->note_unmapped(*handle);
  EXPECT_EQ(pool->describe(*handle)->state, HandleState::kPooled);
  EXPECT_EQ(pool->snapshot().mapped_bytes, 0u);
  EXPECT_EQ(pool->snapshot().pooled_bytes, this->g_);
}

TYPED_TEST(HandlePoolTest, AFailedReleaseQuarantinesAndStaysCharged) {
  auto pool = this->make_pool(0);  // every returned handle is released
  Grant grant = *this->governor_.prepare(this->tier_, 2 * this->g_);
  auto a = pool->checkout(this->g_, &grant);
  auto b = pool->checkout(this->g_, &grant);
  ASSERT_TRUE(a.ok() && b.ok());
  grant.commit_charged();
  this->fault_->fail_nth(DriverOp::kRelease, 1);
  pool->give_back(*a);
  const PoolSnapshot snapshot = pool->snapshot();
  EXPECT_EQ(snapshot.release_failures, 1u);
  EXPECT_EQ(snapshot.handles_quarantined, 1u);
  EXPECT_EQ(snapshot.quarantined_bytes, this->g_);
  EXPECT_EQ(pool->describe(*a)->state, HandleState::kQuarantined);
  EXPECT_EQ(this->governor_.stats(this->tier_).used, 2 * this->g_) << "still charged";
  // Never reused: the next checkout creates.
  Grant more = *this->governor_.prepare(this->tier_, this->g_);
  auto c = pool->checkout(this->g_, &more);
  ASSERT_TRUE(c.ok());
  more.commit_charged();
  EXPECT_NE(*c, *a);
  EXPECT_EQ(pool->snapshot().creates, 3u);
  pool->give_back(*b);
  pool->give_back(*c);
  EXPECT_EQ(pool->trim(UINT64_MAX), 0u) << "quarantined handles are not trimmed";
  EXPECT_EQ(this->governor_.stats(this->tier_).used, this->g_);
}

TYPED_TEST(HandlePoolTest, FailedCreateReturnsTheChargeAndCreatesNothing) {
  auto pool = this->make_pool(8);
  Grant grant = *this->governor_.prepare(this->tier_, this->g_);
  this->fault_->fail_nth(DriverOp::kCreate, 1);
  auto handle = pool->checkout(this->g_, &grant);
  ASSERT_FALSE(handle.ok());
  EXPECT_EQ(handle.status().code(), StatusCode::kDriverError);
  EXPECT_EQ(grant.charged(), 0u);
  grant.commit_charged();
  EXPECT_EQ(this->governor_.stats(this->tier_).used, 0u);
  EXPECT_EQ(pool->snapshot().owned_bytes, 0u);
}

TYPED_TEST(HandlePoolTest, TheGovernorReclaimsPooledHandlesBeforeRefusing) {
  auto pool = this->make_pool(64);
  std::vector<Handle> handles;
  Grant grant = *this->governor_.prepare(this->tier_, 64 * this->g_);
  for (int i = 0; i < 64; ++i) handles.push_back(*pool->checkout(this->g_, &grant));
  grant.commit_charged();
  for (Handle handle : handles) pool->give_back(handle);
  EXPECT_EQ(this->governor_.stats(this->tier_).used, 64 * this->g_);
  // The tier is full of pooled handles; a big request succeeds because the pool trims.
  auto big = this->governor_.prepare(this->tier_, 10 * this->g_);
  ASSERT_TRUE(big.ok()) << big.status().to_string();
  EXPECT_LE(pool->snapshot().pooled_bytes, 54 * this->g_);
  EXPECT_GE(this->governor_.stats(this->tier_).reclaimed, 10 * this->g_);
}

TYPED_TEST(HandlePoolTest, BadSizesAreRefused) {
  auto pool = this->make_pool(8);
  Grant grant = *this->governor_.prepare(this->tier_, this->g_);
  for (std::size_t bytes : {std::size_t{0}, this->g_ + 1, this->g_ / 2}) {
    auto handle = pool->checkout(bytes, &grant);
    ASSERT_FALSE(handle.ok());
    EXPECT_EQ(handle.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(handle.status().message().find(std::to_string(bytes)), std::string::npos);
  }
  EXPECT_EQ(pool->snapshot().creates, 0u);
  EXPECT_EQ(pool->describe(12345).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kvvm
