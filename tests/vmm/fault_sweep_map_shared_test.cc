// Fault sweeps (docs/ARCHITECTURE.md "Tests") of Reservation::map_shared: every driver call of the
// operation is made to fail in turn, and the outcome checked against its contract.
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
// map_shared: reservation 0 (the owner) holds a handle of `handle_granules` at [0, hg) and a
// neighbour at [hg, hg + 1); reservation 1 holds [0, 1) and maps (part of) the owner's handle
// read-only at granule 2.

struct ShareCase {
  std::string name;
  std::size_t handle_granules = 1;
  std::size_t handle_offset_granules = 0;
  std::size_t granules = 0;  // 0: to the handle's end
  bool failing_undo = false;
};

void check_share(Rig& rig, const Trial& t, const ShareCase& c, Outcome* outcome) {
  const std::string where = c.name + ", " + t.where();
  const std::size_t g = rig.g;
  const std::size_t offset = 2 * g;
  const std::size_t granules =
      c.granules != 0 ? c.granules : c.handle_granules - c.handle_offset_granules;
  const State after = capture(rig);
  const Handle handle = t.before.blocks[0].at(0).handle;
  Result<HandleInfo> info = rig.pool->describe(handle);
  ASSERT_TRUE(info.ok()) << where << ": " << info.status().to_string();

  ASSERT_EQ(kt::check_invariants(rig.world()), "") << where;
  // The owner's mappings never change, whatever happened to the sharer.
  EXPECT_EQ(show(after.blocks[0]), show(t.before.blocks[0])) << where << ": the owner changed";
  EXPECT_EQ(show(outside(after.blocks[1], offset, granules * g)),
            show(outside(t.before.blocks[1], offset, granules * g)))
      << where;
  const std::vector<Block> mapped = inside(after.blocks[1], offset, granules * g);

  bool residual = false;
  *outcome = t.status.ok() ? Outcome::kCompleted : Outcome::kRestored;
  if (t.status.ok()) {
    ASSERT_EQ(mapped.size(), 1u) << where << ": " << show(mapped);
    const Block& b = mapped[0];
    EXPECT_TRUE(b.offset == offset && b.bytes == granules * g && b.handle == handle &&
                b.handle_offset == c.handle_offset_granules * g && b.access == Access::kReadOnly &&
                b.shared && !b.poisoned)
        << where << ": " << show(b);
    EXPECT_EQ(info->state, HandleState::kInUse) << where;
    EXPECT_EQ(info->mappings, 2u) << where;
    share_seeds(rig, 0, c.handle_offset_granules, 1, 2, granules);
  } else {
    EXPECT_EQ(t.status.code(), StatusCode::kDriverError) << where << ": " << t.status.to_string();
    if (rig.at(1).residual_bytes() == t.before.residual[1]) {
      // Withdrawn: the handle stays with its owner, mapped exactly as often as before.
      EXPECT_TRUE(mapped.empty()) << where << ": " << show(mapped);
      EXPECT_FALSE(mentions(t.status, "poisoned")) << where << ": " << t.status.to_string();
      EXPECT_EQ(info->state, HandleState::kInUse) << where;
      EXPECT_EQ(info->mappings, 1u) << where << ": the handle's mapping count changed";
      EXPECT_EQ(after.pool.owned_bytes, t.before.pool.owned_bytes) << where;
      EXPECT_EQ(after.pool.mapped_bytes, t.before.pool.mapped_bytes) << where;
      EXPECT_EQ(after.pool.quarantined_bytes, t.before.pool.quarantined_bytes) << where;
      EXPECT_EQ(after.tier.used, t.before.tier.used) << where;
    } else {
      // set_access and the withdrawing unmap both failed: the sharer's block is poisoned and
      // the shared handle quarantined (never reused, still charged); the owner is unharmed.
      residual = true;
      *outcome = Outcome::kResidual;
      EXPECT_TRUE(mentions(t.status, "poisoned")) << where << ": " << t.status.to_string();
      ASSERT_EQ(mapped.size(), 1u) << where << ": " << show(mapped);
      EXPECT_TRUE(mapped[0].poisoned && mapped[0].handle == handle) << where << show(mapped[0]);
      EXPECT_EQ(rig.at(1).residual_bytes(), granules * g) << where;
      EXPECT_EQ(info->state, HandleState::kQuarantined) << where;
      EXPECT_EQ(after.pool.handles_quarantined, t.before.pool.handles_quarantined + 1) << where;
      EXPECT_EQ(after.tier.used, t.before.tier.used) << where;
    }
  }
  EXPECT_EQ(verify_content(rig), "") << where;

  if (residual) {
    // A quarantined handle cannot be shared again: refused, changing nothing.
    const std::uint64_t calls_before = rig.fault->counts().total();
    Result<HandleInfo> quarantined = rig.pool->describe(handle);
    ASSERT_TRUE(quarantined.ok());
    const Status again = rig.at(1).map_shared(5 * g, *quarantined);
    EXPECT_EQ(again.code(), StatusCode::kInvalidArgument) << where << ": " << again.to_string();
    EXPECT_EQ(rig.fault->counts().total(), calls_before) << where;
    EXPECT_EQ(rig.at(1).block_at(5 * g), nullptr) << where;
    // The owner can still release its mapping; the handle stays quarantined and charged
    // while the poisoned mapping keeps it.
    ASSERT_TRUE(rig.at(0).release(0, c.handle_granules * g).ok()) << where;
    Result<HandleInfo> later = rig.pool->describe(handle);
    ASSERT_TRUE(later.ok()) << where << ": " << later.status().to_string();
    EXPECT_EQ(later->state, HandleState::kQuarantined) << where;
    EXPECT_EQ(later->mappings, 1u) << where;
    ASSERT_EQ(kt::check_invariants(rig.world()), "") << where << ", owner released";
    EXPECT_EQ(verify_content(rig), "") << where << ", owner released";
  } else if (!t.status.ok()) {
    // Nothing was left half-done: the same mapping, retried without faults, succeeds.
    Result<HandleInfo> again = rig.pool->describe(handle);
    ASSERT_TRUE(again.ok());
    const Status retry = rig.at(1).map_shared(offset, *again, Access::kReadOnly,
                                              c.handle_offset_granules * g, c.granules * g);
    ASSERT_TRUE(retry.ok()) << where << ": retry failed: " << retry.to_string();
    share_seeds(rig, 0, c.handle_offset_granules, 1, 2, granules);
    ASSERT_EQ(kt::check_invariants(rig.world()), "") << where << ", retry";
    EXPECT_EQ(verify_content(rig), "") << where << ", retry";
  }
}

