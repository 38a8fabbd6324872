// Fault sweeps over sharing: every driver call made by publish, admission as a sharer (maps,
// the set_access after a successful map, the private commit, the boundary copy and its fence),
// fork and copy-on-write is made to fail in turn. After each: the invariants hold, a refused
// call changed nothing it did not report, and the memory the other users share is intact.
//
// A failed fence returns with the copies before it still in flight: the fault driver counts
// them running until a later fence completes, and the invariant check fails if anything they
// touch was unmapped meanwhile (invariant 6), on every backend. On a GPU each copy of the
// operation under test also waits behind a kernel spinning on its stream, so the copy is truly
// still running when the fence fails and such an unmap would kill the context.
#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "support/arena_fixture.h"
#include "support/fault_sweep.h"
#if defined(KVVM_HAS_CUDA_KERNELS)
#include "kernels/spin_reader.h"
#include "support/device_buffer.h"
#endif

namespace kvvm {
namespace {

constexpr DriverOp kSweptOps[] = {DriverOp::kCreate, DriverOp::kMap,  DriverOp::kSetAccess,
                                  DriverOp::kUnmap,  DriverOp::kCopy, DriverOp::kFence,
                                  DriverOp::kRelease};

template <typename Backend>
class ArenaShareSweepTest : public testing::ArenaFixture<Backend> {
 protected:
  struct Scene {
    SlotId owner = 0;
    SlotId sharer = 0;  // an earlier sharer, whose view must survive
    std::shared_ptr<SharedPrefix> prefix;
    std::uint64_t p = 0;       // prefix tokens
    std::uint64_t length = 0;  // the owner's length
    std::uint64_t seed = 0;
  };

  // A fresh arena where the owner wrote `length` tokens, published `p` of them, and one
  // sharer maps them.
  Scene make_scene(Layout layout) {
    this->make_budget(4096, 8);
    Arena& arena = this->make_arena(layout, 6, 8);
    const LayoutPlan& plan = arena.plan();
    const std::uint64_t pw = this->tokens_for_windows(plan, 1);
    Scene scene;
    scene.p = 2 * pw + std::max<std::uint64_t>(1, pw / 2);
    scene.length = 3 * pw + 1;
    scene.seed = testing::fresh_seed();
    auto owner = arena.admit(scene.length);
    EXPECT_TRUE(owner.ok());
    scene.owner = *owner;
    this->write_tokens(arena, scene.owner, 0, scene.length, scene.seed);
    auto prefix = arena.publish(scene.owner, scene.p);
    EXPECT_TRUE(prefix.ok()) << prefix.status().to_string();
    scene.prefix = *prefix;
    auto sharer = arena.admit_shared(*scene.prefix, scene.p);
    EXPECT_TRUE(sharer.ok()) << sharer.status().to_string();
    scene.sharer = *sharer;
    return scene;
  }

  // Runs `op` on a fresh scene with the k-th call of each swept kind failing, for every k
  // until a run injects nothing; checks after each. Returns the positions forced.
  int sweep(const char* name, Layout layout, const std::function<Status(Arena&, Scene&)>& op,
            const std::function<void(Arena&, Scene&, const Status&)>& check) {
    Scene scene;
    testing::FaultSweep sweep;
    sweep.name = "arena share " + std::string(name) + " (" + std::string(to_string(layout)) + ")";
    sweep.arms = testing::calls_of(kSweptOps);
    sweep.fault = [this]() -> FaultDriver& { return *this->fault_; };
    sweep.world = [this] { return this->world(); };
    sweep.run = [&](const std::function<void()>& arm, Status& status) {
      scene = make_scene(layout);
      this->fault_->clear();
      arm();
      hold_copies(true);
      status = op(*this->arena_, scene);
      hold_copies(false);
    };
    sweep.check = [&](const Status& status) {
      Arena& arena = *this->arena_;
      // The others' shared memory is intact, whatever happened.
      this->expect_tokens(arena, scene.owner, 0, scene.p, scene.seed);
      this->expect_tokens(arena, scene.sharer, 0, scene.p, scene.seed);
      check(arena, scene, status);
      this->arena_.reset();
      // A poisoned mapping is leaked at teardown on purpose (quarantined, still charged):
      // the next run gets a driver of its own, so the counts compare again.
      if (this->pool_->snapshot().handles_quarantined == 0) {
        EXPECT_EQ(testing::check_invariants(this->world()), "");
      } else {
        this->replace_driver();
      }
      scene = Scene{};  // its prefix goes before the next run's world replaces this one
    };
    return static_cast<int>(testing::sweep_faults(sweep));
  }

