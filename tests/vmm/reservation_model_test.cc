// Model-based random test of Reservation (docs/ARCHITECTURE.md "Tests"): long random sequences of
// create, commit (and commit_ranges), release, map_shared, set_access and destroy on the host
// driver, with a fault-injecting driver failing 5% of the map, set_access, unmap, create and
// release calls, a governor whose limit is often hit and a pool bound small enough that
// handles above it are released. A reference model (per reservation: window offset -> block, plus
// each handle's content tags) predicts every result:
//  - a malformed call (bad alignment, out of range, overlapping, not covered, unknown or
//    quarantined handle) returns InvalidArgument (FailedPrecondition for poisoned blocks) and
//    changes nothing: no driver call, same pool, same ledger;
//  - a well-formed call with no injected fault (and a full grant) succeeds, and the model
//    applies it;
//  - a well-formed call that fails leaves the model as it was, except for the poisoned blocks
//    the reservation reports (modelled as residual windows that can no longer be used, their
//    handles quarantined), and says "poisoned" exactly when there are some;
//  - a destroy whose synchronizer fails leaks deliberately, and the leak is counted.
// After every operation the invariants hold (check_invariants), every reservation's blocks
// equal the model's, and the 8-byte tag written at the start of every window after its commit
// reads back, through every healthy accessible mapping of its handle (shared read-only ones
// included), as the tag its owner wrote.
//
// The reference model lives in tests/support/reservation_reference_model.h.
#include <gtest/gtest.h>
#include <rapidcheck.h>
#include <rapidcheck/gtest.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <deque>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "kvvm/governor/governor.h"
#include "kvvm/vmm/driver.h"
#include "kvvm/vmm/fault_driver.h"
#include "kvvm/vmm/handle_pool.h"
#include "kvvm/vmm/host_driver.h"
#include "kvvm/vmm/reservation.h"
#include "support/invariants.h"
#include "support/pattern.h"
#include "support/reservation_reference_model.h"

namespace kvvm {
namespace {

namespace kt = ::kvvm::testing;
using kt::reservation_model::ModelRun;
using kt::reservation_model::OpSpec;
using kt::reservation_model::shrink_budget;
using kt::reservation_model::ShrinkBudget;
using kt::reservation_model::totals;

// Operations per run: uniform in [0, kMaxOps] (shrinkable by removing operations). rapidcheck
// runs the property 100 times by default: about 100 x 130 = 13,000 operations in all (about
// 11,500 under AddressSanitizer, which makes each operation about 6 times slower).
#if defined(__SANITIZE_ADDRESS__)
#define KVVM_MODEL_UNDER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define KVVM_MODEL_UNDER_ASAN 1
#endif
#endif
// ThreadSanitizer makes each operation ~20 times slower (the single-threaded model gains
// nothing from it beyond what the release and ASan runs check): half the operations, so the
// run stays well inside the test timeout on a loaded 2-core machine.
#if defined(__SANITIZE_THREAD__)
#define KVVM_MODEL_UNDER_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define KVVM_MODEL_UNDER_TSAN 1
#endif
#endif
#ifdef KVVM_MODEL_UNDER_ASAN
constexpr int kMaxOps = 230;
#elif defined(KVVM_MODEL_UNDER_TSAN)
constexpr int kMaxOps = 120;
#else
constexpr int kMaxOps = 260;
#endif

// Generated at full size whatever the run's size, so that kinds and numbers are spread
// uniformly (rapidcheck otherwise draws small numbers, i.e. mostly creates, in early runs).
// An operation does not shrink by itself (its numbers mean something only against the state
// it meets, and shrinking seven numbers per operation makes a failure take minutes to
// report); a failing sequence shrinks by dropping operations.
OpSpec make_op(int kind, std::uint32_t a, std::uint32_t b, std::uint32_t c, std::uint32_t d,
               std::uint32_t e, std::uint64_t fault_seed) {
  return OpSpec{kind, a, b, c, d, e, fault_seed};
}

rc::Gen<OpSpec> gen_op() {
  const rc::Gen<std::uint32_t> number = rc::gen::arbitrary<std::uint32_t>();
  return rc::gen::noShrink(rc::gen::resize(
      100, rc::gen::apply(&make_op, rc::gen::inRange(0, 100), number, number, number, number,
                          number, rc::gen::arbitrary<std::uint64_t>())));
}

// After a failure rapidcheck shrinks it by re-running the property on shorter sequences; each
// run costs up to kMaxOps operations, so the search is capped (by a count of runs, not by
// time): past kShrinkRuns runs a candidate is not tried (it counts as passing), and the
// shortest failing sequence found so far is reported (rapidcheck runs it once more for its
// message, which the budget lets through).
constexpr int kShrinkRuns = 300;

RC_GTEST_PROP(ReservationModelTest, RandomOperationsMatchTheModel, ()) {
  const std::uint64_t seed = *rc::gen::arbitrary<std::uint64_t>();
  const std::vector<OpSpec> ops =
      *rc::gen::resize(kMaxOps, rc::gen::container<std::vector<OpSpec>>(gen_op()));
  ShrinkBudget& budget = shrink_budget();
  if (budget.failed && ++budget.runs > kShrinkRuns && !(seed == budget.seed && ops == budget.ops)) {
    RC_SUCCEED("shrink budget spent");
  }
  ++totals().runs;
  ModelRun run(seed);
  run.run(ops);
}

// A handle size larger than the range means one handle of the range's size (the model's
// min(handle_bytes, what is left) rule), however large: checked here for one size the random
// operations never draw.
// (Before the fix, the planning loop advanced by handle_bytes and wrapped around.)
TEST(ReservationModelTest, HandleSizeBeyondTheRangeCommitsOneHandle) {
  auto made = make_host_driver();
  ASSERT_TRUE(made.ok()) << made.status().to_string();
  std::unique_ptr<Driver> driver = std::move(made).value();
  const std::size_t g = driver->granule();
  Governor governor;
  const TierId tier = governor.add_tier("edge", 64 * g);
  HandlePool pool(*driver, PoolOptions{}, &governor, tier);
  auto created = Reservation::create(pool, 8 * g);
  ASSERT_TRUE(created.ok()) << created.status().to_string();
  std::unique_ptr<Reservation> reservation = std::move(created).value();
  kt::World world;
  world.driver = driver.get();
  world.pool = &pool;
  world.governor = &governor;
  world.tier = tier;
  world.reservations = {reservation.get()};

  const std::size_t huge = SIZE_MAX - SIZE_MAX % g;
  for (const std::size_t handle_bytes : {4 * g, huge}) {
    SCOPED_TRACE("handle_bytes " + std::to_string(handle_bytes));
    {
      Result<Grant> grant = governor.prepare(tier, 8 * g);
      ASSERT_TRUE(grant.ok()) << grant.status().to_string();
      const Status status = reservation->commit(2 * g, g, &grant.value(),
                                                CommitOptions{Access::kReadWrite, handle_bytes});
      EXPECT_TRUE(status.ok()) << status.to_string();
    }
    EXPECT_EQ(kt::check_invariants(world), "");
    const std::vector<Block> blocks = reservation->blocks();
    if (!blocks.empty()) {
      EXPECT_EQ(blocks.size(), 1u);
      EXPECT_EQ(blocks[0].offset, 2 * g);
      EXPECT_EQ(blocks[0].bytes, g);
      EXPECT_TRUE(reservation->release(2 * g, g).ok());
    }
  }
}

}  // namespace
}  // namespace kvvm