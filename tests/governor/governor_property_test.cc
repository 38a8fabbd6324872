// Governor properties over random operation sequences (rapidcheck):
//  1. One thread: every result and every ledger number equals a reference model's.
//  2. Several threads: used + reserved never exceeds the limit at any sampled moment, and at
//     the end the tier's used bytes equal what the holders think they own.
#include <gtest/gtest.h>
#include <rapidcheck.h>
#include <rapidcheck/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <thread>
#include <tuple>
#include <vector>

#include "kvvm/governor/governor.h"
#include "support/governor_access.h"

namespace kvvm {
namespace {

// (kind, a, b): what the op does is decided by kind; a and b are reduced to valid-ish sizes
// and indices when the op runs, so every generated sequence means something and shrinks well.
using Op = std::tuple<int, std::uint32_t, std::uint32_t>;
constexpr int kKinds = 8;

rc::Gen<std::vector<Op>> ops() {
  return rc::gen::container<std::vector<Op>>(rc::gen::tuple(rc::gen::inRange(0, kKinds),
                                                            rc::gen::arbitrary<std::uint32_t>(),
                                                            rc::gen::arbitrary<std::uint32_t>()));
}

struct ModelGrant {
  std::uint64_t prepared = 0;
  std::uint64_t charged = 0;
};

// The governor with wait == 0 and one reclaimer that gives back "pooled" bytes, written as
// plainly as possible.
struct Model {
  std::uint64_t limit = 0;
  std::uint64_t used = 0;
  std::uint64_t reserved = 0;
  std::uint64_t peak = 0;
  std::uint64_t grants = 0;
  std::uint64_t refusals = 0;
  std::uint64_t reclaimed = 0;
  std::uint64_t owned = 0;   // held by the test, outside any pool
  std::uint64_t pooled = 0;  // held, but the reclaimer may give it back
  std::uint64_t available() const { return limit - used - reserved; }
  void note_peak() { peak = std::max(peak, used + reserved); }
};

RC_GTEST_PROP(GovernorPropertyTest, SequentialOpsMatchAReferenceModel, ()) {
  Model m;
  m.limit = *rc::gen::inRange<std::uint64_t>(1, 1001);
  Governor g;
  const TierId t = g.add_tier("model", m.limit);
  std::uint64_t pooled = 0;  // the real pool the reclaimer drains
  Governor::Registration reg = g.add_reclaimer(t, [&](std::uint64_t wanted) {
    const std::uint64_t take = std::min(wanted, pooled);
    pooled -= take;
    g.return_bytes(t, take);
    return take;
  });
  std::vector<Grant> grants;
  std::vector<ModelGrant> model_grants;

  for (const auto& [kind, a, b] : *ops()) {
    switch (kind) {
      case 0:
      case 1: {  // prepare
        const std::uint64_t n = a % (m.limit + m.limit / 4 + 2);
        bool expect_ok = n == 0 || n <= m.available();
        std::uint64_t expect_available = m.available();
        if (!expect_ok && n <= m.limit) {
          const std::uint64_t got = std::min(n - m.available(), m.pooled);
          m.pooled -= got;
          m.used -= got;
          m.reclaimed += got;
          expect_ok = n <= m.available();
          expect_available = m.available();
        }
        Result<Grant> r = g.prepare(t, n);
        RC_ASSERT(r.ok() == expect_ok);
        if (expect_ok) {
          m.reserved += n;
          m.note_peak();
          ++m.grants;
          grants.push_back(std::move(*r));
          model_grants.push_back({n, 0});
        } else {
          ++m.refusals;
          RC_ASSERT(r.status().code() == StatusCode::kResourceExhausted);
          RC_ASSERT(r.status().exhaustion()->requested == n);
          RC_ASSERT(r.status().exhaustion()->available == expect_available);
          RC_ASSERT(r.status().exhaustion()->limit == m.limit);
        }
        break;
      }
      case 2: {  // charge, sometimes more than remains
        if (grants.empty()) break;
        const std::size_t i = a % grants.size();
        ModelGrant& mg = model_grants[i];
        const std::uint64_t n = b % (mg.prepared - mg.charged + 2);
        const Status s = grants[i].charge(n);
        RC_ASSERT(s.ok() == (n <= mg.prepared - mg.charged));
        if (s.ok()) {
          mg.charged += n;
          m.reserved -= n;
          m.used += n;
          m.owned += n;
        } else {
          RC_ASSERT(s.code() == StatusCode::kResourceExhausted);
        }
        RC_ASSERT(grants[i].charged() == mg.charged);
        break;
      }
      case 3: {  // commit, sometimes out of bounds
        if (grants.empty()) break;
        const std::size_t i = a % grants.size();
        const ModelGrant mg = model_grants[i];
        const std::uint64_t actual = b % (mg.prepared + 2);
        const Status s = grants[i].commit(actual);
        const bool valid = mg.charged <= actual && actual <= mg.prepared;
        RC_ASSERT(s.ok() == valid);
        if (valid) {
          m.reserved -= mg.prepared - mg.charged;
          m.used += actual - mg.charged;
          m.owned += actual - mg.charged;
          grants.erase(grants.begin() + static_cast<std::ptrdiff_t>(i));
          model_grants.erase(model_grants.begin() + static_cast<std::ptrdiff_t>(i));
        } else {
          RC_ASSERT(s.code() == StatusCode::kInvalidArgument);
          RC_ASSERT(grants[i].active());
        }
        break;
      }
      case 4: {  // drop: rolls back what was not charged
        if (grants.empty()) break;
        const std::size_t i = a % grants.size();
        m.reserved -= model_grants[i].prepared - model_grants[i].charged;
        grants.erase(grants.begin() + static_cast<std::ptrdiff_t>(i));
        model_grants.erase(model_grants.begin() + static_cast<std::ptrdiff_t>(i));
        break;
      }
      case 5: {  // a holder releases bytes it owns
        const std::uint64_t n = a % (m.owned + 1);
        m.owned -= n;
        m.used -= n;
        g.return_bytes(t, n);
        break;
      }
      case 6: {  // a holder parks bytes in the pool (still used, reclaimable)
        const std::uint64_t n = a % (m.owned + 1);
        m.owned -= n;
        m.pooled += n;
        pooled += n;
        break;
      }
      case 7: {  // adoption without a grant
        const std::uint64_t n = a % (m.limit / 2 + 2);
        const bool expect_ok = n <= m.available();
        const Status s = testing::charge_direct(g, t, n);
        RC_ASSERT(s.ok() == expect_ok);
        if (expect_ok) {
          m.used += n;
          m.owned += n;
          m.note_peak();
        }
        break;
      }
    }
    const TierStats s = g.stats(t);
    RC_ASSERT(s.used == m.used);
    RC_ASSERT(s.reserved == m.reserved);
    RC_ASSERT(s.peak == m.peak);
    RC_ASSERT(s.grants == m.grants);
    RC_ASSERT(s.refusals == m.refusals);
    RC_ASSERT(s.reclaimed == m.reclaimed);
    // Ledger truth: charged bytes of open grants are already in owned.
    RC_ASSERT(s.used == m.owned + m.pooled);
    RC_ASSERT(pooled == m.pooled);
  }
}

RC_GTEST_PROP(GovernorPropertyTest, ConcurrentOpsNeverExceedTheLimitAndKeepTheLedger, ()) {
  const std::uint64_t limit = *rc::gen::inRange<std::uint64_t>(1, 2001);
  const int thread_count = *rc::gen::inRange(2, 5);
  std::vector<std::vector<Op>> programs;
  for (int i = 0; i < thread_count; ++i) programs.push_back(*ops());

  Governor g;
  const TierId t = g.add_tier("concurrent", limit);
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
  std::atomic<std::uint64_t> over_limit{0};
  std::thread watcher([&] {
    while (!stop) {
      const TierStats s = g.stats(t);
      if (s.used + s.reserved > s.limit) ++over_limit;
      std::this_thread::yield();
    }
  });

  std::atomic<std::uint64_t> unexpected{0};  // a call failed in a way no op allows
  std::vector<std::uint64_t> owned(programs.size(), 0);
  std::vector<std::thread> threads;
  for (std::size_t p = 0; p < programs.size(); ++p) {
    threads.emplace_back([&, p] {
      std::uint64_t mine = 0;
      std::vector<Grant> grants;
      for (const auto& [kind, a, b] : programs[p]) {
        switch (kind) {
          case 0:
          case 1: {  // prepare; one in eight may wait a millisecond in the queue
            const auto wait = std::chrono::milliseconds(b % 8 == 0 ? 1 : 0);
            Result<Grant> r = g.prepare(t, a % (limit / 2 + 2), wait);
            if (r.ok()) {
              grants.push_back(std::move(*r));
            } else if (r.status().code() != StatusCode::kResourceExhausted) {
              ++unexpected;
            }
            break;
          }
          case 2: {
            if (grants.empty()) break;
            Grant& gr = grants[a % grants.size()];
            const std::uint64_t n = b % (gr.remaining() + 1);
            if (gr.charge(n).ok()) {
              mine += n;
            } else {
              ++unexpected;
            }
            break;
          }
          case 3: {
            if (grants.empty()) break;
            const std::size_t i = a % grants.size();
            Grant& gr = grants[i];
            const std::uint64_t extra = b % (gr.remaining() + 1);
            if (gr.commit(gr.charged() + extra).ok()) {
              mine += extra;
            } else {
              ++unexpected;
            }
            grants.erase(grants.begin() + static_cast<std::ptrdiff_t>(i));
            break;
          }
          case 4: {
            if (grants.empty()) break;
            grants.erase(grants.begin() + static_cast<std::ptrdiff_t>(a % grants.size()));
            break;
          }
          case 5: {
            const std::uint64_t n = a % (mine + 1);
            mine -= n;
            g.return_bytes(t, n);
            break;
          }
          case 6: {
            const std::uint64_t n = a % (mine + 1);
            mine -= n;
            pooled += n;
            break;
          }
          case 7: {
            const std::uint64_t n = a % (limit / 4 + 2);
            const Status s = testing::charge_direct(g, t, n);
            if (s.ok()) {
              mine += n;
            } else if (s.code() != StatusCode::kResourceExhausted) {
              ++unexpected;
            }
            break;
          }
        }
      }
      grants.clear();  // drops settle at what was charged, which `mine` already counts
      owned[p] = mine;
    });
  }
  for (std::thread& th : threads) th.join();
  stop = true;
  watcher.join();

  std::uint64_t total = pooled.load();
  for (std::uint64_t o : owned) total += o;
  const TierStats s = g.stats(t);
  RC_ASSERT(over_limit.load() == 0u);
  RC_ASSERT(unexpected.load() == 0u);
  RC_ASSERT(s.used == total);
  RC_ASSERT(s.reserved == 0u);
  RC_ASSERT(s.waiting == 0u);
  RC_ASSERT(s.excess_returns == 0u);
  RC_ASSERT(s.peak <= limit);
}

}  // namespace
}  // namespace kvvm
