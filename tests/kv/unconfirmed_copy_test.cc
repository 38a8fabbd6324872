// A failed fence must never free what a copy may still write (invariant 6). When the fence
// after a boundary copy or a copy-on-write fails, the copy's completion is unknown: the memory
// it writes and reads stays mapped and charged, counted in the arena's stats as unconfirmed,
// and goes only once a later fence on its stream completes.
//
// The fault driver keeps a copy "in flight" until a fence after it completes, whatever the
// backend (the host copies at once) and records any unmap over it, which the invariant check
// reports; so these tests fail on the host as on a GPU when such memory is unmapped early.
#include <gtest/gtest.h>

#include "support/arena_fixture.h"

namespace kvvm {
namespace {

template <typename Backend>
class UnconfirmedCopyTest : public testing::ArenaFixture<Backend> {
 protected:
  // An owner that wrote `length_` tokens and published `p_` of them (two whole windows and a
  // boundary of half a window), in a token-major arena of 6 slots.
  Arena& make_scene() {
    Arena& arena = this->make_arena(Layout::kTokenMajor, 6, 8);
    const std::uint64_t pw = this->tokens_for_windows(arena.plan(), 1);
    p_ = 2 * pw + std::max<std::uint64_t>(1, pw / 2);
    length_ = 3 * pw + 1;
    seed_ = testing::fresh_seed();
    auto owner = arena.admit(length_);
    EXPECT_TRUE(owner.ok()) << owner.status().to_string();
    owner_ = *owner;
    this->write_tokens(arena, owner_, 0, length_, seed_);
    auto prefix = arena.publish(owner_, p_);
    EXPECT_TRUE(prefix.ok()) << prefix.status().to_string();
    prefix_ = *prefix;
    return arena;
  }
  void expect_invariants() { EXPECT_EQ(testing::check_invariants(this->world()), ""); }

  SlotId owner_ = 0;
  std::shared_ptr<SharedPrefix> prefix_;
  std::uint64_t p_ = 0, length_ = 0, seed_ = 0;
};
TYPED_TEST_SUITE(UnconfirmedCopyTest, testing::AllBackends, testing::BackendNames);

TYPED_TEST(UnconfirmedCopyTest, AFailedBoundaryFenceKeepsTheSlotMappedUntilALaterFence) {
  // The boundary copy's fence: recorded (call 1) or waited for (call 2), each refused in turn.
  for (std::uint64_t call : {1u, 2u}) {
    SCOPED_TRACE("fence call " + std::to_string(call) + " fails");
    Arena& arena = this->make_scene();
    const ArenaStats before = arena.stats();
    this->fault_->fail_nth(DriverOp::kFence, call);
    auto refused = arena.admit_shared(*this->prefix_, this->p_);
    this->fault_->clear();
    ASSERT_FALSE(refused.ok());
    EXPECT_NE(refused.status().to_string().find("until a later fence"), std::string::npos)
        << refused.status().to_string();
    EXPECT_GT(this->fault_->copies_in_flight(), 0u) << "no fence after the copy completed";
    this->expect_invariants();  // nothing the copy touches was unmapped

    // Kept: the target's windows (a finished sharer's slot, not admitted) and the source's.
    const ArenaStats kept = arena.stats();
    EXPECT_EQ(kept.admissions, before.admissions);
    EXPECT_EQ(kept.unconfirmed_copies, before.unconfirmed_copies + 1);
    EXPECT_EQ(kept.unconfirmed_slots, 2u) << "the target and the source";
    EXPECT_GT(kept.committed_bytes, before.committed_bytes);
    EXPECT_GE(kept.unconfirmed_bytes, kept.committed_bytes - before.committed_bytes);
    EXPECT_EQ(kept.finished_slots, before.finished_slots + 1);

    // Another sharer is admitted elsewhere, and reads the prefix intact.
    auto again = arena.admit_shared(*this->prefix_, this->p_);
    ASSERT_TRUE(again.ok()) << again.status().to_string();
    this->expect_tokens(arena, *again, 0, this->p_, this->seed_);
    ASSERT_TRUE(arena.release(*again).ok());

    // A reclaim records a fence after the copy; once it completed the target's windows go.
    EXPECT_GT(arena.reclaim(kept.committed_bytes), 0u);
    EXPECT_EQ(this->fault_->copies_in_flight(), 0u);
    EXPECT_EQ(arena.stats().unconfirmed_slots, 1u) << "the source, still running";
    this->expect_invariants();
    // The source's finish and release confirm its side too.
    ASSERT_TRUE(arena.release(this->owner_).ok());
    EXPECT_EQ(arena.stats().unconfirmed_slots, 0u);
    EXPECT_EQ(arena.stats().unconfirmed_bytes, 0u);
    this->prefix_.reset();
    this->expect_invariants();
  }
}

TYPED_TEST(UnconfirmedCopyTest, AFailedCopyOnWriteFenceKeepsItsLaneUntilALaterFence) {
  for (std::uint64_t call : {1u, 2u}) {
    SCOPED_TRACE("fence call " + std::to_string(call) + " fails");
    Arena& arena = this->make_scene();
    auto sharer = arena.admit_shared(*this->prefix_, this->p_);
    ASSERT_TRUE(sharer.ok()) << sharer.status().to_string();
    // The sharer rewinds into window 1 (shared, read-only) and writes a token there.
    const std::uint64_t at = this->tokens_for_windows(arena.plan(), 1) + 1;
    ASSERT_TRUE(arena.rewind(*sharer, at).ok());
    const ArenaStats before = arena.stats();
    this->fault_->fail_nth(DriverOp::kFence, call);
    Status refused = arena.ensure(*sharer, at + 1);
    this->fault_->clear();
    ASSERT_FALSE(refused.ok());
    EXPECT_NE(refused.to_string().find("until a later fence"), std::string::npos)
        << refused.to_string();
    EXPECT_EQ(this->fault_->copies_in_flight(), 1u);
    this->expect_invariants();
    const ArenaStats kept = arena.stats();
    EXPECT_EQ(kept.cow_copies, before.cow_copies);
    EXPECT_EQ(kept.unconfirmed_lanes, 1u);
    EXPECT_EQ(kept.unconfirmed_slots, 1u) << "the sharer, whose window the copy reads";
    // The sharer's windows (two shared, the boundary's) and the lane's granule.
    const LayoutPlan& plan = arena.plan();
    EXPECT_EQ(kept.unconfirmed_bytes,
              plan.fragments * plan.windows_per_fragment(this->p_) * this->g_ + this->g_);
    // The retry settles the lane first (a fence that completes), then copies afresh.
    ASSERT_TRUE(arena.ensure(*sharer, at + 1).ok());
    EXPECT_EQ(this->fault_->copies_in_flight(), 0u);
    EXPECT_EQ(arena.stats().unconfirmed_lanes, 0u);
    EXPECT_EQ(arena.stats().cow_copies, before.cow_copies + 1);
    this->write_tokens(arena, *sharer, at, at + 1, this->seed_ ^ 5);
    this->expect_tokens(arena, this->owner_, 0, this->p_, this->seed_);
    this->expect_invariants();
    ASSERT_TRUE(arena.release(*sharer).ok());
    EXPECT_EQ(arena.stats().unconfirmed_slots, 0u);
    this->prefix_.reset();
  }
}

}  // namespace
}  // namespace kvvm
