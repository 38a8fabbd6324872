// Governor: waiting for bytes to come back and FIFO admission.
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
}  // namespace
}  // namespace kvvm