  // On a GPU, while on: every copy waits behind a kernel that spins for 50 ms on its stream.
  void hold_copies(bool on) {
#if defined(KVVM_HAS_CUDA_KERNELS)
    if (this->real_->info().backend != "cuda") return;
    if (!on) {
      this->fault_->delay_copies(nullptr);
      return;
    }
    if (!spun_) spun_ = std::make_unique<testing::DeviceBuffer>(4096);
    const auto address = reinterpret_cast<std::uint64_t>(spun_->get());
    this->fault_->delay_copies([address](Stream stream) {
      return kernels::launch_spin_reader(stream, address, 4096, 50000, 0);
    });
#else
    (void)on;
#endif
  }

#if defined(KVVM_HAS_CUDA_KERNELS)
  std::unique_ptr<testing::DeviceBuffer> spun_;  // what the spinning kernel reads
#endif
};
TYPED_TEST_SUITE(ArenaShareSweepTest, testing::AllBackends, testing::BackendNames);

TYPED_TEST(ArenaShareSweepTest, AdmissionAsASharer) {
  // Several fragments (seq-major) on the small-granule host only: the paths are the same, and
  // at 2 MiB windows each of its 43 positions costs a fresh arena of real memory.
  std::vector<Layout> layouts{Layout::kTokenMajor};
  if constexpr (std::is_same_v<TypeParam, testing::HostPageBackend>) {
    layouts.push_back(Layout::kSeqMajor);
  }
  for (Layout layout : layouts) {
    std::uint64_t admissions = 0;
    const int forced = this->sweep(
        "admit_shared", layout,
        [&](Arena& arena, auto& scene) {
          admissions = arena.stats().admissions;
          const std::uint64_t tokens =
              scene.p + this->tokens_for_windows(arena.plan(), 1);  // private windows too
          return arena.admit_shared(*scene.prefix, tokens).status();
        },
        [&](Arena& arena, auto& scene, const Status& status) {
          if (status.ok()) return;
          EXPECT_EQ(arena.stats().admissions, admissions) << "a failed admission admits nothing";
          EXPECT_TRUE(scene.prefix->usable());
          // A later attempt works: nothing was left half-done.
          auto again = arena.admit_shared(*scene.prefix, scene.p);
          ASSERT_TRUE(again.ok()) << again.status().to_string();
          this->expect_tokens(arena, *again, 0, scene.p, scene.seed);
        });
    EXPECT_GT(forced, 4);
  }
}

TYPED_TEST(ArenaShareSweepTest, Publish) {
  const int forced = this->sweep(
      "publish", Layout::kSeqMajor,
      [&](Arena& arena, auto& scene) {
        return arena.publish(scene.owner, scene.length).status();  // a longer prefix
      },
      [&](Arena& arena, auto& scene, const Status& status) {
        if (status.ok()) return;
        EXPECT_EQ(arena.stats().published_prefixes, 1u) << "only the scene's";
        // The owner can still grow and write past its length.
        ASSERT_TRUE(arena.ensure(scene.owner, scene.length + 1).ok());
        this->write_tokens(arena, scene.owner, scene.length, scene.length + 1, scene.seed);
      });
  EXPECT_GT(forced, 0);
}

TYPED_TEST(ArenaShareSweepTest, Fork) {
  const int forced = this->sweep(
      "fork", Layout::kTokenMajor,
      [&](Arena& arena, auto& scene) { return arena.fork(scene.owner, scene.length).status(); },
      [&](Arena& arena, auto& scene, const Status& status) {
        const std::uint64_t window2_end = 3 * this->tokens_for_windows(arena.plan(), 1);
        if (!status.ok()) {
          EXPECT_EQ(arena.stats().forks, 0u);
          // Window 2, which the fork was making read-only, is writable again: writing into it
          // copies nothing. Unless the child's boundary copy was left unconfirmed (its fence
          // failed): the child's slot then keeps mapping window 2 until a later fence, so the
          // window stays shared read-only and a write copies it.
          const bool child_kept = arena.stats().unconfirmed_slots > 0;
          ASSERT_TRUE(arena.rewind(scene.owner, window2_end - 1).ok());
          const ArenaStats before = arena.stats();
          ASSERT_TRUE(arena.ensure(scene.owner, window2_end).ok());
          EXPECT_EQ(arena.stats().cow_copies, before.cow_copies + (child_kept ? 1 : 0));
          EXPECT_EQ(arena.stats().cow_in_place, before.cow_in_place);
        }
        this->expect_tokens(arena, scene.owner, 0, window2_end - 1, scene.seed);
      });
  EXPECT_GT(forced, 4);
}

TYPED_TEST(ArenaShareSweepTest, CopyOnWrite) {
  const int forced = this->sweep(
      "copy-on-write", Layout::kTokenMajor,
      [&](Arena& arena, auto& scene) {
        // The sharer rewinds into window 1 (shared) and writes a token there.
        const std::uint64_t at = this->tokens_for_windows(arena.plan(), 1) + 1;
        EXPECT_TRUE(arena.rewind(scene.sharer, at).ok());
        return arena.ensure(scene.sharer, at + 1);
      },
      [&](Arena& arena, auto& scene, const Status& status) {
        if (status.ok() || arena.tokens(scene.sharer) == 0) return;
        // Not quarantined: a retry completes the copy and the write lands privately.
        const std::uint64_t at = this->tokens_for_windows(arena.plan(), 1) + 1;
        Status retried = arena.ensure(scene.sharer, at + 1);
        if (!retried.ok()) return;  // quarantined meanwhile; the invariants said it is known
        this->write_tokens(arena, scene.sharer, at, at + 1, scene.seed ^ 5);
        this->expect_tokens(arena, scene.owner, 0, scene.p, scene.seed);
      });
  EXPECT_GT(forced, 4);
}

}  // namespace
}  // namespace kvvm
