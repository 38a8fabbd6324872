// ArenaStack: the governor tier, handle pool and arena assembled in one place. What it must
// do beyond Arena's own tests: charge its own tier, refuse a budget of 0 by name, and leave
// nothing in the driver on failure or after teardown.
#include "kvvm/kv/arena_stack.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "kvvm/kv/layout.h"
#include "kvvm/vmm/fault_driver.h"
#include "kvvm/vmm/host_driver.h"

namespace kvvm::arena_stack_test {
namespace {

constexpr std::size_t kGranule = 64 << 10;

std::unique_ptr<Driver> host() {
  auto driver = make_host_driver({.granule = kGranule});
  EXPECT_TRUE(driver.ok()) << driver.status().to_string();
  return std::move(driver).value();
}

LayoutPlan plan_for(std::uint64_t granule) {
  auto plan = plan_layout(Geometry{"stack-test", 2, 2, 64, DType::kFp16}, Layout::kTokenMajor,
                          granule, 1024);
  EXPECT_TRUE(plan.ok()) << plan.status().to_string();
  return *plan;
}

bool driver_empty(const Driver& driver) {
  const HostDriverTables t = host_driver_tables(driver);
  return t.reservations == 0 && t.handles == 0 && t.mappings == 0;
}

TEST(ArenaStack, ChargesItsOwnTierUpToTheBudget) {
  auto driver = host();
  const LayoutPlan plan = plan_for(kGranule);
  const std::uint64_t slot_floor = plan.fragments * kGranule;  // one window per fragment
  auto stack = ArenaStack::create(
      *driver, ArenaStackOptions{.tier_name = "stack kv",
                                 .budget_bytes = slot_floor,
                                 .pool = PoolOptions{.max_pooled_bytes = 0},
                                 .arena = ArenaOptions{.plan = plan, .max_slots = 2}});
  ASSERT_TRUE(stack.ok()) << stack.status().to_string();
  ArenaStack& s = **stack;
  EXPECT_EQ(s.governor().stats(s.tier()).name, "stack kv");
  EXPECT_EQ(s.governor().stats(s.tier()).limit, slot_floor);

  auto first = s.arena().admit(1);
  ASSERT_TRUE(first.ok()) << first.status().to_string();
  EXPECT_EQ(s.governor().stats(s.tier()).used, slot_floor);
  EXPECT_EQ(s.arena().stats().committed_bytes, slot_floor);
  // The budget holds one sequence's first windows, not two.
  auto second = s.arena().admit(1);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), StatusCode::kResourceExhausted);
  ASSERT_TRUE(s.arena().release(*first).ok());
}

TEST(ArenaStack, RefusesABudgetOfZeroNamingTheTier) {
  auto driver = host();
  auto stack = ArenaStack::create(
      *driver,
      ArenaStackOptions{.tier_name = "empty",
                        .budget_bytes = 0,
                        .arena = ArenaOptions{.plan = plan_for(kGranule), .max_slots = 1}});
  ASSERT_FALSE(stack.ok());
  EXPECT_EQ(stack.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(stack.status().message().find("budget_bytes 0"), std::string::npos);
  EXPECT_NE(stack.status().message().find("'empty'"), std::string::npos);
  EXPECT_TRUE(driver_empty(*driver));
}

TEST(ArenaStack, AFailedArenaLeavesNothingInTheDriver) {
  auto driver = host();
  // A plan for another granule: Arena::create refuses it after the tier and pool exist.
  auto mismatched = ArenaStack::create(
      *driver,
      ArenaStackOptions{.budget_bytes = 1 << 20,
                        .arena = ArenaOptions{.plan = plan_for(2 * kGranule), .max_slots = 1}});
  ASSERT_FALSE(mismatched.ok());
  EXPECT_NE(mismatched.status().message().find("creating the arena"), std::string::npos)
      << mismatched.status().to_string();
  EXPECT_TRUE(driver_empty(*driver));

  // The address reservation fails: the same.
  FaultDriver faulty(*driver);
  faulty.fail_nth(DriverOp::kReserve, 1);
  auto refused = ArenaStack::create(
      faulty, ArenaStackOptions{.budget_bytes = 1 << 20,
                                .arena = ArenaOptions{.plan = plan_for(kGranule), .max_slots = 1}});
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(faulty.injected(), 1u);
  EXPECT_TRUE(driver_empty(*driver));
}

TEST(ArenaStack, TeardownReturnsEveryHandleAndAddress) {
  auto driver = host();
  {
    auto stack = ArenaStack::create(
        *driver,
        ArenaStackOptions{.budget_bytes = 8 << 20,
                          .arena = ArenaOptions{.plan = plan_for(kGranule), .max_slots = 2}});
    ASSERT_TRUE(stack.ok()) << stack.status().to_string();
    auto slot = (*stack)->arena().admit(200);
    ASSERT_TRUE(slot.ok()) << slot.status().to_string();
    // A finished sequence's windows stay mapped (and pooled handles stay created) until the
    // stack goes: teardown must give them all back.
    ASSERT_TRUE((*stack)->arena().finish(*slot).ok());
    EXPECT_FALSE(driver_empty(*driver));
  }
  EXPECT_TRUE(driver_empty(*driver));
}

}  // namespace
}  // namespace kvvm::arena_stack_test