Sweep share_sweep(const ShareCase& c) {
  Sweep sweep;
  sweep.name = c.name;
  sweep.setup = [c](Rig& rig) {
    add_reservation(rig, 8);
    add_reservation(rig, 8);
    if (::testing::Test::HasFatalFailure()) return;
    ASSERT_TRUE(commit_granules(rig, 0, 0, c.handle_granules, c.handle_granules).ok());
    ASSERT_TRUE(commit_granules(rig, 0, c.handle_granules, 1).ok());
    ASSERT_TRUE(commit_granules(rig, 1, 0, 1).ok());
    fill(rig, 0, 0, c.handle_granules + 1);
    fill(rig, 1, 0, 1);
  };
  sweep.op = [c](Rig& rig) {
    Result<HandleInfo> info = rig.pool->describe(rig.at(0).block_at(0)->handle);
    if (!info.ok()) return info.status();
    return rig.at(1).map_shared(2 * rig.g, *info, Access::kReadOnly,
                                c.handle_offset_granules * rig.g, c.granules * rig.g);
  };
  sweep.check = [c](Rig& rig, const Trial& t) {
    Outcome outcome = Outcome::kCompleted;
    check_share(rig, t, c, &outcome);
    if (t.position > 0 && t.calls.failed(DriverOp::kMap) == 0) {
      // The map went through and set_access failed: exactly the withdraw path.
      EXPECT_EQ(t.calls.failed(DriverOp::kSetAccess), 1u) << c.name << ", " << t.where();
    }
    return outcome;
  };
  if (c.failing_undo) {
    sweep.arm = arm_with_failing_undo;
    sweep.injections = 0;
  }
  return sweep;
}

