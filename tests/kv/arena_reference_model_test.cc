// The reference-model test of Arena (the library's, not the simulator's model in
// sim/arena_model.cc). Model-based random test (docs/ARCHITECTURE.md "Tests"): long random
// sequences of admit, ensure
// (grow, shrink, beyond the max context, on a slot without a sequence), finish, release, reclaim
// and graph-capture spans on the host driver, in every layout, with and without commit-ahead,
// through a fault-injecting driver failing a few percent of the create, map, set_access, unmap,
// release and fence calls, a governor tier whose limit is often hit and a pool bound small enough
// that handles above it are released at once. A reference model predicts, per slot, its state
// (free, active, finished, quarantined), its live tokens and its committed windows per fragment (a
// lower bound with commit-ahead), and every result:
//  - bad input (beyond the max context, an unknown slot, a slot with no active sequence) is
//    refused with InvalidArgument / FailedPrecondition and makes no driver call;
//  - during a capture span any call that would map or unmap is refused with Unavailable and no
//    map, unmap, set_access, create or release call happens (the worker waits too);
//  - admit picks the slot the contract says (the best-fitting finished slot, else a free one);
//  - a commit succeeds when no fault was injected and the budget, after reclaiming everything
//    reclaimable, pays for it; it is refused with ResourceExhausted (requested = the bytes the
//    missing windows cost) when it does not; a DriverError only comes from an injected fault;
//  - on an error nothing changes except that the slot may be quarantined, exactly when its
//    range holds poisoned blocks, which the message then says;
//  - reclaim (explicit, or run by the governor inside a commit) only unmaps finished slots
//    (whole) and windows beyond an active sequence's live length, least recently used first,
//    stops as soon as the tier got back what was asked, and reports exactly what it got back;
//    release() leaves the slot free; the commit-ahead worker only ever adds windows up to its
//    target (or quarantines the slot it failed on): it never evicts.
// After every operation: the invariants hold (check_invariants), the tier stays within its limit,
// every slot's mapped windows are a prefix of equal length in every fragment (or the slot is
// quarantined), the arena's stats and token counts equal the model's, its committed bytes equal
// the reservation's mapped bytes when no slot is quarantined, every active sequence's windows
// cover its live tokens, and every live token's bytes (two 8-byte tags per layer, K/V and head,
// written through arena.view() as the sequence grew) read back unchanged.
//
// Operations are generated as raw numbers interpreted against the state they meet (as in
// reservation_model_test.cc), so every sequence is valid and a failure shrinks by dropping
// operations; each operation seeds its own fault plan.
//
// The reference model lives in tests/support/arena_reference_model.h; the deterministic
// regression tests of the bugs it found in arena_model_regression_test.cc.
#include "support/arena_reference_model.h"

#include <gtest/gtest.h>
#include <rapidcheck.h>
#include <rapidcheck/gtest.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "kvvm/kv/layout.h"

namespace kvvm {
namespace {

namespace kt = ::kvvm::testing;
using kt::arena_model::Case;
using kt::arena_model::ModelRun;
using kt::arena_model::OpSpec;
using kt::arena_model::RunConfig;
using kt::arena_model::ShrinkBudget;
using kt::arena_model::totals;

// Operations per run: uniform in [0, kMaxOps]; rapidcheck runs each property 100 times, so about
// 100 x 60 = 6,000 operations at the page granule and 100 x 20 = 2,000 at 2 MiB.
constexpr int kMaxOps = 120;
constexpr int kMaxOps2MiB = 40;

OpSpec make_op(int kind, std::uint32_t a, std::uint32_t b, std::uint32_t c,
               std::uint64_t fault_seed) {
  return OpSpec{kind, a, b, c, fault_seed};
}

// Generated at full size and not shrunk one by one (see reservation_model_test.cc): a failing
// sequence shrinks by dropping operations.
rc::Gen<OpSpec> gen_op() {
  const rc::Gen<std::uint32_t> number = rc::gen::arbitrary<std::uint32_t>();
  return rc::gen::noShrink(
      rc::gen::resize(100, rc::gen::apply(&make_op, rc::gen::inRange(0, 100), number, number,
                                          number, rc::gen::arbitrary<std::uint64_t>())));
}

// After a failure rapidcheck re-runs the property on shorter sequences; past kShrinkRuns runs a
// candidate counts as passing, except the shortest failing case found so far (which rapidcheck
// runs once more to report it). The first failure of each property is also printed in full.
constexpr int kShrinkRuns = 200;

void run_property(std::size_t granule, int max_ops, ShrinkBudget& budget) {
  constexpr std::array kLayouts = {Layout::kTokenMajor, Layout::kSeqMajor, Layout::kHeadMajor};
  Case tried;
  tried.layout = *rc::gen::inRange(0, 3);
  tried.ahead = *rc::gen::element(0u, 0u, 1u, 2u);
  tried.seed = *rc::gen::arbitrary<std::uint64_t>();
  tried.ops = *rc::gen::resize(max_ops, rc::gen::container<std::vector<OpSpec>>(gen_op()));
  if (budget.failed && ++budget.runs > kShrinkRuns && !(budget.shortest == tried)) {
    RC_SUCCEED("shrink budget spent");
  }
  ++totals().runs;
  ModelRun run(
      RunConfig{granule, kLayouts[static_cast<std::size_t>(tried.layout)], tried.ahead, tried.seed},
      budget);
  try {
    run.run(tried.ops);
  } catch (...) {
    if (!budget.shortest || tried.ops.size() < budget.shortest->ops.size()) {
      budget.shortest = tried;
    }
    throw;
  }
}

RC_GTEST_PROP(ArenaModelTest, RandomOperationsMatchTheModel, ()) {
  static ShrinkBudget budget;
  run_property(0, kMaxOps, budget);
}

RC_GTEST_PROP(ArenaModelTest, RandomOperationsMatchTheModelWithA2MiBGranule, ()) {
  static ShrinkBudget budget;
  run_property(2u << 20, kMaxOps2MiB, budget);
}

}  // namespace
}  // namespace kvvm
