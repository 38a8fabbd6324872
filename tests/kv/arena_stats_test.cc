// Arena::stats() keeps its physical figures as mappings come and go instead of recounting
// every block: after random operations (sharing, fork, copy-on-write, reclaim, the dummy tail,
// and injected driver failures with their rollbacks) the kept figures must equal a recount
// from the reservation's block table.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <vector>

#include "support/arena_fixture.h"

namespace kvvm {
namespace {

// What the arena's physical figures are by definition, counted from scratch.
struct Recount {
  std::uint64_t physical = 0;  // each handle under the slots once, the dummy page left out
  std::uint64_t mapped = 0;
  std::uint64_t residual = 0;
  std::uint64_t dummy = 0;  // bytes mapped to the dummy page
};

Recount recount(const Arena& arena) {
  Handle dummy = kNoHandle;
  const auto homes = arena.reservations();
  // reservations(): the slots', the copy-on-write windows', then the dummy's home if any.
  if (homes.size() > 2 && !homes[2]->blocks().empty()) dummy = homes[2]->blocks().front().handle;
  Recount count;
  std::vector<Block> blocks = arena.reservation().blocks();
  std::sort(blocks.begin(), blocks.end(),
            [](const Block& a, const Block& b) { return a.handle < b.handle; });
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    count.mapped += blocks[i].bytes;
    if (blocks[i].poisoned) count.residual += blocks[i].bytes;
    if (blocks[i].handle == dummy && dummy != kNoHandle) {
      count.dummy += blocks[i].bytes;
      continue;
    }
    if (i > 0 && blocks[i].handle == blocks[i - 1].handle) continue;
    count.physical += blocks[i].bytes;
  }
  return count;
}

template <typename Backend>
class ArenaStatsTest : public testing::ArenaFixture<Backend> {
 protected:
  Arena& make_padded_arena(std::uint32_t slots, std::uint64_t context_windows,
                           std::uint32_t ahead) {
    const Geometry geometry = testing::small_geometry();
    auto plan = plan_layout(geometry, Layout::kTokenMajor, this->g_,
                            context_windows * this->g_ / geometry.bytes_per_token());
    EXPECT_TRUE(plan.ok()) << plan.status().to_string();
    ArenaOptions options{*plan, slots, this->tier_, ahead, std::chrono::milliseconds(0)};
    options.padded_tokens = plan->max_context;
    auto arena = Arena::create(*this->pool_, *this->governor_, options);
    EXPECT_TRUE(arena.ok()) << arena.status().to_string();
    this->arena_ = std::move(arena).value();
    return *this->arena_;
  }

  // `exact`: no fault was injected, so every committed window is mapped (none poisoned or
  // left behind) and the slot totals can be checked against the block table too.
  void expect_recount(const Arena& arena, const std::string& where, bool exact = true) {
    const ArenaStats stats = arena.stats();
    const Recount count = recount(arena);
    EXPECT_EQ(stats.physical_bytes, count.physical) << where;
    EXPECT_EQ(stats.shared_saved_bytes,
              stats.committed_bytes > count.physical ? stats.committed_bytes - count.physical : 0)
        << where;
    EXPECT_EQ(arena.reservation().mapped_bytes(), count.mapped) << where;
    EXPECT_EQ(arena.reservation().residual_bytes(), count.residual) << where;
    if (exact) {
      EXPECT_EQ(stats.committed_bytes + count.dummy, count.mapped) << where;
      EXPECT_EQ(stats.dummy_windows * this->g_, count.dummy) << where;
    }
  }