TYPED_TEST_SUITE(FaultSweepTest, kt::AllBackends, kt::BackendNames);

TYPED_TEST(FaultSweepTest, MapShared) {
  const SweepResult r = run_sweep<TypeParam>(share_sweep({.name = "map_shared"}));
  EXPECT_EQ(r.count(Outcome::kRestored), r.positions);
}

TYPED_TEST(FaultSweepTest, MapSharedPartOfHandle) {
  if (!this->real_->maps_handle_subranges()) {
    // This driver maps whole handles only (CUDA): the call is refused before any driver call.
    std::unique_ptr<Rig> rig = make_rig<TypeParam>(kNoPoolBound);
    ASSERT_TRUE(rig != nullptr);
    share_sweep({.name = "map_shared part", .handle_granules = 3}).setup(*rig);
    ASSERT_FALSE(::testing::Test::HasFatalFailure());
    const State before = capture(*rig);
    const std::uint64_t calls = rig->fault->counts().total();
    Result<HandleInfo> info = rig->pool->describe(rig->at(0).block_at(0)->handle);
    ASSERT_TRUE(info.ok());
    const Status status =
        rig->at(1).map_shared(2 * rig->g, *info, Access::kReadOnly, rig->g, rig->g);
    EXPECT_EQ(status.code(), StatusCode::kUnavailable) << status.to_string();
    EXPECT_EQ(rig->fault->counts().total(), calls);
    EXPECT_EQ(show(rig->at(1).blocks()), show(before.blocks[1]));
    EXPECT_EQ(kt::check_invariants(rig->world()), "");
    GTEST_SKIP() << "this driver maps whole handles only; the refusal was checked instead";
  }
  const SweepResult r =
      run_sweep<TypeParam>(share_sweep({.name = "map_shared part of a 3-granule handle",
                                        .handle_granules = 3,
                                        .handle_offset_granules = 1,
                                        .granules = 1}));
  EXPECT_EQ(r.count(Outcome::kRestored), r.positions);
}

// The map fails (restored), or set_access fails and so does the withdrawing unmap (residual).
TYPED_TEST(FaultSweepTest, MapSharedWithFailingWithdraw) {
  const SweepResult r = run_sweep<TypeParam>(share_sweep(
      {.name = "map_shared, failing withdraw", .handle_granules = 2, .failing_undo = true}));
  EXPECT_EQ(r.count(Outcome::kRestored), 1u);
  EXPECT_EQ(r.count(Outcome::kResidual), 1u);
}

// ---------------------------------------------------------------------------------------------
// map_shared_many: the owner (reservation 0) holds four one-granule handles at [0, 4); the sharer
// (reservation 1) holds [0, 1) and maps them read-only in one transaction at granules 2, 3, 4
// (one run) and 6 (a second run), given out of order. Four maps and two access changes; any
// failure withdraws every mapping.

constexpr std::size_t kManyAt[] = {6, 2, 4, 3};  // sharer granule of owner handle i

