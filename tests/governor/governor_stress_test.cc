// Governor: the ledger invariant (used + reserved <= limit; used == what holders own) under
// threads doing random operations.
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
