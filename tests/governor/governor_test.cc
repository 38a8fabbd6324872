// Governor: tiers, grant arithmetic and refusals with numbers.
//
// No test asserts a wall-clock time: ordering is made deterministic by waiting for
// stats().waiting, and timeouts only bound how long a broken implementation can hang.
#include "kvvm/governor/governor.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "support/governor_access.h"
#include "support/governor_checks.h"

namespace kvvm {
namespace {

using std::chrono::milliseconds;
using testing::eventually;
using testing::expect_ledger;
using testing::kLongWait;
using testing::kMiB;

TEST(GovernorTest, TiersStartEmpty) {
  Governor g;
  EXPECT_EQ(g.tier_count(), 0u);
  const TierId a = g.add_tier("gpu0", 1000);
  const TierId b = g.add_tier("host", 2000);
  EXPECT_NE(a, b);
  EXPECT_EQ(g.tier_count(), 2u);
  const TierStats s = g.stats(b);
  EXPECT_EQ(s.name, "host");
  EXPECT_EQ(s.limit, 2000u);
  EXPECT_EQ(s.used + s.reserved + s.peak + s.grants + s.refusals + s.reclaimed, 0u);
  EXPECT_EQ(s.waiting, 0u);
}

TEST(GovernorTest, ChargeThenCommitSettlesExactly) {
  Governor g;
  const TierId t = g.add_tier("gpu0", 1000);
  Result<Grant> grant = g.prepare(t, 300);
  ASSERT_TRUE(grant.ok()) << grant.status().to_string();
  EXPECT_TRUE(grant->active());
  EXPECT_EQ(grant->prepared(), 300u);
  expect_ledger(g, t, 0, 300);

  ASSERT_TRUE(grant->charge(100).ok());
  EXPECT_EQ(grant->charged(), 100u);
  EXPECT_EQ(grant->remaining(), 200u);
  expect_ledger(g, t, 100, 200);

  ASSERT_TRUE(grant->commit(250).ok());
  EXPECT_FALSE(grant->active());
  expect_ledger(g, t, 250, 0);
  const TierStats s = g.stats(t);
  EXPECT_EQ(s.peak, 300u);
  EXPECT_EQ(s.grants, 1u);
  EXPECT_EQ(s.refusals, 0u);

  // A settled grant is inert: dropping it later changes nothing.
  { Grant moved = std::move(*grant); }
  expect_ledger(g, t, 250, 0);
}

TEST(GovernorTest, DroppedGrantRestoresExactly) {
  Governor g;
  const TierId t = g.add_tier("gpu0", 1000);
  ASSERT_TRUE(testing::charge_direct(g, t, 70).ok());
  const TierStats before = g.stats(t);
  {
    Result<Grant> grant = g.prepare(t, 500);
    ASSERT_TRUE(grant.ok());
    expect_ledger(g, t, 70, 500);
  }
  const TierStats after = g.stats(t);
  EXPECT_EQ(after.used, before.used);
  EXPECT_EQ(after.reserved, before.reserved);
  EXPECT_EQ(after.peak, 570u);

  // Dropped after a charge: the charged bytes stay used, the rest goes back.
  {
    Result<Grant> grant = g.prepare(t, 500);
    ASSERT_TRUE(grant.ok());
    ASSERT_TRUE(grant->charge(120).ok());
    ASSERT_TRUE(grant->charge(30).ok());
  }
  expect_ledger(g, t, 70 + 150, 0);
}

TEST(GovernorTest, CommitChargedSettlesAtCharged) {
  Governor g;
  const TierId t = g.add_tier("gpu0", 1000);
  Result<Grant> grant = g.prepare(t, 400);
  ASSERT_TRUE(grant.ok());
  ASSERT_TRUE(grant->charge(64).ok());
  grant->commit_charged();
  EXPECT_FALSE(grant->active());
  expect_ledger(g, t, 64, 0);
  grant->commit_charged();  // a second settle is a no-op
  expect_ledger(g, t, 64, 0);
}

TEST(GovernorTest, BadCommitIsInvalidArgumentAndChangesNothing) {
  Governor g;
  const TierId t = g.add_tier("gpu0", 1000);
  Result<Grant> grant = g.prepare(t, 400);
  ASSERT_TRUE(grant.ok());
  ASSERT_TRUE(grant->charge(100).ok());

  const Status below = grant->commit(99);  // less than charged
  EXPECT_EQ(below.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(below.message().find("99"), std::string::npos) << below.message();
  const Status above = grant->commit(401);  // more than prepared
  EXPECT_EQ(above.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(above.message().find("401"), std::string::npos) << above.message();

  EXPECT_TRUE(grant->active());
  EXPECT_EQ(grant->prepared(), 400u);
  EXPECT_EQ(grant->charged(), 100u);
  expect_ledger(g, t, 100, 300);

  ASSERT_TRUE(grant->commit(400).ok());  // the bounds themselves are valid
  expect_ledger(g, t, 400, 0);
  EXPECT_EQ(grant->commit(400).code(), StatusCode::kFailedPrecondition);  // already settled
  expect_ledger(g, t, 400, 0);
}

TEST(GovernorTest, OverchargeIsRefusedAndChangesNothing) {
  Governor g;
  const TierId t = g.add_tier("gpu0", 1000);
  Result<Grant> grant = g.prepare(t, 100);
  ASSERT_TRUE(grant.ok());
  ASSERT_TRUE(grant->charge(60).ok());
  const Status s = grant->charge(41);
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted);
  ASSERT_TRUE(s.exhaustion().has_value());
  EXPECT_EQ(s.exhaustion()->requested, 41u);
  EXPECT_EQ(s.exhaustion()->available, 40u);
  EXPECT_EQ(grant->charged(), 60u);
  expect_ledger(g, t, 60, 40);
  ASSERT_TRUE(grant->charge(40).ok());
  expect_ledger(g, t, 100, 0);
}

TEST(GovernorTest, MoveTransfersOwnership) {
  Governor g;
  const TierId t = g.add_tier("gpu0", 1000);
  Result<Grant> r = g.prepare(t, 200);
  ASSERT_TRUE(r.ok());
  Grant a = std::move(*r);
  EXPECT_FALSE(r->active());
  ASSERT_TRUE(a.active());
  ASSERT_TRUE(a.charge(50).ok());

  Grant b(std::move(a));
  EXPECT_FALSE(a.active());  // NOLINT(bugprone-use-after-move): testing the moved-from state
  EXPECT_EQ(a.charge(1).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(b.prepared(), 200u);
  EXPECT_EQ(b.charged(), 50u);
  expect_ledger(g, t, 50, 150);

  // Assigning over an active grant settles it like a drop, then takes the other.
  Result<Grant> r2 = g.prepare(t, 300);
  ASSERT_TRUE(r2.ok());
  expect_ledger(g, t, 50, 450);
  b = std::move(*r2);
  expect_ledger(g, t, 50, 300);
  EXPECT_EQ(b.prepared(), 300u);
  { Grant sink = std::move(b); }
  expect_ledger(g, t, 50, 0);
}

TEST(GovernorTest, ZeroBytesIsAValidEmptyGrant) {
  Governor g;
  const TierId t = g.add_tier("gpu0", 100);
  ASSERT_TRUE(testing::charge_direct(g, t, 100).ok());  // full
  Result<Grant> grant = g.prepare(t, 0);
  ASSERT_TRUE(grant.ok()) << grant.status().to_string();
  EXPECT_TRUE(grant->active());
  EXPECT_EQ(grant->prepared(), 0u);
  EXPECT_TRUE(grant->charge(0).ok());
  EXPECT_TRUE(grant->commit(0).ok());
  expect_ledger(g, t, 100, 0);
}

TEST(GovernorTest, RefusalCarriesExactNumbers) {
  Governor g;
  const TierId t = g.add_tier("gpu0", 8 * kMiB);
  ASSERT_TRUE(testing::charge_direct(g, t, 6 * kMiB).ok());
  Result<Grant> grant = g.prepare(t, 4 * kMiB);
  ASSERT_FALSE(grant.ok());
  const Status s = grant.status();
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted);
  ASSERT_TRUE(s.exhaustion().has_value());
  EXPECT_EQ(s.exhaustion()->requested, 4194304u);
  EXPECT_EQ(s.exhaustion()->available, 2097152u);
  EXPECT_EQ(s.exhaustion()->limit, 8388608u);
  EXPECT_NE(s.message().find("tier 'gpu0': requested 4194304 bytes, available 2097152 of limit "
                             "8388608 (used 6291456, reserved 0) after reclaiming 0 bytes"),
            std::string::npos)
      << s.message();
  const TierStats st = g.stats(t);
  EXPECT_EQ(st.refusals, 1u);
  EXPECT_EQ(st.grants, 0u);
  EXPECT_EQ(st.waiting, 0u);
  expect_ledger(g, t, 6 * kMiB, 0);
}

TEST(GovernorTest, LargerThanLimitIsRefusedAtOnceWithoutReclaim) {
  Governor g;
  const TierId t = g.add_tier("host", 100);
  int calls = 0;
  Governor::Registration reg = g.add_reclaimer(t, [&](std::uint64_t) {
    ++calls;
    return std::uint64_t{0};
  });
  // Never fits, so even a long wait must not block (a hang here fails by the guard below).
  Result<Grant> grant = g.prepare(t, 101, kLongWait);
  ASSERT_FALSE(grant.ok());
  EXPECT_EQ(grant.status().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(grant.status().exhaustion()->requested, 101u);
  EXPECT_EQ(grant.status().exhaustion()->limit, 100u);
  EXPECT_EQ(calls, 0);
  EXPECT_EQ(g.stats(t).refusals, 1u);
}

TEST(GovernorTest, UnknownTierIsInvalidArgument) {
  Governor g;
  (void)g.add_tier("a", 10);
  (void)g.add_tier("b", 10);
  Result<Grant> grant = g.prepare(7, 1);
  ASSERT_FALSE(grant.ok());
  EXPECT_EQ(grant.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(grant.status().message().find("7"), std::string::npos) << grant.status().message();
  EXPECT_NE(grant.status().message().find("2 tiers"), std::string::npos)
      << grant.status().message();
  EXPECT_EQ(testing::charge_direct(g, 2, 1).code(), StatusCode::kInvalidArgument);
}

TEST(GovernorTest, ChargeDirectRespectsTheLimit) {
  Governor g;
  const TierId t = g.add_tier("host", 100);
  Result<Grant> grant = g.prepare(t, 30);
  ASSERT_TRUE(grant.ok());
  ASSERT_TRUE(testing::charge_direct(g, t, 70).ok());  // exactly fills: used 70 + reserved 30
  const Status s = testing::charge_direct(g, t, 1);
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted);
  ASSERT_TRUE(s.exhaustion().has_value());
  EXPECT_EQ(s.exhaustion()->requested, 1u);
  EXPECT_EQ(s.exhaustion()->available, 0u);
  EXPECT_EQ(s.exhaustion()->limit, 100u);
  expect_ledger(g, t, 70, 30);
  EXPECT_EQ(g.stats(t).peak, 100u);
}

TEST(GovernorTest, ReturnBytesMoreThanUsedClampsCountsAndReports) {
  Governor g;
  const TierId t = g.add_tier("gpu0", 100);
  ASSERT_TRUE(testing::charge_direct(g, t, 10).ok());
  g.return_bytes(t, 4);
  expect_ledger(g, t, 6, 0);
  EXPECT_EQ(g.stats(t).excess_returns, 0u);

  ::testing::internal::CaptureStderr();
  g.return_bytes(t, 20);
  const std::string err = ::testing::internal::GetCapturedStderr();
  expect_ledger(g, t, 0, 0);
  EXPECT_EQ(g.stats(t).excess_returns, 1u);
  EXPECT_NE(err.find("gpu0"), std::string::npos) << err;
  EXPECT_NE(err.find("20"), std::string::npos) << err;
}

TEST(GovernorTest, PeakIsHighestUsedPlusReserved) {
  Governor g;
  const TierId t = g.add_tier("gpu0", 1000);
  {
    Result<Grant> a = g.prepare(t, 400);
    Result<Grant> b = g.prepare(t, 350);
    ASSERT_TRUE(a.ok() && b.ok());
    ASSERT_TRUE(a->charge(400).ok());
  }
  EXPECT_EQ(g.stats(t).peak, 750u);
  g.return_bytes(t, 400);
  ASSERT_TRUE(testing::charge_direct(g, t, 600).ok());
  EXPECT_EQ(g.stats(t).peak, 750u);
  ASSERT_TRUE(testing::charge_direct(g, t, 200).ok());
  EXPECT_EQ(g.stats(t).peak, 800u);
}
}  // namespace
}  // namespace kvvm
