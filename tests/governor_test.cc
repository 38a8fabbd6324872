// Governor: grant arithmetic, refusals with numbers, reclaim before refusal, FIFO admission,
// and the ledger invariant (used + reserved <= limit; used == what holders own) under threads.
//
// No test asserts a wall-clock time: ordering is made deterministic by waiting for
// stats().waiting, and timeouts only bound how long a broken implementation can hang.
#include "kvvm/governor.h"

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

namespace kvvm {
namespace {

using std::chrono::milliseconds;

constexpr std::uint64_t kMiB = 1024 * 1024;
// Long enough that a correct implementation never times out, yet a broken one fails
// instead of hanging the suite.
constexpr milliseconds kLongWait = std::chrono::minutes(1);

// Spins until `pred` holds; false if it never does (a hang turned into a failure).
bool eventually(const std::function<bool()>& pred) {
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (!pred()) {
    if (std::chrono::steady_clock::now() > give_up) return false;
    std::this_thread::sleep_for(milliseconds(1));
  }
  return true;
}

void expect_ledger(const Governor& g, TierId tier, std::uint64_t used, std::uint64_t reserved) {
  const TierStats s = g.stats(tier);
  EXPECT_EQ(s.used, used);
  EXPECT_EQ(s.reserved, reserved);
}

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

// ---- Reclaim before refusal -------------------------------------------------------------

TEST(GovernorTest, ReclaimerMakesRoomBeforeRefusal) {
  Governor g;
  const TierId t = g.add_tier("gpu0", 100);
  ASSERT_TRUE(testing::charge_direct(g, t, 90).ok());  // e.g. 90 bytes sit unmapped in a pool
  std::vector<std::uint64_t> asked;
  Governor::Registration reg = g.add_reclaimer(t, [&](std::uint64_t wanted) {
    asked.push_back(wanted);
    g.return_bytes(t, wanted);  // legal: no governor lock is held during the call
    return wanted;
  });
  Result<Grant> grant = g.prepare(t, 40);
  ASSERT_TRUE(grant.ok()) << grant.status().to_string();
  EXPECT_EQ(asked, std::vector<std::uint64_t>{30});  // the shortfall, not the request
  const TierStats s = g.stats(t);
  EXPECT_EQ(s.reclaimed, 30u);
  EXPECT_EQ(s.refusals, 0u);
  expect_ledger(g, t, 60, 40);

  // Without the reclaimer, the same request is refused.
  reg = Governor::Registration();
  ASSERT_TRUE(grant->commit(40).ok());
  Result<Grant> refused = g.prepare(t, 1);
  EXPECT_EQ(refused.status().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(asked.size(), 1u);
}

TEST(GovernorTest, ReclaimerThatFreesNothingIsCalledThenRefused) {
  Governor g;
  const TierId t = g.add_tier("gpu0", 100);
  ASSERT_TRUE(testing::charge_direct(g, t, 100).ok());
  int calls = 0;
  Governor::Registration reg = g.add_reclaimer(t, [&](std::uint64_t wanted) {
    EXPECT_EQ(wanted, 10u);
    ++calls;
    return std::uint64_t{0};
  });
  Result<Grant> grant = g.prepare(t, 10);
  EXPECT_EQ(calls, 1);
  ASSERT_FALSE(grant.ok());
  EXPECT_EQ(grant.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(grant.status().message().find("after reclaiming 0 bytes"), std::string::npos)
      << grant.status().message();
  EXPECT_EQ(g.stats(t).refusals, 1u);
}

TEST(GovernorTest, ReclaimersRunInRegistrationOrderUntilEnough) {
  Governor g;
  const TierId t = g.add_tier("gpu0", 100);
  const TierId other = g.add_tier("host", 100);
  ASSERT_TRUE(testing::charge_direct(g, t, 100).ok());
  std::vector<std::string> calls;
  auto giver = [&](std::string name, std::uint64_t gives) {
    return [&calls, &g, t, name, gives](std::uint64_t wanted) {
      calls.push_back(name + ":" + std::to_string(wanted));
      const std::uint64_t n = std::min(wanted, gives);
      g.return_bytes(t, n);
      return n;
    };
  };
  Governor::Registration r1 = g.add_reclaimer(t, giver("first", 20));
  Governor::Registration r_other = g.add_reclaimer(other, giver("other-tier", 100));
  Governor::Registration r2 = g.add_reclaimer(t, giver("second", 100));
  Governor::Registration r3 = g.add_reclaimer(t, giver("third", 100));
  Result<Grant> grant = g.prepare(t, 50);
  ASSERT_TRUE(grant.ok()) << grant.status().to_string();
  EXPECT_EQ(calls, (std::vector<std::string>{"first:50", "second:30"}));
  EXPECT_EQ(g.stats(t).reclaimed, 50u);
  EXPECT_EQ(g.stats(other).reclaimed, 0u);
}

TEST(GovernorTest, RegistrationTokenOwnsTheRegistration) {
  Governor g;
  const TierId t = g.add_tier("gpu0", 100);
  ASSERT_TRUE(testing::charge_direct(g, t, 100).ok());
  int calls = 0;
  Governor::Registration outer;
  {
    Governor::Registration inner = g.add_reclaimer(t, [&](std::uint64_t) {
      ++calls;
      return std::uint64_t{0};
    });
    outer = std::move(inner);  // the moved-from token's death must not deregister
  }
  EXPECT_FALSE(g.prepare(t, 1).ok());
  EXPECT_EQ(calls, 1);
  outer = Governor::Registration();
  EXPECT_FALSE(g.prepare(t, 1).ok());
  EXPECT_EQ(calls, 1);
}

TEST(GovernorTest, ReclaimerMayDeregisterItselfWhileRunning) {
  Governor g;
  const TierId t = g.add_tier("gpu0", 100);
  ASSERT_TRUE(testing::charge_direct(g, t, 100).ok());
  std::optional<Governor::Registration> reg;
  int calls = 0;
  reg = g.add_reclaimer(t, [&](std::uint64_t wanted) {
    ++calls;
    reg.reset();  // destroys this very reclaimer's registration (its closure stays alive)
    g.return_bytes(t, wanted);
    return wanted;
  });
  EXPECT_TRUE(g.prepare(t, 5).ok());
  EXPECT_EQ(calls, 1);
  EXPECT_FALSE(reg.has_value());
  ASSERT_TRUE(testing::charge_direct(g, t, 5).ok());
  EXPECT_FALSE(g.prepare(t, 5).ok());
  EXPECT_EQ(calls, 1);
}

TEST(GovernorTest, DeregistrationWaitsForARunningReclaimer) {
  Governor g;
  const TierId t = g.add_tier("gpu0", 100);
  ASSERT_TRUE(testing::charge_direct(g, t, 100).ok());
  std::atomic<bool> entered{false};
  std::atomic<bool> release{false};
  std::atomic<bool> finished{false};
  auto reg = std::make_unique<Governor::Registration>(g.add_reclaimer(t, [&](std::uint64_t) {
    entered = true;
    while (!release) std::this_thread::yield();
    finished = true;
    return std::uint64_t{0};
  }));
  std::jthread preparer([&] { EXPECT_FALSE(g.prepare(t, 1).ok()); });
  ASSERT_TRUE(eventually([&] { return entered.load(); }));
  std::atomic<bool> finished_when_deregistered{false};
  std::atomic<bool> deregistered{false};
  std::jthread remover([&] {
    reg.reset();
    finished_when_deregistered = finished.load();
    deregistered = true;
  });
  // Give the remover a chance to (wrongly) return early; correctness does not depend on it.
  std::this_thread::sleep_for(milliseconds(20));
  EXPECT_FALSE(deregistered.load());
  release = true;
  remover.join();
  preparer.join();
  EXPECT_TRUE(finished_when_deregistered.load());
}

TEST(GovernorTest, ReclaimersAreAskedAgainBeforeATimedOutRefusal) {
  Governor g;
  const TierId t = g.add_tier("gpu0", 100);
  ASSERT_TRUE(testing::charge_direct(g, t, 100).ok());
  // Nothing reclaimable at first; by the second call a holder has parked 50 bytes in its
  // pool, which (pooled bytes staying used) notifies nobody.
  std::vector<std::uint64_t> asked;
  Governor::Registration reg = g.add_reclaimer(t, [&](std::uint64_t wanted) {
    asked.push_back(wanted);
    if (asked.size() == 1) return std::uint64_t{0};
    g.return_bytes(t, wanted);
    return wanted;
  });
  Result<Grant> grant = g.prepare(t, 50, milliseconds(20));
  ASSERT_TRUE(grant.ok()) << grant.status().to_string();
  EXPECT_EQ(asked, (std::vector<std::uint64_t>{50, 50}));
  EXPECT_EQ(g.stats(t).reclaimed, 50u);
  expect_ledger(g, t, 50, 50);
}

TEST(GovernorTest, OneReclaimPassAtATimePerTier) {
  Governor g;
  const TierId t = g.add_tier("gpu0", 100);
  ASSERT_TRUE(testing::charge_direct(g, t, 100).ok());
  std::atomic<int> inside{0};
  std::atomic<int> most_inside{0};
  std::atomic<int> calls{0};
  std::atomic<bool> release{false};
  Governor::Registration reg = g.add_reclaimer(t, [&](std::uint64_t) {
    const int now = ++inside;
    int seen = most_inside.load();
    while (now > seen && !most_inside.compare_exchange_weak(seen, now)) {
    }
    ++calls;
    while (!release) std::this_thread::yield();
    --inside;
    return std::uint64_t{0};
  });
  std::optional<Result<Grant>> first;
  std::optional<Result<Grant>> second;
  std::jthread a([&] { first.emplace(g.prepare(t, 10)); });
  EXPECT_TRUE(eventually([&] { return calls.load() == 1; }));
  std::jthread b([&] { second.emplace(g.prepare(t, 10, kLongWait)); });
  // b must queue behind a's reclaim pass instead of starting its own.
  EXPECT_TRUE(eventually([&] { return g.stats(t).waiting == 2 || inside.load() == 2; }));
  EXPECT_EQ(inside.load(), 1);
  release = true;
  a.join();  // refused: wait == 0 and its pass found nothing
  EXPECT_TRUE(eventually([&] { return calls.load() == 2; }));  // b's own pass, as the head
  g.return_bytes(t, 10);
  b.join();
  EXPECT_EQ(most_inside.load(), 1);
  ASSERT_TRUE(first.has_value() && second.has_value());
  EXPECT_EQ(first->status().code(), StatusCode::kResourceExhausted);
  EXPECT_TRUE(second->ok()) << second->status().to_string();
}

// ---- Waiting and FIFO admission ---------------------------------------------------------

TEST(GovernorTest, WaiterIsGrantedWhenBytesComeBack) {
  Governor g;
  const TierId t = g.add_tier("gpu0", 100);
  ASSERT_TRUE(testing::charge_direct(g, t, 100).ok());
  std::optional<Result<Grant>> got;
  std::jthread waiter([&] { got.emplace(g.prepare(t, 60, kLongWait)); });
  ASSERT_TRUE(eventually([&] { return g.stats(t).waiting == 1; }));
  g.return_bytes(t, 30);  // not enough yet
  g.return_bytes(t, 30);
  waiter.join();
  ASSERT_TRUE(got.has_value());
  ASSERT_TRUE(got->ok()) << got->status().to_string();
  expect_ledger(g, t, 40, 60);
  EXPECT_EQ(g.stats(t).waiting, 0u);
}

TEST(GovernorTest, WaiterTimesOutWithResourceExhausted) {
  Governor g;
  const TierId t = g.add_tier("gpu0", 100);
  ASSERT_TRUE(testing::charge_direct(g, t, 95).ok());
  Result<Grant> grant = g.prepare(t, 10, milliseconds(20));
  ASSERT_FALSE(grant.ok());
  const Status s = grant.status();
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(s.exhaustion()->requested, 10u);
  EXPECT_EQ(s.exhaustion()->available, 5u);
  EXPECT_NE(s.message().find("timed out"), std::string::npos) << s.message();
  const TierStats st = g.stats(t);
  EXPECT_EQ(st.refusals, 1u);
  EXPECT_EQ(st.waiting, 0u);
  // The tier is usable afterwards: the timed-out ticket left the queue.
  EXPECT_TRUE(g.prepare(t, 5).ok());
}

TEST(GovernorTest, LaterRequestDoesNotJumpAQueuedOne) {
  Governor g;
  const TierId t = g.add_tier("gpu0", 100);
  ASSERT_TRUE(testing::charge_direct(g, t, 80).ok());  // 20 free
  std::atomic<int> granted{0};
  std::vector<std::string> order;
  std::mutex order_mutex;
  auto take = [&](std::string name, std::uint64_t bytes) {
    Result<Grant> r = g.prepare(t, bytes, kLongWait);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    {
      std::lock_guard lock(order_mutex);
      order.push_back(name);
    }
    ASSERT_TRUE(r->commit(bytes).ok());  // keep the bytes, so each grant is observable
    ++granted;
  };
  std::jthread big([&] { take("big", 50); });
  ASSERT_TRUE(eventually([&] { return g.stats(t).waiting == 1; }));
  std::jthread small([&] { take("small", 10); });  // 10 fits in the 20 free, but must queue
  EXPECT_TRUE(eventually([&] { return g.stats(t).waiting == 2 || granted > 0; }));
  EXPECT_EQ(granted.load(), 0);
  expect_ledger(g, t, 80, 0);

  // A request that may not wait is refused rather than served ahead of the queue.
  Result<Grant> impatient = g.prepare(t, 1);
  EXPECT_FALSE(impatient.ok());
  EXPECT_EQ(impatient.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(impatient.status().message().find("2 earlier requests"), std::string::npos)
      << impatient.status().message();

  // 50 free: either could be served now, but only big (the head) may be; it takes all 50.
  g.return_bytes(t, 30);
  EXPECT_TRUE(eventually([&] { return granted > 0; }));
  {
    std::lock_guard lock(order_mutex);
    EXPECT_EQ(order, std::vector<std::string>{"big"});
  }
  g.return_bytes(t, 10);  // now small's turn
  big.join();
  small.join();
  EXPECT_EQ(order, (std::vector<std::string>{"big", "small"}));
  expect_ledger(g, t, 100, 0);
}

TEST(GovernorTest, HeadTimingOutLetsTheNextWaiterIn) {
  Governor g;
  const TierId t = g.add_tier("gpu0", 100);
  ASSERT_TRUE(testing::charge_direct(g, t, 90).ok());  // 10 free
  std::optional<Result<Grant>> big_result;
  std::optional<Result<Grant>> small_result;
  std::jthread big([&] { big_result.emplace(g.prepare(t, 50, milliseconds(50))); });
  ASSERT_TRUE(eventually([&] { return g.stats(t).waiting == 1 || big_result.has_value(); }));
  std::jthread small([&] { small_result.emplace(g.prepare(t, 10, kLongWait)); });
  big.join();
  small.join();
  ASSERT_TRUE(big_result.has_value() && small_result.has_value());
  EXPECT_EQ(big_result->status().code(), StatusCode::kResourceExhausted);
  ASSERT_TRUE(small_result->ok()) << small_result->status().to_string();
  expect_ledger(g, t, 90, 10);
}

TEST(GovernorFifoTest, WaitersAreGrantedInArrivalOrder) {
  constexpr int kThreads = 8;
  Governor g;
  const TierId t = g.add_tier("gpu0", 100);
  ASSERT_TRUE(testing::charge_direct(g, t, 100).ok());
  auto size_of = [](int i) { return std::uint64_t{10} * static_cast<std::uint64_t>(1 + i % 3); };

  std::mutex order_mutex;
  std::vector<int> order;
  std::atomic<int> granted{0};
  std::vector<std::jthread> threads;
  for (int i = 0; i < kThreads; ++i) {
    // Start thread i only once the i before it are queued: arrival order is then 0, 1, ...
    ASSERT_TRUE(eventually([&] { return g.stats(t).waiting == static_cast<std::size_t>(i); }));
    threads.emplace_back([&, i] {
      Result<Grant> r = g.prepare(t, size_of(i), kLongWait);
      ASSERT_TRUE(r.ok()) << r.status().to_string();
      {
        std::lock_guard lock(order_mutex);
        order.push_back(i);
      }
      // Keep the bytes, so what the test returns next can only satisfy one more waiter.
      ASSERT_TRUE(r->commit(size_of(i)).ok());
      ++granted;
    });
  }
  ASSERT_TRUE(eventually([&] { return g.stats(t).waiting == kThreads; }));
  for (int k = 0; k < kThreads; ++k) {
    // Exactly the head's size comes back; a later waiter could fit in it when sizes differ.
    g.return_bytes(t, size_of(k));
    ASSERT_TRUE(eventually([&] { return granted.load() == k + 1; }));
  }
  for (std::jthread& th : threads) th.join();
  std::vector<int> expected(kThreads);
  for (int i = 0; i < kThreads; ++i) expected[static_cast<std::size_t>(i)] = i;
  EXPECT_EQ(order, expected);
  expect_ledger(g, t, 100, 0);
  EXPECT_EQ(g.stats(t).waiting, 0u);
}

// ---- Concurrent stress ------------------------------------------------------------------

TEST(GovernorStressTest, RandomOperationsKeepTheLedger) {
  constexpr int kThreads = 8;
  constexpr int kOpsPerThread = 1500;
  constexpr std::uint64_t kLimit = 4096;
  Governor g;
  const TierId t = g.add_tier("stress", kLimit);

  // Bytes "pooled": still owned (used), but a reclaimer may give them back, like a handle
  // pool's trim.
  std::atomic<std::uint64_t> pooled{0};
  Governor::Registration reg = g.add_reclaimer(t, [&](std::uint64_t wanted) {
    std::uint64_t have = pooled.load();
    std::uint64_t take = 0;
    do {
      take = std::min(have, wanted);
    } while (!pooled.compare_exchange_weak(have, have - take));
    g.return_bytes(t, take);
    return take;
  });

  std::atomic<bool> stop{false};
  std::atomic<std::uint64_t> violations{0};
  std::atomic<std::uint64_t> samples{0};
  std::jthread watcher([&] {
    while (!stop) {
      const TierStats s = g.stats(t);
      if (s.used + s.reserved > s.limit || s.peak > s.limit) ++violations;
      ++samples;
    }
  });

  std::vector<std::uint64_t> owned(kThreads, 0);
  std::vector<std::jthread> threads;
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&, i] {
      std::mt19937_64 rng(static_cast<std::uint64_t>(1000 + i));
      auto pick = [&](std::uint64_t lo, std::uint64_t hi) {
        return std::uniform_int_distribution<std::uint64_t>(lo, hi)(rng);
      };
      std::uint64_t mine = 0;
      std::vector<Grant> grants;
      for (int op = 0; op < kOpsPerThread; ++op) {
        switch (pick(0, 6)) {
          case 0:
          case 1: {  // prepare, sometimes waiting a little
            const milliseconds wait(pick(0, 3) == 0 ? pick(1, 2) : 0);
            Result<Grant> r = g.prepare(t, pick(0, 600), wait);
            if (r.ok()) {
              grants.push_back(std::move(*r));
            } else {
              EXPECT_EQ(r.status().code(), StatusCode::kResourceExhausted);
            }
            break;
          }
          case 2: {  // charge part of a grant
            if (grants.empty()) break;
            Grant& gr = grants[pick(0, grants.size() - 1)];
            const std::uint64_t n = pick(0, gr.remaining());
            EXPECT_TRUE(gr.charge(n).ok());
            mine += n;
            break;
          }
          case 3: {  // settle a grant: commit, commit_charged or drop
            if (grants.empty()) break;
            const std::size_t k = pick(0, grants.size() - 1);
            Grant& gr = grants[k];
            const std::uint64_t how = pick(0, 2);
            if (how == 0) {
              const std::uint64_t actual = pick(gr.charged(), gr.prepared());
              mine += actual - gr.charged();
              EXPECT_TRUE(gr.commit(actual).ok());
            } else if (how == 1) {
              gr.commit_charged();
            }
            grants.erase(grants.begin() + static_cast<std::ptrdiff_t>(k));
            break;
          }
          case 4: {  // give bytes back
            const std::uint64_t n = pick(0, mine);
            mine -= n;
            g.return_bytes(t, n);
            break;
          }
          case 5: {  // put bytes in the pool (still used, reclaimable)
            const std::uint64_t n = pick(0, mine);
            mine -= n;
            pooled += n;
            break;
          }
          case 6: {  // adopt bytes without a grant
            const std::uint64_t n = pick(0, 64);
            const Status s = testing::charge_direct(g, t, n);
            if (s.ok()) {
              mine += n;
            } else {
              EXPECT_EQ(s.code(), StatusCode::kResourceExhausted);
            }
            break;
          }
        }
      }
      for (Grant& gr : grants) gr.commit_charged();
      owned[static_cast<std::size_t>(i)] = mine;
    });
  }
  for (std::jthread& th : threads) th.join();
  stop = true;
  watcher.join();

  std::uint64_t total = pooled.load();
  for (std::uint64_t o : owned) total += o;
  const TierStats s = g.stats(t);
  EXPECT_EQ(violations.load(), 0u) << "of " << samples.load() << " samples";
  EXPECT_GT(samples.load(), 0u);
  EXPECT_EQ(s.used, total);
  EXPECT_EQ(s.reserved, 0u);
  EXPECT_EQ(s.waiting, 0u);
  EXPECT_EQ(s.excess_returns, 0u);
  EXPECT_LE(s.peak, kLimit);
  EXPECT_GT(s.grants, 0u);
}

}  // namespace
}  // namespace kvvm