  // Random operations on a small arena; with `fault_fraction` > 0 some driver calls fail.
  // Returns how many operations succeeded (so the run is known to have done something).
  int run(std::uint64_t seed, double fault_fraction, std::uint32_t ahead, bool padded) {
    this->make_budget(40, 8);  // tight: admissions reclaim, some are refused
    const std::uint64_t context_windows = 6;
    Arena& arena = padded ? make_padded_arena(8, context_windows, ahead)
                          : this->make_arena(Layout::kTokenMajor, 8, context_windows, ahead);
    const std::uint64_t per_window = this->tokens_for_windows(arena.plan(), 1);
    const std::uint64_t max_tokens = arena.plan().max_context;
    std::mt19937_64 random(seed);
    const auto pick = [&](std::uint64_t n) { return n == 0 ? 0 : random() % n; };
    std::vector<SlotId> live;
    std::vector<std::shared_ptr<SharedPrefix>> prefixes;
    if (fault_fraction > 0) {
      std::uint64_t s = seed;
      for (DriverOp op : {DriverOp::kCreate, DriverOp::kMap, DriverOp::kSetAccess, DriverOp::kUnmap,
                          DriverOp::kCopy, DriverOp::kFence}) {
        this->fault_->fail_fraction(op, fault_fraction, ++s);
      }
    }
    int succeeded = 0;
    for (int step = 0; step < 160; ++step) {
      const auto slot = [&] { return live[pick(live.size())]; };
      const auto forget = [&](SlotId id) { std::erase(live, id); };
      Status status;
      const int kind = static_cast<int>(pick(live.empty() ? 1 : 10));
      switch (kind) {
        case 0: {  // admit
          auto admitted = arena.admit(1 + pick(max_tokens));
          status = admitted.status();
          if (admitted.ok()) live.push_back(*admitted);
          break;
        }
        case 1: {  // grow
          const SlotId id = slot();
          status = arena.ensure(id, std::min(max_tokens, arena.tokens(id) + 1 + pick(per_window)));
          break;
        }
        case 2: {  // publish some whole windows
          const SlotId id = slot();
          const std::uint64_t tokens = arena.tokens(id);
          if (tokens < per_window) break;
          auto prefix = arena.publish(id, per_window + pick(tokens - per_window + 1));
          status = prefix.status();
          if (prefix.ok()) prefixes.push_back(*prefix);
          break;
        }
        case 3: {  // admit a sharer
          if (prefixes.empty()) break;
          const auto& prefix = prefixes[pick(prefixes.size())];
          if (!prefix->usable()) break;
          auto sharer = arena.admit_shared(*prefix, prefix->info().tokens + pick(per_window));
          status = sharer.status();
          if (sharer.ok()) live.push_back(*sharer);
          break;
        }
        case 4: {  // fork
          const SlotId id = slot();
          auto child = arena.fork(id, pick(arena.tokens(id) + 1));
          status = child.status();
          if (child.ok()) live.push_back(*child);
          break;
        }
        case 5: {  // rewind and write again: copy-on-write of shared windows
          const SlotId id = slot();
          const std::uint64_t tokens = arena.tokens(id);
          status = arena.rewind(id, pick(tokens + 1));
          if (status.ok()) status = arena.ensure(id, tokens);
          break;
        }
        case 6: {  // finish
          const SlotId id = slot();
          status = arena.finish(id);
          if (status.ok()) forget(id);
          break;
        }
        case 7: {  // release
          const SlotId id = slot();
          status = arena.release(id);
          if (status.ok()) forget(id);
          break;
        }
        case 8:
          arena.reclaim((1 + pick(16)) * this->g_);
          break;
        default:
          if (!prefixes.empty()) prefixes.erase(prefixes.begin() + pick(prefixes.size()));
          break;
      }
      if (status.ok()) ++succeeded;
      // A slot quarantined by a failure is gone for good: ensure() at its own length makes no
      // driver call and answers FailedPrecondition only when the slot holds no sequence.
      std::erase_if(live, [&](SlotId id) {
        return arena.ensure(id, arena.tokens(id)).code() == StatusCode::kFailedPrecondition;
      });
      if (ahead > 0) arena.wait_until_idle();
      expect_recount(arena,
                     "step " + std::to_string(step) + " (seed " + std::to_string(seed) +
                         "): " + status.to_string(),
                     fault_fraction == 0);
      if (::testing::Test::HasFailure()) break;
    }
    this->fault_->clear();
    prefixes.clear();
    expect_recount(arena, "at the end (seed " + std::to_string(seed) + ")", fault_fraction == 0);
    this->arena_.reset();
    this->replace_driver();  // faults may have leaked poisoned mappings on purpose
    return succeeded;
  }
};
using StatsBackends = ::testing::Types<testing::HostPageBackend, testing::CudaBackend>;
TYPED_TEST_SUITE(ArenaStatsTest, StatsBackends, testing::BackendNames);

TYPED_TEST(ArenaStatsTest, KeptFiguresEqualARecountAfterRandomOperations) {
  const std::uint64_t base = testing::fresh_seed();
  for (std::uint64_t i = 0; i < 6; ++i) {
    EXPECT_GT(this->run(base + i, 0.0, 0, i % 2 == 1), 20) << "seed " << base + i;
  }
}

TYPED_TEST(ArenaStatsTest, KeptFiguresEqualARecountUnderInjectedFaults) {
  const std::uint64_t base = testing::fresh_seed();
  for (std::uint64_t i = 0; i < 8; ++i) {
    EXPECT_GT(this->run(base + i, 0.05, 0, i % 2 == 1), 10) << "seed " << base + i;
  }
}

TYPED_TEST(ArenaStatsTest, KeptFiguresEqualARecountWithCommitAhead) {
  const std::uint64_t base = testing::fresh_seed();
  for (std::uint64_t i = 0; i < 4; ++i) {
    EXPECT_GT(this->run(base + i, i < 2 ? 0.0 : 0.05, 1, i % 2 == 1), 10) << "seed " << base + i;
  }
}

TYPED_TEST(ArenaStatsTest, SharedWindowsCountOnce) {
  this->make_budget(256, 8);
  Arena& arena = this->make_arena(Layout::kTokenMajor, 4, 8);
  const std::uint64_t per_window = this->tokens_for_windows(arena.plan(), 1);
  auto owner = arena.admit(3 * per_window);
  ASSERT_TRUE(owner.ok());
  auto prefix = arena.publish(*owner, 2 * per_window);
  ASSERT_TRUE(prefix.ok()) << prefix.status().to_string();
  auto sharer = arena.admit_shared(**prefix, 3 * per_window);
  ASSERT_TRUE(sharer.ok()) << sharer.status().to_string();
  const ArenaStats stats = arena.stats();
  EXPECT_EQ(stats.committed_bytes, 6 * this->g_);
  EXPECT_EQ(stats.physical_bytes, 4 * this->g_);  // two windows mapped twice, held once
  EXPECT_EQ(stats.shared_saved_bytes, 2 * this->g_);
  this->expect_recount(arena, "after sharing");
}

}  // namespace
}  // namespace kvvm
