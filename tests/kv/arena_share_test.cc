// Shared prefixes, fork and copy-on-write on every backend: bytes charged once, lifetime as
// the union of users, content, hardware write protection, divergence after fork, and refusals.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>

#include "kvvm/vmm/host_driver.h"
#include "support/arena_fixture.h"

#if defined(KVVM_HAS_CUDA_KERNELS)
#include "kernels/spin_reader.h"
#include "support/write_kernel.h"
#endif

namespace kvvm {
namespace {

template <typename Backend>
class ArenaShareTest : public testing::ArenaFixture<Backend> {
 protected:
  // The handles mapped at windows [0, windows) of fragment 0 of the slot.
  std::vector<HandleInfo> window_handles(const Arena& arena, SlotId slot, std::uint64_t windows) {
    std::vector<HandleInfo> list;
    const LayoutPlan& plan = arena.plan();
    for (const Block& block :
         arena.reservation().blocks_in(slot * plan.slot_stride, windows * plan.granule)) {
      auto info = this->pool_->describe(block.handle);
      EXPECT_TRUE(info.ok());
      if (info.ok()) list.push_back(*info);
    }
    return list;
  }
  std::uint32_t mappings(Handle handle) {
    auto info = this->pool_->describe(handle);
    return info.ok() ? info->mappings : 0;
  }
  std::uint64_t used() const { return this->governor_->stats(this->tier_).used; }
  // A prefix of `windows` whole windows and half a window more (at least one token).
  std::uint64_t prefix_tokens(const LayoutPlan& plan, std::uint64_t windows) const {
    const std::uint64_t per_window = this->tokens_for_windows(plan, 1);
    return windows * per_window + std::max<std::uint64_t>(1, per_window / 2);
  }
  // An owner of `p` tokens written from `seed`, and the prefix it published.
  std::pair<SlotId, std::shared_ptr<SharedPrefix>> published(Arena& arena, std::uint64_t p,
                                                             std::uint64_t seed) {
    auto owner = arena.admit(p);
    EXPECT_TRUE(owner.ok()) << owner.status().to_string();
    if (!owner.ok()) return {0, nullptr};
    this->write_tokens(arena, *owner, 0, p, seed);
    auto prefix = arena.publish(*owner, p);
    EXPECT_TRUE(prefix.ok()) << prefix.status().to_string();
    return {*owner, prefix.ok() ? *prefix : nullptr};
  }
};
TYPED_TEST_SUITE(ArenaShareTest, testing::AllBackends, testing::BackendNames);

TYPED_TEST(ArenaShareTest, APrefixIsChargedOnceAndLivesAsLongAsItsLastUser) {
  this->make_budget(4096, 0);  // the pool keeps nothing: every returned handle is released
  Arena& arena = this->make_arena(Layout::kTokenMajor, 8, 16);
  const LayoutPlan& plan = arena.plan();
  const std::uint64_t g = plan.granule;
  const std::uint64_t p = this->prefix_tokens(plan, 3);
  const std::uint64_t seed = testing::fresh_seed();
  auto owner = arena.admit(p);
  ASSERT_TRUE(owner.ok()) << owner.status().to_string();
  this->write_tokens(arena, *owner, 0, p, seed);
  auto prefix = arena.publish(*owner, p);
  ASSERT_TRUE(prefix.ok()) << prefix.status().to_string();
  EXPECT_EQ((*prefix)->info().windows_per_fragment, 3u);
  EXPECT_EQ((*prefix)->info().shared_bytes, 3 * g);
  EXPECT_EQ((*prefix)->info().boundary_bytes, p * plan.bytes_per_token - 3 * g);

  constexpr int kSharers = 3;
  std::vector<SlotId> users{*owner};
  for (int i = 0; i < kSharers; ++i) {
    auto sharer = arena.admit_shared(**prefix, p + 1);
    ASSERT_TRUE(sharer.ok()) << sharer.status().to_string();
    users.push_back(*sharer);
    this->expect_tokens(arena, *sharer, 0, p, seed);
  }
  // Four users of 4 windows each; the 3 prefix windows are held once.
  const std::uint64_t private_windows = plan.windows_per_fragment(p + 1) - 3;
  ArenaStats stats = arena.stats();
  EXPECT_EQ(stats.committed_bytes, 4 * 4 * g);
  EXPECT_EQ(stats.physical_bytes, 3 * g + 4 * private_windows * g);
  EXPECT_EQ(stats.shared_saved_bytes, kSharers * 3 * g);
  EXPECT_EQ(this->used(), stats.physical_bytes) << "the governor bills the prefix once";
  EXPECT_EQ(this->pool_->snapshot().mapped_bytes, stats.physical_bytes);
  const auto shared = this->window_handles(arena, *owner, 3);
  for (const HandleInfo& h : shared) EXPECT_EQ(this->mappings(h.handle), 4u);
  EXPECT_EQ(testing::check_invariants(this->world()), "");

  // Removing all but one user, the publisher first, releases none of the prefix.
  for (int i = 0; i < kSharers; ++i) {
    const std::uint64_t released = this->pool_->snapshot().released_bytes;
    ASSERT_TRUE(arena.release(users[i]).ok());
    EXPECT_EQ(this->pool_->snapshot().released_bytes - released, private_windows * g)
        << "only the private windows of user " << i << " go";
    for (const HandleInfo& h : shared) {
      EXPECT_EQ(this->mappings(h.handle), static_cast<std::uint32_t>(kSharers - i));
    }
  }
  EXPECT_TRUE((*prefix)->usable()) << "the last sharer still holds it";
  this->expect_tokens(arena, users.back(), 0, p, seed);
  EXPECT_EQ(this->used(), 3 * g + private_windows * g);
  // The last user goes: everything goes, and the prefix can no longer be admitted with.
  ASSERT_TRUE(arena.release(users.back()).ok());
  EXPECT_EQ(this->used(), 0u);
  EXPECT_FALSE((*prefix)->usable());
  auto late = arena.admit_shared(**prefix, p);
  EXPECT_EQ(late.status().code(), StatusCode::kFailedPrecondition) << late.status().to_string();
  EXPECT_EQ(testing::check_invariants(this->world()), "");
}

// An engine ends its sequences with finish: the next sharer of the same prefix takes a
// finished slot that still maps it, with no driver call for the prefix's windows.
TYPED_TEST(ArenaShareTest, TheNextSharerTakesTheFinishedSlotStillMappingItsPrefix) {
  this->make_budget(4096, 0);
  Arena& arena = this->make_arena(Layout::kTokenMajor, 6, 16);
  const LayoutPlan& plan = arena.plan();
  const std::uint64_t g = plan.granule;
  const std::uint64_t p = this->prefix_tokens(plan, 3);
  const std::uint64_t w = this->tokens_for_windows(plan, 1);
  const std::uint64_t tokens = p + 2 * w;
  const std::uint64_t windows = plan.windows_per_fragment(tokens);  // 3 shared, 3 private
  ASSERT_EQ(windows, 6u);
  const std::uint64_t seed = testing::fresh_seed();
  const auto [owner, prefix] = this->published(arena, p, seed);
  const auto [other_owner, other_prefix] = this->published(arena, p, seed ^ 7);
  ASSERT_NE(prefix, nullptr);
  ASSERT_NE(other_prefix, nullptr);
  // A sharer of each prefix writes its own tokens, turns its first private window read-only
  // (as the prefix cache publishes a finished window) and ends.
  const auto shared_and_finished = [&](const SharedPrefix& of) {
    auto sharer = arena.admit_shared(of, tokens);
    EXPECT_TRUE(sharer.ok()) << sharer.status().to_string();
    this->write_tokens(arena, *sharer, p, tokens, seed ^ 1);
    EXPECT_TRUE(arena.seal_windows(*sharer, 3, 4).ok());
    EXPECT_TRUE(arena.finish(*sharer).ok());
    return *sharer;
  };
  const SlotId other_finished = shared_and_finished(*other_prefix);
  const SlotId finished = shared_and_finished(*prefix);
  EXPECT_EQ(arena.stats().finished_slots, 2u);
  // Their prefix windows belong to the owners: not reclaimable; the private ones are.
  EXPECT_EQ(arena.stats().reclaimable_bytes, 2 * (windows - 3) * g);

  const DriverCallCounts before = this->fault_->counts();
  const ArenaStats stats_before = arena.stats();
  auto next = arena.admit_shared(*prefix, tokens);
  ASSERT_TRUE(next.ok()) << next.status().to_string();
  EXPECT_EQ(*next, finished) << "not the other prefix's slot " << other_finished;
  const DriverCallCounts after = this->fault_->counts();
  // The read-only window 3 and the windows after it are unmapped (in one coalesced call) and
  // committed again; the prefix's windows stay: maps for windows [3, 6) only.
  EXPECT_EQ(after.of(DriverOp::kMap) - before.of(DriverOp::kMap), windows - 3);
  EXPECT_EQ(arena.stats().reclaimed_bytes - stats_before.reclaimed_bytes, (windows - 3) * g);
  const ArenaStats stats = arena.stats();
  EXPECT_EQ(stats.reused_admissions, stats_before.reused_admissions + 1);
  EXPECT_EQ(stats.shared_admissions, stats_before.shared_admissions + 1);
  EXPECT_EQ(stats.readonly_windows, 3u + 3u + 3u) << "the owners' 3 each, the sharer's 3";
  this->expect_tokens(arena, *next, 0, p, seed);  // the prefix, and the boundary copied
  this->write_tokens(arena, *next, p, tokens, seed ^ 2);
  EXPECT_EQ(stats.cow_copies + stats.cow_in_place,
            stats_before.cow_copies + stats_before.cow_in_place)
      << "window 3 was replaced, not copied";
  this->expect_tokens(arena, owner, 0, p, seed);
  this->expect_tokens(arena, other_owner, 0, p, seed ^ 7);
  EXPECT_EQ(testing::check_invariants(this->world()), "");

  // A failed commit of the private windows leaves the slot finished with the prefix still
  // mapped, and the next admission takes it again.
  ASSERT_TRUE(arena.finish(*next).ok());
  auto ended = arena.admit_shared(*prefix, tokens + 2 * w);
  ASSERT_TRUE(ended.ok()) << ended.status().to_string();
  ASSERT_EQ(*ended, finished);
  ASSERT_TRUE(arena.finish(*ended).ok());
  this->fault_->fail_nth(DriverOp::kMap, 1);
  auto refused = arena.admit_shared(*prefix, tokens + 4 * w);
  EXPECT_EQ(refused.status().code(), StatusCode::kDriverError) << refused.status().to_string();
  EXPECT_EQ(arena.stats().finished_slots, 2u);
  EXPECT_EQ(arena.stats().quarantined_slots, 0u);
  EXPECT_EQ(testing::check_invariants(this->world()), "");
  auto retried = arena.admit_shared(*prefix, tokens + 4 * w);
  ASSERT_TRUE(retried.ok()) << retried.status().to_string();
  EXPECT_EQ(*retried, finished);
  this->expect_tokens(arena, *retried, 0, p, seed);

  // A failed unmap of what the slot does not keep quarantines it; the sharer gets an empty
  // slot instead.
  ASSERT_TRUE(arena.seal_windows(*retried, 3, 4).ok());
  ASSERT_TRUE(arena.finish(*retried).ok());
  this->fault_->fail_fraction(DriverOp::kUnmap, 1.0, 1);  // the coalesced call and each retry
  auto elsewhere = arena.admit_shared(*prefix, tokens);
  this->fault_->clear();
  ASSERT_TRUE(elsewhere.ok()) << elsewhere.status().to_string();
  EXPECT_NE(*elsewhere, finished);
  EXPECT_EQ(arena.stats().quarantined_slots, 1u);
  this->expect_tokens(arena, *elsewhere, 0, p, seed);
  EXPECT_EQ(testing::check_invariants(this->world()), "");
}

// Budget pressure takes back what a finished sharer maps past its prefix and leaves it the
// prefix (whose bytes the owner holds), so the next sharer maps and unmaps nothing for it;
// the prefix windows go only when what else is reclaimable does not suffice. A slot whose
// last kernels may still run is passed over, and counted.
TYPED_TEST(ArenaShareTest, ReclaimLeavesAFinishedSharerItsPrefixForTheNext) {
  this->make_budget(4096, 0);
  Arena& arena = this->make_arena(Layout::kTokenMajor, 4, 16);
  const LayoutPlan& plan = arena.plan();
  ASSERT_EQ(plan.fragments, 1u);
  const std::uint64_t g = plan.granule;
  const std::uint64_t p = this->prefix_tokens(plan, 3);
  const std::uint64_t tokens = p + 2 * this->tokens_for_windows(plan, 1);
  const std::uint64_t windows = plan.windows_per_fragment(tokens);  // 3 shared, 3 private
  ASSERT_EQ(windows, 6u);
  const std::uint64_t seed = testing::fresh_seed();
  const auto [owner, prefix] = this->published(arena, p, seed);
  ASSERT_NE(prefix, nullptr);
  auto sharer = arena.admit_shared(*prefix, tokens);
  ASSERT_TRUE(sharer.ok()) << sharer.status().to_string();
  this->write_tokens(arena, *sharer, p, tokens, seed ^ 1);
  ASSERT_TRUE(arena.seal_windows(*sharer, 3, 4).ok());  // as the cache publishes a window
  ASSERT_TRUE(arena.finish(*sharer).ok());
  const std::uint64_t owner_bytes = plan.windows_per_fragment(p) * g;

  // One granule asked for: the finished slot gives all it maps past its prefix.
  const ArenaStats before_reclaim = arena.stats();
  EXPECT_EQ(before_reclaim.reclaimable_bytes, (windows - 3) * g);
  EXPECT_EQ(arena.reclaim(g), (windows - 3) * g);
  ArenaStats stats = arena.stats();
  EXPECT_EQ(stats.prefix_kept_reclaims, before_reclaim.prefix_kept_reclaims + 1);
  EXPECT_EQ(stats.finished_slots, 1u) << "it still maps the prefix";
  EXPECT_EQ(stats.committed_bytes, owner_bytes + 3 * g);
  EXPECT_EQ(stats.reclaimable_bytes, 0u);
  EXPECT_EQ(this->used(), owner_bytes) << "the prefix is billed once, to the owner";
  EXPECT_EQ(testing::check_invariants(this->world()), "");

  // The next sharer lands there: maps for its private windows, no unmap, no fence.
  const DriverCallCounts calls = this->fault_->counts();
  auto next = arena.admit_shared(*prefix, tokens);
  ASSERT_TRUE(next.ok()) << next.status().to_string();
  EXPECT_EQ(*next, *sharer);
  const DriverCallCounts after = this->fault_->counts();
  EXPECT_EQ(after.of(DriverOp::kMap) - calls.of(DriverOp::kMap), windows - 3);
  EXPECT_EQ(after.of(DriverOp::kUnmap), calls.of(DriverOp::kUnmap));
  EXPECT_EQ(arena.stats().reused_admissions, stats.reused_admissions + 1);
  this->expect_tokens(arena, *next, 0, p, seed);
  this->write_tokens(arena, *next, p, tokens, seed ^ 2);
  this->expect_tokens(arena, owner, 0, p, seed);
  EXPECT_EQ(testing::check_invariants(this->world()), "");

  // Its last kernels may still run: reclaim passes it over, and so does the next sharer,
  // which takes an empty slot.
  this->fault_->hold_fences(true);
  ASSERT_TRUE(arena.seal_windows(*next, 3, 4).ok());
  ASSERT_TRUE(arena.finish(*next).ok());
  EXPECT_EQ(arena.reclaim(g), 0u);
  stats = arena.stats();
  auto elsewhere = arena.admit_shared(*prefix, tokens);
  ASSERT_TRUE(elsewhere.ok()) << elsewhere.status().to_string();
  EXPECT_NE(*elsewhere, *next);
  EXPECT_EQ(arena.stats().reuse_fence_pending, stats.reuse_fence_pending + 1);
  EXPECT_EQ(arena.stats().reused_admissions, stats.reused_admissions);
  this->fault_->hold_fences(false);
  ASSERT_TRUE(arena.release(*elsewhere).ok());

  // The owner goes: only the finished slot maps the prefix now, and a reclaim that needs
  // more than its private windows unmaps the prefix too, which gives its bytes back.
  ASSERT_TRUE(arena.release(owner).ok());
  EXPECT_EQ(arena.reclaim(4096 * g), (windows - 3) * g + 3 * g);
  EXPECT_EQ(arena.stats().finished_slots, 0u);
  EXPECT_EQ(arena.stats().committed_bytes, 0u);
  EXPECT_EQ(this->used(), 0u);
  EXPECT_EQ(testing::check_invariants(this->world()), "");
}

TYPED_TEST(ArenaShareTest, ASharerIsChargedOnlyItsPrivateBytesInEveryLayout) {
  for (Layout layout : all_layouts()) {
    SCOPED_TRACE(std::string(to_string(layout)));
    this->make_budget(4096, 0);
    Arena& arena = this->make_arena(layout, 4, 8);
    const LayoutPlan& plan = arena.plan();
    const std::uint64_t p = this->prefix_tokens(plan, 2);
    const std::uint64_t seed = testing::fresh_seed();
    auto owner = arena.admit(p);
    ASSERT_TRUE(owner.ok()) << owner.status().to_string();
    this->write_tokens(arena, *owner, 0, p, seed);
    auto prefix = arena.publish(*owner, p);
    ASSERT_TRUE(prefix.ok()) << prefix.status().to_string();
    const std::uint64_t tokens = p + this->tokens_for_windows(plan, 1);
    const std::uint64_t before = this->used();
    auto sharer = arena.admit_shared(**prefix, tokens);
    ASSERT_TRUE(sharer.ok()) << sharer.status().to_string();
    const std::uint64_t private_bytes =
        plan.fragments * (plan.windows_per_fragment(tokens) - 2) * plan.granule;
    EXPECT_EQ(this->used() - before, private_bytes);
    EXPECT_EQ(arena.stats().boundary_copy_bytes, (*prefix)->info().boundary_bytes);
    this->expect_tokens(arena, *sharer, 0, p, seed);
    // The sharer grows on its own; the owner's bytes past the prefix are not its.
    this->write_tokens(arena, *sharer, p, tokens, seed ^ 1);
    this->expect_tokens(arena, *owner, 0, p, seed);
    EXPECT_EQ(testing::check_invariants(this->world()), "");
    this->arena_.reset();
    EXPECT_EQ(testing::check_invariants(this->world()), "");
  }
}

TYPED_TEST(ArenaShareTest, AWriteIntoASharedWindowFaultsAndLeavesTheOthersIntact) {
  Arena& arena = this->make_arena(Layout::kTokenMajor, 4, 8);
  const LayoutPlan& plan = arena.plan();
  const std::uint64_t p = this->prefix_tokens(plan, 2);
  const std::uint64_t seed = testing::fresh_seed();
  auto owner = arena.admit(p);
  ASSERT_TRUE(owner.ok());
  this->write_tokens(arena, *owner, 0, p, seed);
  auto prefix = arena.publish(*owner, p);
  ASSERT_TRUE(prefix.ok());
  auto sharer = arena.admit_shared(**prefix, p);
  ASSERT_TRUE(sharer.ok());
  const Address shared_window = arena.slot_base(*sharer) + plan.granule;  // window 1
  const std::vector<std::uint8_t> junk(64, 0x5a);
  if constexpr (TypeParam::kIsHost) {
    // The hardware refuses: the process dies of SIGSEGV rather than corrupt the prefix.
    GTEST_FLAG_SET(death_test_style, "threadsafe");
    EXPECT_DEATH(std::memcpy(reinterpret_cast<void*>(shared_window), junk.data(), junk.size()), "");
    // The owner's copy is read-only too, once published.
    EXPECT_DEATH(
        std::memcpy(reinterpret_cast<void*>(arena.slot_base(*owner)), junk.data(), junk.size()),
        "");
  } else {
    Status refused = this->fault_->write(shared_window, junk.data(), junk.size());
    EXPECT_FALSE(refused.ok()) << "a copy into a read-only shared window must fail";
#if defined(KVVM_HAS_CUDA_KERNELS)
    // A kernel's write poisons its context, so it runs in a child process (re-executed).
    GTEST_FLAG_SET(death_test_style, "threadsafe");
    EXPECT_EXIT(
        {
          auto stream = kernels::create_stream();
          Status wrote = stream.ok() ? testkit::write_bytes_on_gpu(*stream, shared_window, 64, 1)
                                     : stream.status();
          std::_Exit(wrote.ok() ? 0 : 3);
        },
        ::testing::ExitedWithCode(3), "");
#endif
  }
  // Whatever was attempted, every sharer still reads the owner's bytes.
  this->expect_tokens(arena, *owner, 0, p, seed);
  this->expect_tokens(arena, *sharer, 0, p, seed);
  EXPECT_EQ(testing::check_invariants(this->world()), "");
}

TYPED_TEST(ArenaShareTest, ForkedSequencesDivergeAndCopyOnWriteCopiesOneWindow) {
  for (Layout layout : {Layout::kTokenMajor, Layout::kSeqMajor}) {
    SCOPED_TRACE(std::string(to_string(layout)));
    this->make_budget(4096, 0);
    Arena& arena = this->make_arena(layout, 4, 8);
    const LayoutPlan& plan = arena.plan();
    const std::uint64_t pw = this->tokens_for_windows(plan, 1);
    const std::uint64_t g = plan.granule;
    const std::uint64_t length = 5 * pw + 1;
    const std::uint64_t seed_parent = testing::fresh_seed();
    auto parent = arena.admit(length);
    ASSERT_TRUE(parent.ok());
    this->write_tokens(arena, *parent, 0, length, seed_parent);
    const std::uint64_t position = 4 * pw + std::max<std::uint64_t>(1, pw / 2);
    auto child = arena.fork(*parent, position);
    ASSERT_TRUE(child.ok()) << child.status().to_string();
    EXPECT_EQ(arena.tokens(*child), position);
    this->expect_tokens(arena, *child, 0, position, seed_parent);
    const auto shared = this->window_handles(arena, *parent, 4);
    ASSERT_EQ(shared.size(), 4u);
    for (const HandleInfo& h : shared) EXPECT_EQ(this->mappings(h.handle), 2u);
    EXPECT_EQ(arena.stats().forks, 1u);

    // The child grows on its own; the parent's bytes stay.
    const std::uint64_t seed_child = seed_parent ^ 0x1111;
    ASSERT_TRUE(arena.ensure(*child, length + pw).ok());
    this->write_tokens(arena, *child, position, length + pw, seed_child);
    this->expect_tokens(arena, *parent, 0, length, seed_parent);

    // Rewind into window 1 and write one token: exactly that window is copied, once per
    // fragment, and only it stops being shared.
    const ArenaStats before = arena.stats();
    const std::uint64_t used_before = this->used();
    ASSERT_TRUE(arena.rewind(*child, pw + 1).ok());
    ASSERT_TRUE(arena.ensure(*child, pw + 2).ok());
    const ArenaStats after = arena.stats();
    EXPECT_EQ(after.cow_copies - before.cow_copies, plan.fragments);
    EXPECT_EQ(this->used() - used_before, plan.fragments * g);
    this->write_tokens(arena, *child, pw + 1, pw + 2, seed_child ^ 7);
    this->expect_tokens(arena, *child, 0, pw + 1, seed_parent);  // copied faithfully
    this->expect_tokens(arena, *child, pw + 1, pw + 2, seed_child ^ 7);
    this->expect_tokens(arena, *parent, 0, length, seed_parent);  // untouched
    EXPECT_EQ(this->mappings(shared[1].handle), 1u) << "window 1: the parent's alone now";
    for (int w : {0, 2, 3}) EXPECT_EQ(this->mappings(shared[w].handle), 2u) << "window " << w;

    // The parent rewinds into window 2, still shared: it copies too.
    ASSERT_TRUE(arena.rewind(*parent, 2 * pw + 1).ok());
    ASSERT_TRUE(arena.ensure(*parent, 2 * pw + 2).ok());
    EXPECT_EQ(arena.stats().cow_copies - after.cow_copies, plan.fragments);
    this->write_tokens(arena, *parent, 2 * pw + 1, 2 * pw + 2, seed_parent ^ 9);
    this->expect_tokens(arena, *child, 2 * pw, 2 * pw + 2, seed_parent);

    // Once the child is gone, window 3 is the parent's alone: made writable in place.
    ASSERT_TRUE(arena.release(*child).ok());
    const std::uint64_t creates = this->fault_->counts().of(DriverOp::kCreate);
    ASSERT_TRUE(arena.ensure(*parent, 3 * pw + 2).ok());  // grows through window 3
    EXPECT_EQ(arena.stats().cow_in_place, plan.fragments);
    EXPECT_EQ(this->fault_->counts().of(DriverOp::kCreate), creates) << "no copy, no handle";
    this->write_tokens(arena, *parent, 2 * pw + 2, 3 * pw + 2, seed_parent ^ 11);
    EXPECT_EQ(testing::check_invariants(this->world()), "");
    this->arena_.reset();
    EXPECT_EQ(testing::check_invariants(this->world()), "");
  }
}

TYPED_TEST(ArenaShareTest, BadRequestsAreRefusedWithReasonsAndChangeNothing) {
  Arena& arena = this->make_arena(Layout::kHeadMajor, 4, 8);
  const LayoutPlan& plan = arena.plan();
  const std::uint64_t pw = this->tokens_for_windows(plan, 1);
  auto owner = arena.admit(3 * pw);
  ASSERT_TRUE(owner.ok());
  const auto calls = this->fault_->counts().total();
  const std::uint64_t used = this->used();

  // Head-major with a prefix below the crossover: no whole window lies inside.
  auto short_prefix = arena.publish(*owner, pw - 1);
  EXPECT_EQ(short_prefix.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(short_prefix.status().message().find("less than one"), std::string::npos)
      << short_prefix.status().to_string();
  // More tokens than the sequence has written.
  auto too_long = arena.publish(*owner, 3 * pw + 1);
  EXPECT_EQ(too_long.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(too_long.status().message().find("written " + std::to_string(3 * pw)),
            std::string::npos)
      << too_long.status().to_string();
  // A fork beyond the sequence's length.
  auto far_fork = arena.fork(*owner, 3 * pw + 1);
  EXPECT_EQ(far_fork.status().code(), StatusCode::kInvalidArgument)
      << far_fork.status().to_string();
  // Rewinding forward.
  EXPECT_EQ(arena.rewind(*owner, 3 * pw + 1).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(this->fault_->counts().total(), calls) << "no driver call for a refused request";
  EXPECT_EQ(this->used(), used);
  EXPECT_EQ(arena.stats().published_prefixes, 0u);

  auto prefix = arena.publish(*owner, 2 * pw);
  ASSERT_TRUE(prefix.ok()) << prefix.status().to_string();
  // Another geometry on the same pool.
  Geometry other = testing::small_geometry();
  other.name = "test-other";
  other.kv_heads = 4;
  auto other_plan = plan_layout(other, Layout::kHeadMajor, plan.granule, plan.max_context);
  ASSERT_TRUE(other_plan.ok());
  auto other_arena =
      Arena::create(*this->pool_, *this->governor_, ArenaOptions{*other_plan, 2, this->tier_});
  ASSERT_TRUE(other_arena.ok());
  auto foreign = (*other_arena)->admit_shared(**prefix, 2 * pw);
  EXPECT_EQ(foreign.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(foreign.status().message().find("test-small"), std::string::npos)
      << foreign.status().to_string();
  // Another granule (another driver and pool).
  auto doubled = make_host_driver({.granule = 2 * plan.granule});
  ASSERT_TRUE(doubled.ok());
  Governor governor;
  HandlePool pool(**doubled, {}, &governor, governor.add_tier("other", 64 * plan.granule));
  auto wide_plan = plan_layout(plan.geometry, plan.layout, 2 * plan.granule, plan.max_context);
  ASSERT_TRUE(wide_plan.ok());
  auto wide_arena = Arena::create(pool, governor, ArenaOptions{*wide_plan, 2, 0});
  ASSERT_TRUE(wide_arena.ok()) << wide_arena.status().to_string();
  auto wide = (*wide_arena)->admit_shared(**prefix, 2 * pw);
  EXPECT_EQ(wide.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(wide.status().message().find("granule"), std::string::npos)
      << wide.status().to_string();
  // Fewer tokens than the prefix.
  auto shorter = arena.admit_shared(**prefix, 2 * pw - 1);
  EXPECT_EQ(shorter.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ((*other_arena)->stats().admissions + (*wide_arena)->stats().admissions, 0u);
  EXPECT_EQ(arena.stats().admissions, 1u);
  other_arena->reset();
  EXPECT_EQ(testing::check_invariants(this->world()), "");
}

}  // namespace
}  // namespace kvvm
