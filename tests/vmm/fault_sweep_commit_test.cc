// Fault sweeps (docs/ARCHITECTURE.md "Tests") of Reservation::commit and commit_ranges: every
// driver call of the operation is made to fail in turn, and the outcome checked against its
// contract.
//
// How a sweep works and what it checks: tests/support/reservation_fault_sweep.h.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kvvm/governor/governor.h"
#include "kvvm/vmm/driver.h"
#include "kvvm/vmm/fault_driver.h"
#include "kvvm/vmm/handle_pool.h"
#include "kvvm/vmm/host_driver.h"
#include "kvvm/vmm/reservation.h"
#include "support/backends.h"
#include "support/invariants.h"
#include "support/reservation_fault_sweep.h"

namespace kvvm {
namespace {

namespace kt = ::kvvm::testing;
// The shared runner, fixture and helpers of every reservation fault sweep.
using namespace ::kvvm::testing::reservation_sweep;  // NOLINT(build/namespaces)

// ---------------------------------------------------------------------------------------------
// Commit: reservation 0 (16 granules) holds content in neighbours right before the first and
// right after the last committed range; the operation commits the ranges (by default the one
// range [2, 2 + k) granules, with neighbours [0, 2) and [2 + k, 3 + k)), with commit() for one
// range and commit_ranges() for several.

struct CommitCase {
  std::string name;
  std::size_t k = 1;
  std::size_t handle_granules = 1;
  bool warm = false;  // the pool already holds the handles the commit needs
  std::uint64_t max_pooled_bytes = kNoPoolBound;
  bool failing_undo = false;  // double fault: the rollback's first unmap fails too
  // Several ranges, {first granule, granules} each, committed as one transaction; when
  // empty, the one range {2, k}.
  std::vector<std::pair<std::size_t, std::size_t>> ranges = {};
};

std::vector<std::pair<std::size_t, std::size_t>> granule_ranges(const CommitCase& c) {
  if (c.ranges.empty()) return {{2, c.k}};
  return c.ranges;
}

std::size_t total_granules(const CommitCase& c) {
  std::size_t total = 0;
  for (const auto& [first, count] : granule_ranges(c)) total += count;
  return total;
}

// The blocks in [offset, offset + len) are exactly a fresh commit in handles of
// `handle_bytes`: read-write, private, healthy, each handle in use with one mapping.
void expect_committed(const Rig& rig, const std::vector<Block>& blocks, std::size_t offset,
                      std::size_t len, std::size_t handle_bytes, const std::string& where) {
  std::vector<std::size_t> sizes;
  for (std::size_t at = offset; at < offset + len; at += handle_bytes) {
    sizes.push_back(std::min(handle_bytes, offset + len - at));
  }
  ASSERT_EQ(blocks.size(), sizes.size()) << where << ": committed blocks " << show(blocks);
  std::size_t at = offset;
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    const Block& b = blocks[i];
    EXPECT_TRUE(b.offset == at && b.bytes == sizes[i] && b.handle_offset == 0 &&
                b.access == Access::kReadWrite && !b.shared && !b.poisoned)
        << where << ": block " << show(b) << " is not the committed window at " << at;
    Result<HandleInfo> info = rig.pool->describe(b.handle);
    ASSERT_TRUE(info.ok()) << where << ": " << info.status().to_string();
    EXPECT_EQ(info->state, HandleState::kInUse) << where << ": " << show(b);
    EXPECT_EQ(info->mappings, 1u) << where << ": " << show(b);
    EXPECT_EQ(info->bytes, b.bytes) << where << ": " << show(b);
    at += b.bytes;
  }
}

// Every range of the case committed, each handle distinct.
void expect_all_committed(Rig& rig, const CommitCase& c, const std::string& where) {
  const std::vector<Block> blocks = rig.at(0).blocks();
  std::vector<Handle> handles;
  for (const auto& [first, count] : granule_ranges(c)) {
    const std::vector<Block> in_range = inside(blocks, first * rig.g, count * rig.g);
    expect_committed(rig, in_range, first * rig.g, count * rig.g, c.handle_granules * rig.g, where);
    if (::testing::Test::HasFatalFailure()) return;
    for (const Block& b : in_range) handles.push_back(b.handle);
  }
  std::sort(handles.begin(), handles.end());
  EXPECT_EQ(std::adjacent_find(handles.begin(), handles.end()), handles.end())
      << where << ": one handle mapped twice by one commit: " << show(blocks);
}

// The blocks inside / outside every range of the case.
std::vector<Block> inside_ranges(const Rig& rig, const std::vector<Block>& blocks,
                                 const CommitCase& c) {
  std::vector<Block> kept;
  for (const auto& [first, count] : granule_ranges(c)) {
    for (const Block& b : inside(blocks, first * rig.g, count * rig.g)) kept.push_back(b);
  }
  return kept;
}
std::vector<Block> outside_ranges(const Rig& rig, std::vector<Block> blocks, const CommitCase& c) {
  for (const auto& [first, count] : granule_ranges(c)) {
    blocks = outside(blocks, first * rig.g, count * rig.g);
  }
  return blocks;
}

Status commit_case(Rig& rig, const CommitCase& c) {
  const auto ranges = granule_ranges(c);
  if (ranges.size() == 1) {
    return commit_granules(rig, 0, ranges[0].first, ranges[0].second, c.handle_granules);
  }
  Result<Grant> grant = rig.governor.prepare(rig.tier, total_granules(c) * rig.g);
  if (!grant.ok()) return grant.status();
  std::vector<Range> byte_ranges;
  for (const auto& [first, count] : ranges) byte_ranges.push_back({first * rig.g, count * rig.g});
  return rig.at(0).commit_ranges(byte_ranges, &grant.value(),
                                 CommitOptions{Access::kReadWrite, c.handle_granules * rig.g});
}

void fill_case(Rig& rig, const CommitCase& c) {
  for (const auto& [first, count] : granule_ranges(c)) fill(rig, 0, first, count);
}

void check_commit(Rig& rig, const Trial& t, const CommitCase& c, Outcome* outcome) {
  const std::string where = c.name + ", " + t.where();
  Reservation& reservation = rig.at(0);
  const State after = capture(rig);

  ASSERT_EQ(kt::check_invariants(rig.world()), "") << where;
  EXPECT_EQ(show(outside_ranges(rig, after.blocks[0], c)),
            show(outside_ranges(rig, t.before.blocks[0], c)))
      << where << ": blocks outside the committed ranges changed";
  const std::vector<Block> in_ranges = inside_ranges(rig, after.blocks[0], c);

  bool residual = false;
  *outcome = t.status.ok() ? Outcome::kCompleted : Outcome::kRestored;
  if (t.status.ok()) {
    expect_all_committed(rig, c, where);
    if (::testing::Test::HasFatalFailure()) return;
    fill_case(rig, c);
  } else {
    EXPECT_EQ(t.status.code(), StatusCode::kDriverError) << where << ": " << t.status.to_string();
    EXPECT_EQ(after.pool.handles_in_use, t.before.pool.handles_in_use)
        << where << ": a failed commit kept handles checked out";
    if (reservation.residual_bytes() == t.before.residual[0]) {
      // The exact prior state: no block, and the grant rolled back (a grant is settled with the
      // real byte count, or given back), so the handles the commit
      // created are gone again and the ledger is where it was.
      EXPECT_TRUE(in_ranges.empty()) << where << ": a rolled-back commit left " << show(in_ranges);
      EXPECT_FALSE(mentions(t.status, "poisoned")) << where << ": " << t.status.to_string();
      EXPECT_EQ(after.pool.mapped_bytes, t.before.pool.mapped_bytes) << where;
      EXPECT_EQ(after.pool.quarantined_bytes, t.before.pool.quarantined_bytes) << where;
      EXPECT_EQ(after.pool.pooled_bytes, t.before.pool.pooled_bytes)
          << where << ": the rolled-back commit changed the pool";
      EXPECT_EQ(after.pool.owned_bytes, t.before.pool.owned_bytes) << where;
      EXPECT_EQ(after.tier.used, t.before.tier.used)
          << where << ": the rolled-back commit left bytes charged";
    } else {
      // Residual: reported, poisoned, quarantined; and nothing healthy left in the ranges.
      residual = true;
      *outcome = Outcome::kResidual;
      EXPECT_TRUE(mentions(t.status, "poisoned"))
          << where << ": residual not reported: " << t.status.to_string();
      EXPECT_GT(after.pool.handles_quarantined, t.before.pool.handles_quarantined) << where;
      EXPECT_EQ(reservation.residual_bytes() - t.before.residual[0], bytes_of(in_ranges)) << where;
      for (const Block& b : in_ranges) {
        EXPECT_TRUE(b.poisoned) << where << ": healthy block left by a failed commit: " << show(b);
        Result<HandleInfo> info = rig.pool->describe(b.handle);
        EXPECT_TRUE(info.ok() && info->state == HandleState::kQuarantined)
            << where << ": the handle of poisoned " << show(b) << " is not quarantined";
        EXPECT_NE(t.status.message().find(range_text(b.offset, b.bytes)), std::string::npos)
            << where << ": " << show(b) << " not named in " << t.status.to_string();
      }
      // Beyond the poisoned blocks, the ledger is where it was.
      EXPECT_EQ(after.pool.owned_bytes - after.pool.quarantined_bytes,
                t.before.pool.owned_bytes - t.before.pool.quarantined_bytes)
          << where;
    }
  }
  EXPECT_EQ(verify_content(rig), "") << where;

  // Nothing was left half-done: the same commit, retried without faults, succeeds.
  if (!t.status.ok() && !residual) {
    const Status retry = commit_case(rig, c);
    ASSERT_TRUE(retry.ok()) << where
                            << ": retry after a rolled-back commit failed: " << retry.to_string();
    expect_all_committed(rig, c, where + ", retry");
    if (::testing::Test::HasFatalFailure()) return;
    ASSERT_EQ(kt::check_invariants(rig.world()), "") << where << ", retry";
    fill_case(rig, c);
    EXPECT_EQ(verify_content(rig), "") << where << ", retry";
  }
}

Sweep commit_sweep(const CommitCase& c) {
  Sweep sweep;
  sweep.name = c.name;
  sweep.max_pooled_bytes = c.max_pooled_bytes;
  sweep.setup = [c](Rig& rig) {
    add_reservation(rig, 16);
    add_reservation(rig, 8);
    if (::testing::Test::HasFatalFailure()) return;
    const auto ranges = granule_ranges(c);
    const std::size_t first = ranges.front().first;
    const std::size_t end = ranges.back().first + ranges.back().second;
    ASSERT_TRUE(commit_granules(rig, 0, 0, first).ok());
    ASSERT_TRUE(commit_granules(rig, 0, end, 1).ok());
    fill(rig, 0, 0, first);
    fill(rig, 0, end, 1);
    if (c.warm) {
      // The same handle sizes, committed elsewhere and released: now pooled.
      for (const auto& [start, count] : ranges) {
        ASSERT_TRUE(commit_granules(rig, 1, 0, count, c.handle_granules).ok());
        ASSERT_TRUE(rig.at(1).release(0, count * rig.g).ok());
      }
    }
  };
  sweep.op = [c](Rig& rig) { return commit_case(rig, c); };
  sweep.check = [c](Rig& rig, const Trial& t) {
    Outcome outcome = Outcome::kCompleted;
    check_commit(rig, t, c, &outcome);
    if (c.warm && t.position == 0) {
      EXPECT_EQ(t.calls.of(DriverOp::kCreate), 0u) << c.name << ": a warm commit created";
    }
    return outcome;
  };
  if (c.failing_undo) {
    sweep.arm = arm_with_failing_undo;
    sweep.injections = 0;  // the undo's unmap fails only where something was mapped
  }
  return sweep;
}

TYPED_TEST_SUITE(FaultSweepTest, kt::AllBackends, kt::BackendNames);

// Single faults: every rollback succeeds, so every faulted commit restores the prior state.
TYPED_TEST(FaultSweepTest, CommitOneGranule) {
  const SweepResult r = run_sweep<TypeParam>(commit_sweep({.name = "commit k=1", .k = 1}));
  EXPECT_EQ(r.count(Outcome::kRestored), r.positions);
}

TYPED_TEST(FaultSweepTest, CommitTwoGranules) {
  const SweepResult r = run_sweep<TypeParam>(commit_sweep({.name = "commit k=2", .k = 2}));
  EXPECT_EQ(r.count(Outcome::kRestored), r.positions);
}

TYPED_TEST(FaultSweepTest, CommitFiveGranules) {
  const SweepResult r = run_sweep<TypeParam>(commit_sweep({.name = "commit k=5", .k = 5}));
  EXPECT_EQ(r.count(Outcome::kRestored), r.positions);
}

TYPED_TEST(FaultSweepTest, CommitFiveGranulesInTwoGranuleHandles) {
  const SweepResult r = run_sweep<TypeParam>(
      commit_sweep({.name = "commit k=5, 2-granule handles", .k = 5, .handle_granules = 2}));
  EXPECT_EQ(r.count(Outcome::kRestored), r.positions);
}

TYPED_TEST(FaultSweepTest, CommitFiveGranulesFromWarmPool) {
  const SweepResult r =
      run_sweep<TypeParam>(commit_sweep({.name = "commit k=5, warm pool", .k = 5, .warm = true}));
  EXPECT_EQ(r.count(Outcome::kRestored), r.positions);
}

TYPED_TEST(FaultSweepTest, CommitFiveGranulesPoolKeepsNothing) {
  const SweepResult r = run_sweep<TypeParam>(
      commit_sweep({.name = "commit k=5, pool bound 0", .k = 5, .max_pooled_bytes = 0}));
  EXPECT_EQ(r.count(Outcome::kRestored), r.positions);
}

// Double faults: a fault at position i and the rollback's first unmap. Whenever something
// was mapped before the fault (4 failing maps after the first, and the set_access) the
// residual must be reported; otherwise the state is restored.
TYPED_TEST(FaultSweepTest, CommitRollbackWithFailingUnmapReportsResidual) {
  const SweepResult r = run_sweep<TypeParam>(
      commit_sweep({.name = "commit k=5, failing rollback unmap", .k = 5, .failing_undo = true}));
  EXPECT_EQ(r.count(Outcome::kResidual), 5u);
  EXPECT_EQ(r.count(Outcome::kRestored), r.positions - 5);
}

// Three ranges, one transaction: 5 creates, 5 maps, 3 set_access calls.
TYPED_TEST(FaultSweepTest, CommitRanges) {
  const SweepResult r = run_sweep<TypeParam>(
      commit_sweep({.name = "commit_ranges 2+1+2", .ranges = {{2, 2}, {5, 1}, {7, 2}}}));
  EXPECT_EQ(r.positions, 13u);
  EXPECT_EQ(r.count(Outcome::kRestored), r.positions);
}

TYPED_TEST(FaultSweepTest, CommitRangesWithFailingUnmapReportsResidual) {
  const SweepResult r =
      run_sweep<TypeParam>(commit_sweep({.name = "commit_ranges 2+1+2, failing rollback unmap",
                                         .failing_undo = true,
                                         .ranges = {{2, 2}, {5, 1}, {7, 2}}}));
  EXPECT_EQ(r.count(Outcome::kResidual), 7u);  // maps 2..5 and the 3 set_access calls
  EXPECT_EQ(r.count(Outcome::kRestored), r.positions - 7);
}

}  // namespace
}  // namespace kvvm
