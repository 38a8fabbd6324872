// Deterministic arena tests found by the reference model (arena_reference_model_test.cc): the
// threads of docs/ARCHITECTURE.md "Concurrency" at once (for ThreadSanitizer), and one test
// per arena bug the model found, each lining its case up deterministically; all six are fixed
// and these are regression tests.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <deque>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "kvvm/governor/governor.h"
#include "kvvm/kv/arena.h"
#include "kvvm/kv/layout.h"
#include "kvvm/vmm/driver.h"
#include "kvvm/vmm/fault_driver.h"
#include "kvvm/vmm/handle_pool.h"
#include "kvvm/vmm/host_driver.h"
#include "kvvm/vmm/reservation.h"
#include "support/arena_gate_rig.h"
#include "support/invariants.h"
#include "support/pattern.h"

namespace kvvm {
namespace {

namespace kt = ::kvvm::testing;
using kt::arena_model::GateDriver;
using kt::arena_model::Rig;
using kt::arena_model::small_geometry;
using std::chrono::milliseconds;

TEST(ArenaModelConcurrency, FourThreadsEnsureWhileAFifthReclaimsAndTheWorkerCommitsAhead) {
  // Budget for every window of every slot: nothing is refused, so every ensure must succeed.
  Rig rig({.tier_granules = 6 * 4 * 8,
           .pooled_granules = 4,
           .layout = Layout::kSeqMajor,
           .windows = 8,
           .slots = 6,
           .ahead = 1});
  Arena& arena = *rig.arena;
  const LayoutPlan& plan = arena.plan();
  const std::uint64_t max = plan.max_context;
  std::vector<SlotId> growing;
  for (int i = 0; i < 4; ++i) {
    auto slot = arena.admit(1);
    ASSERT_TRUE(slot.ok()) << slot.status().to_string();
    growing.push_back(*slot);
  }
  for (int i = 0; i < 2; ++i) {  // finished sequences for the reclaimer to find
    auto slot = arena.admit(max / 2);
    ASSERT_TRUE(slot.ok()) << slot.status().to_string();
    ASSERT_TRUE(arena.finish(*slot).ok());
  }
  std::atomic<bool> done{false};
  std::atomic<int> failures{0}, uncovered{0};
  std::atomic<std::uint64_t> reclaimed{0};
  std::thread reclaimer([&] {
    for (std::uint64_t i = 0; !done.load(); ++i) {
      const std::uint64_t wanted = i % 3 == 0 ? UINT64_MAX : (1 + i % 7) * rig.g;
      reclaimed += arena.reclaim(wanted);
      std::this_thread::yield();
    }
  });
  std::vector<std::thread> threads;
  for (SlotId slot : growing) {
    threads.emplace_back([&, slot] {
      for (int round = 0; round < 12; ++round) {
        for (std::uint64_t t = 1 + slot; t <= max; t += 1 + t % 5) {
          Status status = arena.ensure(slot, t);
          if (!status.ok()) {
            ADD_FAILURE() << "ensure of slot " << slot << " to " << t << ": " << status.to_string();
            ++failures;
          } else if (rig.mapped_windows(slot) < plan.windows_per_fragment(t)) {
            ++uncovered;  // ensure said yes, yet its live windows are (being) unmapped
          }
          std::this_thread::yield();
        }
        // The sequence is cut short (its windows beyond stay mapped, for the reclaimer).
        if (!arena.ensure(slot, 1 + round).ok()) ++failures;
      }
    });
  }
  for (auto& thread : threads) thread.join();
  done = true;
  reclaimer.join();
  arena.wait_until_idle();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(uncovered.load(), 0) << "an ensure that succeeded found its live windows unmapped";
  EXPECT_EQ(kt::check_invariants(rig.world()), "");
  const ArenaStats stats = arena.stats();
  EXPECT_EQ(stats.quarantined_slots, 0u);
  EXPECT_EQ(stats.committed_bytes, arena.reservation().mapped_bytes());
  EXPECT_GT(stats.ahead_commits, 0u);
  for (SlotId slot : growing) {
    EXPECT_GE(rig.mapped_windows(slot), plan.windows_per_fragment(arena.tokens(slot)));
  }
  std::cout << "[ arena concurrency ] reclaimed " << reclaimed.load() << " bytes, "
            << stats.ahead_commits << " ahead commits, " << stats.ensures_committing
            << " committing ensures\n";
}

// Fixed bug: reclaim() counted as given back only what pool.trim() freed. Handles the pool
// releases at once because it is at its bound (note_unmapped -> release_now) go back to the
// tier too, but were not counted, so reclaim() under-reported (and the governor's `reclaimed`
// with it) and went on unmapping further finished slots and ahead windows nobody asked for.
TEST(ArenaModelBugs, ReclaimReportsWhatThePoolReleasedAtOnceAndStopsWhenItHasEnough) {
  Rig rig({.tier_granules = 64, .pooled_granules = 2});
  Arena& arena = *rig.arena;
  auto first = arena.admit(rig.tokens_for(4));
  auto second = arena.admit(rig.tokens_for(4));
  ASSERT_TRUE(first.ok() && second.ok());
  ASSERT_TRUE(arena.finish(*first).ok());  // least recently used: reclaimed first
  ASSERT_TRUE(arena.finish(*second).ok());
  const std::uint64_t used = rig.used();
  const std::uint64_t returned = arena.reclaim(4 * rig.g);
  EXPECT_EQ(returned, used - rig.used()) << "reclaim must report what the tier got back";
  EXPECT_EQ(rig.mapped_windows(*second), 4u)
      << "the first finished slot's 4 windows paid for the 4 asked; the second keeps its own";
  EXPECT_EQ(arena.stats().reclaimable_bytes, 4 * rig.g);
  EXPECT_EQ(kt::check_invariants(rig.world()), "");
}

// Fixed bug: ensure()'s fast path (the windows are mapped already) neither waited for nor
// checked the slot's busy flag. A reclaim that had claimed the slot to unmap its windows beyond
// the live length (keep computed from the old length) went on unmapping them after ensure()
// said yes to a length that needs them, then published windows = keep <
// windows_per_fragment(tokens): the sequence's live tokens were unmapped, and a kernel writing
// them would fault.
TEST(ArenaModelBugs, EnsureDuringAReclaimOfItsWindowsKeepsItsLiveTokensMapped) {
  Rig rig({});
  Arena& arena = *rig.arena;
  auto slot = arena.admit(rig.tokens_for(3));
  ASSERT_TRUE(slot.ok());
  ASSERT_TRUE(arena.ensure(*slot, 1).ok());  // windows 1 and 2 are now beyond the live length
  rig.gate->hold_next_unmap(false);
  std::thread reclaimer([&] { (void)arena.reclaim(UINT64_MAX); });
  rig.gate->wait_until_held();  // the reclaim is unmapping windows [1, 3) of the slot
  Status ensured;
  std::thread grower([&] { ensured = arena.ensure(*slot, rig.tokens_for(3)); });
  // A correct ensure waits here for the reclaim, then commits the windows again.
  std::this_thread::sleep_for(milliseconds(100));
  rig.gate->open();
  reclaimer.join();
  grower.join();
  ASSERT_TRUE(ensured.ok()) << ensured.to_string();
  EXPECT_GE(rig.mapped_windows(*slot), 3u) << "ensure said yes to 3 windows of live tokens";
  const std::uint64_t last = rig.tokens_for(3) - 1;
  const std::uint64_t value = 42;
  const Status written =
      rig.fault->write(arena.view().address(*slot, 0, 0, 0, last), &value, sizeof value);
  EXPECT_TRUE(written.ok()) << "writing the last live token: " << written.to_string();
  EXPECT_EQ(kt::check_invariants(rig.world()), "");
}

// Fixed bug: finish() (like ensure()'s committing path) claimed the slot, waiting while another
// call held it, but did not check the slot's state again once it had it. A reclaim that held
// the slot and quarantined it (its unmap failed: poisoned windows) was overwritten: finish()
// marked the slot finished, the quarantine was forgotten (stats said 0 quarantined) and the
// next admission reused the poisoned windows.
TEST(ArenaModelBugs, AFinishThatWaitedForAFailedReclaimLeavesTheSlotQuarantined) {
  Rig rig({});
  Arena& arena = *rig.arena;
  auto slot = arena.admit(rig.tokens_for(3));
  ASSERT_TRUE(slot.ok());
  ASSERT_TRUE(arena.ensure(*slot, 1).ok());
  rig.gate->hold_next_unmap(true);  // and every unmap fails: the windows end up poisoned
  std::thread reclaimer([&] { (void)arena.reclaim(UINT64_MAX); });
  rig.gate->wait_until_held();
  Status finished;
  std::thread finisher([&] { finished = arena.finish(*slot); });
  std::this_thread::sleep_for(milliseconds(100));  // finish() now waits for the reclaim's claim
  rig.gate->open();
  reclaimer.join();
  finisher.join();
  rig.gate->stop_failing();
  EXPECT_GT(arena.reservation().residual_bytes(), 0u) << "the failed unmap poisoned windows";
  EXPECT_EQ(arena.stats().quarantined_slots, 1u) << "finish: " << finished.to_string();
  EXPECT_EQ(finished.code(), StatusCode::kFailedPrecondition) << finished.to_string();
  auto next = arena.admit(rig.tokens_for(3));
  if (next.ok()) {
    EXPECT_NE(*next, *slot) << "admitted into a slot with poisoned windows";
  }
  EXPECT_EQ(kt::check_invariants(rig.world()), "");
}

// Fixed bug: the commit-ahead worker's own commit asked the governor, which ran the arena's
// reclaim(), which unmapped the ahead windows of another active sequence; that sequence was
// then below its target again (reclaim does not mark it stalled), so the worker committed for
// it, reclaiming the first one's ahead windows, and so on forever: with a budget that holds
// only one sequence's lead the worker never settled (wait_until_idle() never returned) and
// mapped and unmapped in a loop with no request pending.
TEST(ArenaModelBugs, CommitAheadSettlesWhenTheBudgetHoldsOnlyOneSlotsLead) {
  // 2 live windows + 2 ahead windows: room for one sequence's lead of 2, not for both.
  Rig rig({.tier_granules = 4, .pooled_granules = 2, .ahead = 2});
  Arena& arena = *rig.arena;
  ASSERT_TRUE(arena.admit(1).ok());
  ASSERT_TRUE(arena.admit(1).ok());
  std::this_thread::sleep_for(milliseconds(200));  // far longer than settling takes
  const std::uint64_t before = arena.stats().ahead_commits;
  const std::uint64_t reclaimed = arena.stats().reclaimed_bytes;
  std::this_thread::sleep_for(milliseconds(200));
  const ArenaStats after = arena.stats();
  EXPECT_EQ(after.ahead_commits, before)
      << "the worker went on committing ahead with nothing asked of it; it also reclaimed "
      << after.reclaimed_bytes - reclaimed << " bytes meanwhile";
  EXPECT_LE(rig.used(), 4 * rig.g);
  // Destroying the arena stops the worker either way.
}

// Fixed bug: admit() counted every failed commit as a refusal; ArenaStats::refusals is
// documented as "admit/ensure answered ResourceExhausted" (ensure() counted only those).
TEST(ArenaModelBugs, AdmitCountsOnlyBudgetRefusalsAsRefusals) {
  Rig rig({});
  Arena& arena = *rig.arena;
  rig.fault->fail_nth(DriverOp::kMap, 1);
  auto slot = arena.admit(rig.tokens_for(1));
  rig.fault->clear();
  ASSERT_FALSE(slot.ok());
  EXPECT_EQ(slot.status().code(), StatusCode::kDriverError) << slot.status().to_string();
  EXPECT_EQ(arena.stats().refusals, 0u) << "a driver error is not a refusal";
  EXPECT_EQ(kt::check_invariants(rig.world()), "");
}

// Bug (fixed): when ensure() found its slot busy it waits for the claim, and if the
// windows it needs are mapped once it has the claim (another call committed them, or they
// stayed), it sets the length and returns OK but, unlike the fast path, neither records the use
// (last_used) nor clears ahead_stalled. So a sequence whose ensure() had to wait for a reclaim
// looks older than it is, and the next reclaim takes its commit-ahead windows before those of a
// sequence that was really used less recently ("least recently used first", arena.h).
TEST(ArenaModelBugs, AnEnsureThatWaitedForItsSlotStillCountsAsAUse) {
  Rig rig({.ahead = 1});
  Arena& arena = *rig.arena;
  auto a = arena.admit(1);  // used first
  auto b = arena.admit(1);  // used second
  ASSERT_TRUE(a.ok() && b.ok());
  arena.wait_until_idle();  // both: 1 live window + 1 ahead
  ASSERT_EQ(rig.mapped_windows(*a), 2u);
  ASSERT_EQ(rig.mapped_windows(*b), 2u);
  // A reclaim of one window takes a's ahead window (a is least recently used) and is held in
  // its unmap while the scheduler uses a again.
  rig.gate->hold_next_unmap(false);
  std::thread reclaimer([&] { (void)arena.reclaim(rig.g); });
  rig.gate->wait_until_held();
  Status ensured;
  std::thread user([&] { ensured = arena.ensure(*a, 1); });  // waits for the reclaim's claim
  std::this_thread::sleep_for(milliseconds(100));
  rig.gate->open();
  reclaimer.join();
  user.join();
  ASSERT_TRUE(ensured.ok()) << ensured.to_string();
  arena.wait_until_idle();  // the worker commits a's ahead window again
  ASSERT_EQ(rig.mapped_windows(*a), 2u);
  // Now b is the least recently used: a reclaim of one window must take b's ahead window.
  const std::size_t before = rig.gate->unmaps().size();
  (void)arena.reclaim(rig.g);
  const std::vector<Address> unmaps = rig.gate->unmaps();
  ASSERT_GT(unmaps.size(), before);
  const auto taken =
      static_cast<SlotId>((unmaps[before] - arena.slot_base(0)) / arena.plan().slot_stride);
  EXPECT_EQ(taken, *b) << "the reclaim took slot " << taken << "'s ahead window, yet slot " << *b
                       << " was used less recently";
  arena.wait_until_idle();  // the worker commits b's ahead window again: let it finish
  EXPECT_EQ(kt::check_invariants(rig.world()), "");
}

}  // namespace
}  // namespace kvvm