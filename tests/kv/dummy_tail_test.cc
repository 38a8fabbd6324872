// DummyTail on its own: one zeroed read-only granule, billed once, mapped anywhere, all or
// nothing.
#include "kv/dummy_tail.h"

#include <gtest/gtest.h>

#include <vector>

#include "support/vmm_fixture.h"

namespace kvvm {
namespace {

class DummyTailTest : public testing::VmmFixture {};

TEST_F(DummyTailTest, OneZeroedReadOnlyGranuleBilledOnce) {
  auto dummy = DummyTail::create(*pool_, governor_, tier_, std::chrono::milliseconds(0));
  ASSERT_TRUE(dummy.ok()) << dummy.status().to_string();
  EXPECT_EQ((*dummy)->bytes(), g_);
  EXPECT_EQ(used(), g_);
  const auto blocks = (*dummy)->home().blocks();
  ASSERT_EQ(blocks.size(), 1u);
  EXPECT_EQ(blocks.front().handle, (*dummy)->handle());
  EXPECT_EQ(blocks.front().access, Access::kReadOnly);

  auto target = Reservation::create(*pool_, 4 * g_);
  ASSERT_TRUE(target.ok());
  ASSERT_TRUE((*dummy)->map(**target, {Range{g_, 2 * g_}, Range{0, g_}}).ok());
  EXPECT_EQ((*target)->mapped_bytes(), 3 * g_);
  EXPECT_EQ((*target)->mappings_of((*dummy)->handle()), 3u);
  EXPECT_EQ((*target)->distinct_handle_bytes(), g_);  // three mappings of one granule
  EXPECT_EQ(used(), g_) << "mapping the page again costs nothing";
  std::vector<std::uint8_t> seen(g_, 0xff);
  ASSERT_TRUE(fault_->read(seen.data(), (*target)->base() + 2 * g_, g_).ok());
  EXPECT_EQ(seen, std::vector<std::uint8_t>(g_, 0));
  ASSERT_TRUE((*target)->release(0, 3 * g_).ok());
}

TEST_F(DummyTailTest, AFailedMapWithdrawsWhatTheCallMapped) {
  auto dummy = DummyTail::create(*pool_, governor_, tier_, std::chrono::milliseconds(0));
  ASSERT_TRUE(dummy.ok()) << dummy.status().to_string();
  auto target = Reservation::create(*pool_, 4 * g_);
  ASSERT_TRUE(target.ok());
  fault_->fail_nth(DriverOp::kMap, 3);
  Status mapped = (*dummy)->map(**target, {Range{0, 4 * g_}});
  fault_->clear();
  EXPECT_FALSE(mapped.ok());
  EXPECT_EQ((*target)->mapped_bytes(), 0u) << "the two windows mapped first are withdrawn";
  EXPECT_EQ((*target)->mappings_of((*dummy)->handle()), 0u);
  EXPECT_EQ(pool_->describe((*dummy)->handle())->mappings, 1u) << "only its home maps it";
}

TEST_F(DummyTailTest, CreationFailsWithoutBudgetAndLeavesNothingCharged) {
  Governor tight;
  const TierId tier = tight.add_tier("tight", 0);
  HandlePool pool(*fault_, PoolOptions{}, &tight, tier);
  auto dummy = DummyTail::create(pool, tight, tier, std::chrono::milliseconds(0));
  ASSERT_FALSE(dummy.ok());
  EXPECT_EQ(dummy.status().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(tight.stats(tier).used, 0u);
}

}  // namespace
}  // namespace kvvm
