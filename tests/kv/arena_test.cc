// Arena behaviour on every backend: growth without moving or copying, reuse of a finished
// slot without a driver call, reclamation before refusal, commit-ahead, the capture guard and
// refusal of bad input.
#include "kvvm/kv/arena.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <functional>
#include <thread>

#include "kvvm/vmm/fault_driver.h"
#include "support/arena_fixture.h"
#include "support/backends.h"
#include "support/fault_sweep.h"
#include "support/invariants.h"
#include "support/pattern.h"

namespace kvvm {
namespace {

template <typename Backend>
class ArenaTest : public testing::ArenaFixture<Backend> {};
using testing::small_geometry;

TYPED_TEST_SUITE(ArenaTest, testing::AllBackends, testing::BackendNames);

TYPED_TEST(ArenaTest, GrowsAcrossWindowsWithoutMovingOrCopyingInEveryLayout) {
  for (Layout layout : all_layouts()) {
    SCOPED_TRACE(std::string(to_string(layout)));
    Arena& arena = this->make_arena(layout, 2, 8);
    const LayoutPlan& plan = arena.plan();
    auto slot = arena.admit(1);
    ASSERT_TRUE(slot.ok()) << slot.status().to_string();
    const Address base = arena.slot_base(*slot);
    const std::uint64_t seed = testing::fresh_seed();
    const std::uint64_t per_window = this->tokens_for_windows(plan, 1);
    const auto before = this->fault_->counts();
    std::uint64_t written = 0;
    // Grow across five windows in uneven steps, writing each new token.
    for (std::uint64_t tokens : {std::uint64_t{1}, per_window - 1, per_window, per_window + 1,
                                 3 * per_window + 2, 5 * per_window}) {
      ASSERT_TRUE(arena.ensure(*slot, tokens).ok());
      this->write_tokens(arena, *slot, written, tokens, seed);
      written = tokens;
      ASSERT_EQ(arena.slot_base(*slot), base);
    }
    const auto after = this->fault_->counts();
    EXPECT_EQ(after.of(DriverOp::kUnmap), before.of(DriverOp::kUnmap)) << "growth unmaps nothing";
    EXPECT_EQ(after.of(DriverOp::kRelease), before.of(DriverOp::kRelease));
    EXPECT_EQ(after.of(DriverOp::kReserve), before.of(DriverOp::kReserve));
    EXPECT_EQ(after.of(DriverOp::kMap) - before.of(DriverOp::kMap), 4 * plan.fragments)
        << "windows 2..5 of every fragment, one handle each";
    this->expect_tokens(arena, *slot, 0, written, seed);
    const ArenaStats stats = arena.stats();
    EXPECT_EQ(stats.committed_bytes, plan.commit_floor(written));
    EXPECT_EQ(stats.live_bytes, written * plan.bytes_per_token);
    EXPECT_EQ(arena.reservation().mapped_bytes(), plan.commit_floor(written));
    EXPECT_EQ(testing::check_invariants(this->world()), "");
    this->arena_.reset();
    EXPECT_EQ(testing::check_invariants(this->world()), "");
  }
}

TYPED_TEST(ArenaTest, ASecondRequestOfTheSameSizeReusesTheFinishedSlotWithNoDriverCall) {
  Arena& arena = this->make_arena(Layout::kTokenMajor, 4, 8);
  const std::uint64_t tokens = this->tokens_for_windows(arena.plan(), 3);
  auto first = arena.admit(tokens);
  ASSERT_TRUE(first.ok());
  ASSERT_TRUE(arena.finish(*first).ok());
  const auto before = this->fault_->counts();
  auto second = arena.admit(tokens);
  ASSERT_TRUE(second.ok()) << second.status().to_string();
  EXPECT_EQ(*second, *first) << "the finished slot fits best";
  EXPECT_EQ(this->fault_->counts().total(), before.total()) << "zero driver calls";
  EXPECT_EQ(arena.stats().reused_admissions, 1u);
  // A smaller request also prefers the mapped slot over a free one.
  ASSERT_TRUE(arena.finish(*second).ok());
  auto third = arena.admit(1);
  ASSERT_TRUE(third.ok());
  EXPECT_EQ(*third, *first);
  EXPECT_EQ(testing::check_invariants(this->world()), "");
}

TYPED_TEST(ArenaTest, ReclaimsFinishedWindowsBeforeRefusingAndRefusesWithNumbers) {
  // A tier of 8 windows: two finished sequences of 3 windows, then a request for 5.
  this->make_budget(8, 0);
  Arena& arena = this->make_arena(Layout::kTokenMajor, 4, 8);
  const LayoutPlan& plan = arena.plan();
  auto a = arena.admit(this->tokens_for_windows(plan, 3));
  auto b = arena.admit(this->tokens_for_windows(plan, 3));
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_TRUE(arena.finish(*a).ok());
  ASSERT_TRUE(arena.finish(*b).ok());
  EXPECT_EQ(this->governor_->stats(this->tier_).used, 6 * this->g_);
  auto c = arena.admit(this->tokens_for_windows(plan, 5) + 1);  // 6 windows
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_GE(arena.stats().reclaimed_bytes, 3 * this->g_);
  EXPECT_EQ(testing::check_invariants(this->world()), "");
  // Nothing left to reclaim: 6 of 8 in use by an active sequence.
  auto d = arena.admit(this->tokens_for_windows(plan, 3));
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().code(), StatusCode::kResourceExhausted) << d.status().to_string();
  ASSERT_TRUE(d.status().exhaustion().has_value());
  EXPECT_EQ(d.status().exhaustion()->limit, 8 * this->g_);
  EXPECT_EQ(d.status().exhaustion()->requested, 3 * this->g_);
  EXPECT_EQ(arena.stats().refusals, 1u);
  EXPECT_EQ(testing::check_invariants(this->world()), "");
}

TYPED_TEST(ArenaTest, CommitAheadKeepsTheLeadSoEnsureFindsWindowsMapped) {
  Arena& arena = this->make_arena(Layout::kTokenMajor, 2, 16, /*ahead=*/2);
  const std::uint64_t per_window = this->tokens_for_windows(arena.plan(), 1);
  auto slot = arena.admit(1);
  ASSERT_TRUE(slot.ok());
  arena.wait_until_idle();
  EXPECT_EQ(arena.stats().committed_bytes, 3 * this->g_) << "1 live window + 2 ahead";
  const auto committing = arena.stats().ensures_committing;
  for (std::uint64_t tokens = 2; tokens <= 6 * per_window; tokens += per_window / 2 + 1) {
    arena.wait_until_idle();
    ASSERT_TRUE(arena.ensure(*slot, tokens).ok());
  }
  EXPECT_EQ(arena.stats().ensures_committing, committing) << "the worker was always ahead";
  EXPECT_GT(arena.stats().ahead_commits, 0u);
  arena.wait_until_idle();
  EXPECT_EQ(testing::check_invariants(this->world()), "");
}

TYPED_TEST(ArenaTest, EnsureAndTheWorkerRunConcurrently) {
  Arena& arena = this->make_arena(Layout::kSeqMajor, 4, 16, /*ahead=*/1);
  const std::uint64_t max = arena.plan().max_context;
  std::vector<SlotId> slots;
  for (int i = 0; i < 4; ++i) slots.push_back(*arena.admit(1));
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (SlotId slot : slots) {
    threads.emplace_back([&, slot] {
      for (std::uint64_t t = 1; t <= max; t += 7) {
        if (!arena.ensure(slot, t).ok()) ++failures;
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(failures.load(), 0);
  arena.wait_until_idle();
  EXPECT_EQ(testing::check_invariants(this->world()), "");
}

TYPED_TEST(ArenaTest, TheCaptureGuardRefusesMappingAndPausesTheWorker) {
  Arena& arena = this->make_arena(Layout::kTokenMajor, 2, 16, /*ahead=*/1);
  const std::uint64_t per_window = this->tokens_for_windows(arena.plan(), 1);
  auto slot = arena.admit(1);
  ASSERT_TRUE(slot.ok());
  arena.wait_until_idle();
  const auto calls = this->fault_->counts().total();
  {
    auto guard = arena.begin_capture();
    // Within the mapped windows: fine (no driver call).
    EXPECT_TRUE(arena.ensure(*slot, per_window + 1).ok());
    Status refused = arena.ensure(*slot, 5 * per_window);
    EXPECT_EQ(refused.code(), StatusCode::kUnavailable) << refused.to_string();
    EXPECT_NE(refused.message().find("during graph capture"), std::string::npos);
    EXPECT_EQ(arena.admit(1).status().code(), StatusCode::kUnavailable);
    EXPECT_EQ(arena.finish(*slot).code(), StatusCode::kUnavailable);
    EXPECT_EQ(arena.reclaim(UINT64_MAX), 0u);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // give the worker a chance
    EXPECT_EQ(this->fault_->counts().total(), calls) << "no driver call during capture";
  }
  arena.wait_until_idle();
  EXPECT_EQ(arena.stats().committed_bytes, 3 * this->g_) << "the worker resumed after capture";
  EXPECT_TRUE(arena.ensure(*slot, 3 * per_window).ok());
}

TYPED_TEST(ArenaTest, FinishedWindowsAreUnmappedOnlyByReclaim) {
  Arena& arena = this->make_arena(Layout::kHeadMajor, 2, 4);
  auto slot = arena.admit(this->tokens_for_windows(arena.plan(), 2));
  ASSERT_TRUE(slot.ok());
  const auto unmaps = this->fault_->counts().of(DriverOp::kUnmap);
  ASSERT_TRUE(arena.finish(*slot).ok());
  EXPECT_EQ(this->fault_->counts().of(DriverOp::kUnmap), unmaps) << "finish keeps windows";
  EXPECT_EQ(arena.stats().reclaimable_bytes, 2 * arena.plan().fragments * this->g_);
  arena.reclaim(UINT64_MAX);
  EXPECT_EQ(arena.stats().committed_bytes, 0u);
  EXPECT_EQ(arena.reservation().mapped_bytes(), 0u);
  EXPECT_EQ(testing::check_invariants(this->world()), "");
}

TYPED_TEST(ArenaTest, BadInputIsRefusedAndChangesNothing) {
  Arena& arena = this->make_arena(Layout::kTokenMajor, 2, 4);
  const std::uint64_t max = arena.plan().max_context;
  EXPECT_EQ(arena.admit(max + 1).status().code(), StatusCode::kInvalidArgument);
  auto slot = arena.admit(1);
  ASSERT_TRUE(slot.ok());
  const auto calls = this->fault_->counts().total();
  Status beyond = arena.ensure(*slot, max + 1);
  EXPECT_EQ(beyond.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(beyond.message().find(std::to_string(max)), std::string::npos);
  EXPECT_EQ(arena.ensure(7, 1).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(arena.ensure(1 - *slot, 1).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(arena.finish(1 - *slot).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(this->fault_->counts().total(), calls);
  ASSERT_TRUE(arena.admit(1).ok());
  EXPECT_EQ(arena.admit(1).status().code(), StatusCode::kUnavailable) << "both slots taken";
  // Too many slots for the address space: 1,024 slots of 1 TiB.
  auto wide = plan_layout(small_geometry(), Layout::kTokenMajor, this->g_, 1ull << 30);
  ASSERT_TRUE(wide.ok());
  auto huge =
      Arena::create(*this->pool_, *this->governor_,
                    ArenaOptions{*wide, 1024, this->tier_, 0, std::chrono::milliseconds(0)});
  ASSERT_FALSE(huge.ok());
  EXPECT_NE(huge.status().message().find("too many slots"), std::string::npos)
      << huge.status().to_string();
  auto none =
      Arena::create(*this->pool_, *this->governor_,
                    ArenaOptions{arena.plan(), 0, this->tier_, 0, std::chrono::milliseconds(0)});
  EXPECT_EQ(none.status().code(), StatusCode::kInvalidArgument);
  auto plan = arena.plan();
  plan.granule *= 2;
  auto mismatched =
      Arena::create(*this->pool_, *this->governor_,
                    ArenaOptions{plan, 1, this->tier_, 0, std::chrono::milliseconds(0)});
  EXPECT_EQ(mismatched.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(testing::check_invariants(this->world()), "");
}

// Every driver call of ensure (across several windows and fragments) and of reclaim is made
// to fail in turn; the arena and the layers below stay consistent after each.
TYPED_TEST(ArenaTest, FaultSweepOverEnsureAndReclaim) {
  for (const bool sweep_reclaim : {false, true}) {
    SlotId slot = 0;
    std::uint64_t per_window = 0;
    ArenaStats before;
    testing::FaultSweep sweep;
    sweep.name = sweep_reclaim ? "arena reclaim" : "arena ensure";
    sweep.fault = [this]() -> FaultDriver& { return *this->fault_; };
    sweep.world = [this] { return this->world(); };
    sweep.run = [&](const std::function<void()>& arm, Status& status) {
      this->arena_.reset();
      Arena& arena = this->make_arena(Layout::kSeqMajor, 2, 4);
      per_window = this->tokens_for_windows(arena.plan(), 1);
      auto admitted = arena.admit(1);
      ASSERT_TRUE(admitted.ok());
      slot = *admitted;
      if (sweep_reclaim) {
        ASSERT_TRUE(arena.ensure(slot, 3 * per_window).ok());
        ASSERT_TRUE(arena.finish(slot).ok());
      }
      before = arena.stats();
      arm();
      if (sweep_reclaim) {
        arena.reclaim(UINT64_MAX);
      } else {
        status = arena.ensure(slot, 3 * per_window);
      }
    };
    sweep.check = [&](const Status& status) {
      Arena& arena = *this->arena_;
      const ArenaStats after = arena.stats();
      // The arena's own books agree with the reservation's, whatever happened.
      if (after.quarantined_slots == 0) {
        EXPECT_EQ(after.committed_bytes, arena.reservation().mapped_bytes());
      }
      if (!sweep_reclaim && !status.ok() && after.quarantined_slots == 0) {
        EXPECT_EQ(after.committed_bytes, before.committed_bytes) << "rolled back exactly";
        EXPECT_TRUE(arena.ensure(slot, 3 * per_window).ok()) << "and can be retried";
      }
    };
    EXPECT_GT(testing::sweep_faults(sweep), 2u);
  }
}

}  // namespace
}  // namespace kvvm

namespace kvvm {
namespace {

template <typename Backend>
class ArenaDummyTest : public ArenaTest<Backend> {
 protected:
  Arena& make_padded(std::uint64_t windows) {
    auto plan = plan_layout(small_geometry(), Layout::kSeqMajor, this->g_,
                            windows * this->g_ / 256);  // seq-major: H x D x e = 256 B per token
    EXPECT_TRUE(plan.ok()) << plan.status().to_string();
    ArenaOptions options{*plan, 2, this->tier_, 0, std::chrono::milliseconds(0)};
    options.padded_tokens = plan->max_context;
    auto arena = Arena::create(*this->pool_, *this->governor_, options);
    EXPECT_TRUE(arena.ok()) << arena.status().to_string();
    this->arena_ = std::move(arena).value();
    return *this->arena_;
  }
  // Every window of every fragment in [from, to) is mapped read-only and reads zeros.
  void expect_dummy(const Arena& arena, SlotId slot, std::uint64_t from, std::uint64_t to) {
    const LayoutPlan& plan = arena.plan();
    std::vector<std::uint8_t> seen(plan.granule, 0xff);
    const std::vector<std::uint8_t> zeros(plan.granule, 0);
    for (std::uint64_t f = 0; f < plan.fragments; ++f) {
      for (std::uint64_t w = from; w < to; ++w) {
        const std::size_t offset =
            slot * plan.slot_stride + f * plan.fragment_stride + w * plan.granule;
        const Block* block = arena.reservation().block_at(offset);
        ASSERT_NE(block, nullptr) << "fragment " << f << " window " << w << " unmapped";
        EXPECT_TRUE(block->shared) << "slot " << slot << " fragment " << f << " window " << w;
        EXPECT_EQ(block->access, Access::kReadOnly);
        ASSERT_TRUE(
            this->fault_->read(seen.data(), arena.reservation().base() + offset, seen.size()).ok());
        ASSERT_EQ(seen, zeros) << "fragment " << f << " window " << w;
      }
    }
  }
};
TYPED_TEST_SUITE(ArenaDummyTest, testing::AllBackends, testing::BackendNames);

TYPED_TEST(ArenaDummyTest, PaddedTailReadsZerosIsBilledOnceAndGrowthReplacesIt) {
  Arena& arena = this->make_padded(6);
  const LayoutPlan& plan = arena.plan();
  const std::uint64_t per_window = this->g_ / plan.contiguous_bytes_per_token;
  auto a = arena.admit(1);
  auto b = arena.admit(1);
  ASSERT_TRUE(a.ok() && b.ok()) << a.status().to_string() << b.status().to_string();
  this->expect_dummy(arena, *a, 1, 6);
  this->expect_dummy(arena, *b, 1, 6);
  // Two slots, each one real window per fragment, plus the dummy granule once.
  EXPECT_EQ(this->governor_->stats(this->tier_).used, 2 * plan.fragments * this->g_ + this->g_);
  EXPECT_EQ(arena.stats().dummy_bytes, this->g_);
  EXPECT_EQ(arena.stats().dummy_windows, 2 * plan.fragments * 5);
  ASSERT_TRUE(arena.ensure(*a, 3 * per_window).ok());
  this->expect_dummy(arena, *a, 3, 6);
  this->write_tokens(arena, *a, 0, 3 * per_window, 7);
  this->expect_tokens(arena, *a, 0, 3 * per_window, 7);
  this->expect_dummy(arena, *b, 1, 6);  // the other slot's dummy is untouched by a's writes
  EXPECT_EQ(this->governor_->stats(this->tier_).used, 4 * plan.fragments * this->g_ + this->g_);
  EXPECT_EQ(testing::check_invariants(this->world()), "");
  // Reclaiming a finished slot and admitting again covers the tail again.
  ASSERT_TRUE(arena.finish(*a).ok());
  arena.reclaim(UINT64_MAX);
  auto c = arena.admit(1);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  this->expect_dummy(arena, *c, 1, 6);
  EXPECT_EQ(testing::check_invariants(this->world()), "");
}

TYPED_TEST(ArenaDummyTest, FaultSweepOverDummyReplacementRestoresTheDummy) {
  SlotId slot = 0;
  std::uint64_t per_window = 0;
  testing::FaultSweep sweep;
  sweep.name = "arena ensure over the dummy tail page";
  sweep.fault = [this]() -> FaultDriver& { return *this->fault_; };
  sweep.world = [this] { return this->world(); };
  sweep.run = [&](const std::function<void()>& arm, Status& status) {
    this->make_budget(4096, 64);
    Arena& arena = this->make_padded(6);
    per_window = this->g_ / arena.plan().contiguous_bytes_per_token;
    auto admitted = arena.admit(1);
    ASSERT_TRUE(admitted.ok());
    slot = *admitted;
    arm();
    status = arena.ensure(slot, 4 * per_window);
  };
  sweep.check = [&](const Status& status) {
    Arena& arena = *this->arena_;
    const ArenaStats stats = arena.stats();
    if (status.ok()) {
      this->expect_dummy(arena, slot, 4, 6);
    } else if (stats.quarantined_slots == 0 && stats.dummy_restore_failures == 0) {
      this->expect_dummy(arena, slot, 1, 6);  // the dummy is back where it was
      EXPECT_TRUE(arena.ensure(slot, 4 * per_window).ok()) << "and growth can be retried";
      this->expect_dummy(arena, slot, 4, 6);
    }
  };
  EXPECT_GT(testing::sweep_faults(sweep), 4u);
}

}  // namespace
}  // namespace kvvm