void check_share_many(Rig& rig, const Trial& t, Outcome* outcome) {
  const std::string where = "map_shared_many, " + t.where();
  const std::size_t g = rig.g;
  const State after = capture(rig);
  ASSERT_EQ(kt::check_invariants(rig.world()), "") << where;
  EXPECT_EQ(show(after.blocks[0]), show(t.before.blocks[0])) << where << ": the owner changed";
  EXPECT_EQ(show(outside(after.blocks[1], 2 * g, 5 * g)),
            show(outside(t.before.blocks[1], 2 * g, 5 * g)))
      << where;
  const std::vector<Block> mapped = inside(after.blocks[1], 2 * g, 5 * g);
  std::vector<HandleInfo> infos;
  for (std::size_t i = 0; i < 4; ++i) {
    Result<HandleInfo> info = rig.pool->describe(t.before.blocks[0].at(i).handle);
    ASSERT_TRUE(info.ok()) << where << ": " << info.status().to_string();
    infos.push_back(*info);
  }
  *outcome = t.status.ok() ? Outcome::kCompleted : Outcome::kRestored;
  if (t.status.ok()) {
    ASSERT_EQ(mapped.size(), 4u) << where << ": " << show(mapped);
    for (std::size_t i = 0; i < 4; ++i) {
      const Block* b = rig.at(1).block_at(kManyAt[i] * g);
      ASSERT_NE(b, nullptr) << where << ", handle " << i;
      EXPECT_TRUE(b->bytes == g && b->handle == infos[i].handle && b->access == Access::kReadOnly &&
                  b->shared && !b->poisoned)
          << where << ": " << show(*b);
      EXPECT_EQ(infos[i].mappings, 2u) << where << ", handle " << i;
      share_seeds(rig, 0, i, 1, kManyAt[i], 1);
    }
    // One access change per run of contiguous windows, not per window.
    EXPECT_EQ(t.calls.of(DriverOp::kMap), 4u) << where;
    EXPECT_EQ(t.calls.of(DriverOp::kSetAccess), 2u) << where;
  } else {
    EXPECT_EQ(t.status.code(), StatusCode::kDriverError) << where << ": " << t.status.to_string();
    EXPECT_TRUE(mentions(t.status, "withdrawn")) << where << ": " << t.status.to_string();
    if (rig.at(1).residual_bytes() == t.before.residual[1]) {
      // Withdrawn: nothing mapped, every handle with its owner, counted as before.
      EXPECT_TRUE(mapped.empty()) << where << ": " << show(mapped);
      for (const HandleInfo& info : infos) {
        EXPECT_EQ(info.state, HandleState::kInUse) << where;
        EXPECT_EQ(info.mappings, 1u) << where << ": handle " << info.handle;
      }
      EXPECT_EQ(after.pool.mapped_bytes, t.before.pool.mapped_bytes) << where;
      EXPECT_EQ(after.pool.quarantined_bytes, t.before.pool.quarantined_bytes) << where;
      EXPECT_EQ(after.tier.used, t.before.tier.used) << where;
    } else {
      // An access change failed and so did a withdrawing unmap: that block is poisoned (its
      // handle quarantined), named in the error; the others are withdrawn.
      *outcome = Outcome::kResidual;
      EXPECT_TRUE(mentions(t.status, "poisoned")) << where << ": " << t.status.to_string();
      ASSERT_EQ(mapped.size(), 1u) << where << ": " << show(mapped);
      EXPECT_TRUE(mapped[0].poisoned) << where << ": " << show(mapped[0]);
      EXPECT_EQ(rig.at(1).residual_bytes(), g) << where;
      EXPECT_EQ(after.pool.handles_quarantined, t.before.pool.handles_quarantined + 1) << where;
      EXPECT_EQ(after.tier.used, t.before.tier.used) << where;
    }
  }
  EXPECT_EQ(verify_content(rig), "") << where;
}

