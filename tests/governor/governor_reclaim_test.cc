// Governor: reclaimers asked to make room before a refusal.
//
// No test asserts a wall-clock time: ordering is made deterministic by waiting for
// stats().waiting, and timeouts only bound how long a broken implementation can hang.
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

#include "kvvm/governor/governor.h"
#include "support/governor_access.h"
#include "support/governor_checks.h"

namespace kvvm {
namespace {

using std::chrono::milliseconds;
using testing::eventually;
using testing::expect_ledger;
using testing::kLongWait;
using testing::kMiB;

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
}  // namespace
}  // namespace kvvm