Sweep share_many_sweep(bool failing_undo) {
  Sweep sweep;
  sweep.name = "map_shared_many";
  sweep.setup = [](Rig& rig) {
    add_reservation(rig, 8);
    add_reservation(rig, 8);
    if (::testing::Test::HasFatalFailure()) return;
    ASSERT_TRUE(commit_granules(rig, 0, 0, 4).ok());
    ASSERT_TRUE(commit_granules(rig, 1, 0, 1).ok());
    fill(rig, 0, 0, 4);
    fill(rig, 1, 0, 1);
  };
  sweep.op = [](Rig& rig) {
    std::vector<Reservation::SharedMapping> mappings;
    for (std::size_t i = 0; i < 4; ++i) {
      Result<HandleInfo> info = rig.pool->describe(rig.at(0).block_at(i * rig.g)->handle);
      if (!info.ok()) return info.status();
      mappings.push_back({kManyAt[i] * rig.g, *info});
    }
    return rig.at(1).map_shared_many(mappings, Access::kReadOnly);
  };
  sweep.check = [](Rig& rig, const Trial& t) {
    Outcome outcome = Outcome::kCompleted;
    check_share_many(rig, t, &outcome);
    return outcome;
  };
  if (failing_undo) {
    sweep.arm = arm_with_failing_undo;
    sweep.injections = 0;
  }
  return sweep;
}

TYPED_TEST(FaultSweepTest, MapSharedMany) {
  const SweepResult r = run_sweep<TypeParam>(share_many_sweep(false));
  EXPECT_EQ(r.positions, 6u);  // 4 maps, 2 access changes
  EXPECT_EQ(r.count(Outcome::kRestored), r.positions);
}

// A failed map or access change whose withdrawing unmap fails too: the first unmap of the undo
// (the last block mapped) is left poisoned, the rest withdrawn.
TYPED_TEST(FaultSweepTest, MapSharedManyWithFailingWithdraw) {
  const SweepResult r = run_sweep<TypeParam>(share_many_sweep(true));
  EXPECT_GE(r.count(Outcome::kResidual), 1u);
  EXPECT_EQ(r.count(Outcome::kRestored) + r.count(Outcome::kResidual), r.positions);
}

// Refused before any driver call: overlapping mappings of one call, a window already mapped, a
// handle of another granule.
TEST(ReservationMapSharedMany, BadMappingsAreRefusedBeforeAnyDriverCall) {
  std::unique_ptr<Rig> rig = make_rig<kt::HostPageBackend>(kNoPoolBound);
  ASSERT_TRUE(rig != nullptr);
  share_many_sweep(false).setup(*rig);
  ASSERT_FALSE(::testing::Test::HasFatalFailure());
  const std::size_t g = rig->g;
  Result<HandleInfo> a = rig->pool->describe(rig->at(0).block_at(0)->handle);
  Result<HandleInfo> b = rig->pool->describe(rig->at(0).block_at(g)->handle);
  ASSERT_TRUE(a.ok() && b.ok());
  const std::uint64_t calls = rig->fault->counts().total();
  Status refused = rig->at(1).map_shared_many({{3 * g, *a}, {3 * g, *b}});
  EXPECT_EQ(refused.code(), StatusCode::kInvalidArgument) << refused.to_string();
  EXPECT_TRUE(mentions(refused, "of the same transaction")) << refused.to_string();
  refused = rig->at(1).map_shared_many({{3 * g, *a}, {0, *b}});  // [0, 1) is the sharer's own
  EXPECT_EQ(refused.code(), StatusCode::kInvalidArgument) << refused.to_string();
  EXPECT_TRUE(mentions(refused, "overlaps the mapped block")) << refused.to_string();
  HandleInfo other = *a;
  other.granule = 2 * g;
  refused = rig->at(1).map_shared_many({{3 * g, other}});
  EXPECT_EQ(refused.code(), StatusCode::kInvalidArgument) << refused.to_string();
  EXPECT_EQ(rig->fault->counts().total(), calls);
  EXPECT_TRUE(inside(rig->at(1).blocks(), 2 * g, 6 * g).empty());
  EXPECT_EQ(kt::check_invariants(rig->world()), "");
  EXPECT_TRUE(rig->at(1).map_shared_many({}).ok());
}

}  // namespace
}  // namespace kvvm
