// The reference-model test of Arena (the library's, not the simulator's model in
// tools/kvvm/arena_model.cc). Model-based random test (DESIGN.md "Tests"): long random
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
// The ArenaModelBugs tests at the end line up, one each and deterministically, the arena bugs
// this test and its plain tests found; all six are fixed and these are regression tests.
#include <gtest/gtest.h>
#include <rapidcheck.h>
#include <rapidcheck/gtest.h>
#include <sys/mman.h>

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

#include "kvvm/arena.h"
#include "kvvm/driver.h"
#include "kvvm/fault_driver.h"
#include "kvvm/governor.h"
#include "kvvm/handle_pool.h"
#include "kvvm/host_driver.h"
#include "kvvm/layout.h"
#include "kvvm/reservation.h"
#include "support/invariants.h"
#include "support/pattern.h"

namespace kvvm {
namespace {

namespace kt = ::kvvm::testing;
using std::chrono::milliseconds;

// A small geometry whose token is 1 KiB (2 layers, 2 KV heads, head dim 64, fp16): a page holds
// 4 tokens in token-major, 16 per fragment in seq-major and 32 per fragment in head-major.
Geometry small_geometry() { return Geometry{"test-small", 2, 2, 64, DType::kFp16}; }

// Windows per fragment of a slot, by layout, so every layout has 12 to 16 windows per slot.
std::uint64_t windows_per_fragment_of(Layout layout) {
  switch (layout) {
    case Layout::kTokenMajor:
      return 12;  // 1 fragment
    case Layout::kSeqMajor:
      return 3;  // 4 fragments
    case Layout::kHeadMajor:
      return 2;  // 8 fragments
  }
  return 1;
}

constexpr std::uint32_t kSlots = 5;
constexpr std::uint64_t kTierPercent = 45;  // of every slot fully committed: often hit
constexpr std::uint64_t kPoolGranules = 3;  // handles returned above this are released
constexpr double kFaultFraction = 0.04;
constexpr std::array kFaultedOps = {DriverOp::kCreate, DriverOp::kMap,     DriverOp::kSetAccess,
                                    DriverOp::kUnmap,  DriverOp::kRelease, DriverOp::kFence};
// Operations per run: uniform in [0, kMaxOps]; rapidcheck runs each property 100 times, so about
// 100 x 60 = 6,000 operations at the page granule and 100 x 20 = 2,000 at 2 MiB.
constexpr int kMaxOps = 120;
constexpr int kMaxOps2MiB = 40;

struct OpSpec {
  int kind = 0;
  std::uint32_t a = 0, b = 0, c = 0;
  std::uint64_t fault_seed = 0;
};

std::ostream& operator<<(std::ostream& os, const OpSpec& op) {
  return os << "{" << op.kind << " " << op.a << " " << op.b << " " << op.c << " " << op.fault_seed
            << "}";
}

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

using kt::mix;

// After a failure rapidcheck re-runs the property on shorter sequences; past kShrinkRuns runs a
// candidate counts as passing, except the shortest failing case found so far (which rapidcheck
// runs once more to report it). The first failure of each property is also printed in full.
constexpr int kShrinkRuns = 200;
struct Case {
  int layout = 0;
  std::uint32_t ahead = 0;
  std::uint64_t seed = 0;
  std::vector<OpSpec> ops;
  bool operator==(const Case& other) const {
    return layout == other.layout && ahead == other.ahead && seed == other.seed &&
           ops.size() == other.ops.size() &&
           std::equal(ops.begin(), ops.end(), other.ops.begin(), [](const auto& x, const auto& y) {
             return x.kind == y.kind && x.a == y.a && x.b == y.b && x.c == y.c &&
                    x.fault_seed == y.fault_seed;
           });
  }
};
struct ShrinkBudget {
  bool failed = false;
  int runs = 0;
  std::optional<Case> shortest;
};

struct Totals {
  std::uint64_t runs = 0;
  std::uint64_t ops = 0;
  std::map<std::string, std::uint64_t> outcomes;
};
Totals& totals() {
  static Totals t;
  return t;
}

class TotalsReport : public ::testing::Environment {
 public:
  void TearDown() override {
    const Totals& t = totals();
    if (t.runs == 0) return;
    std::cout << "[ arena model ] " << t.ops << " operations in " << t.runs << " runs:";
    for (const auto& [what, count] : t.outcomes) std::cout << " " << what << "=" << count;
    std::cout << "\n";
  }
};
[[maybe_unused]] ::testing::Environment* const kTotalsReport =
    ::testing::AddGlobalTestEnvironment(new TotalsReport);

// ---------------------------------------------------------------------------------------------
// The model.

enum class State { kFree, kActive, kFinished, kQuarantined };

const char* name(State state) {
  switch (state) {
    case State::kFree:
      return "free";
    case State::kActive:
      return "active";
    case State::kFinished:
      return "finished";
    case State::kQuarantined:
      return "quarantined";
  }
  return "?";
}

struct ModelSlot {
  State state = State::kFree;
  std::uint64_t tokens = 0;      // live length (0 unless active)
  std::uint64_t windows = 0;     // committed windows per fragment (as observed after each op)
  std::uint64_t generation = 0;  // bumped by every admission: the content tags' salt
  std::uint64_t last_used = 0;   // the arena's tick of the last admit / ensure / finish
};

struct RunConfig {
  std::size_t granule = 0;  // 0: the page size
  Layout layout = Layout::kTokenMajor;
  std::uint32_t ahead = 0;
  std::uint64_t seed = 0;
};

class ModelRun {
 public:
  ModelRun(const RunConfig& config, ShrinkBudget& budget)
      : seed_(config.seed), ahead_(config.ahead), budget_(budget) {
    auto driver = make_host_driver(HostDriverOptions{config.granule});
    RC_ASSERT(driver.ok());
    real_ = std::move(driver).value();
    fault_ = std::make_unique<FaultDriver>(*real_);
    g_ = real_->granule();
    const Geometry geometry = small_geometry();
    auto probe = plan_layout(geometry, config.layout, g_, 1);
    RC_ASSERT(probe.ok());
    const std::uint64_t context =
        windows_per_fragment_of(config.layout) * g_ / probe->contiguous_bytes_per_token;
    auto plan = plan_layout(geometry, config.layout, g_, context);
    RC_ASSERT(plan.ok());
    plan_ = *plan;
    fragments_ = plan_.fragments;
    max_windows_ = plan_.fragment_stride / g_;
    per_window_ = std::max<std::uint64_t>(1, g_ / plan_.contiguous_bytes_per_token);
    const std::uint64_t tier_granules = kSlots * fragments_ * max_windows_ * kTierPercent / 100;
    tier_ = governor_.add_tier("arena-model", tier_granules * g_);
    pool_ = std::make_unique<HandlePool>(
        *fault_, PoolOptions{.max_pooled_bytes = kPoolGranules * g_}, &governor_, tier_);
    auto arena = Arena::create(*pool_, governor_,
                               ArenaOptions{plan_, kSlots, tier_, ahead_, milliseconds(0)});
    RC_ASSERT(arena.ok());
    arena_ = std::move(arena).value();
    slots_.resize(kSlots);
    context_ = std::string(to_string(config.layout)) + ", granule " + std::to_string(g_) +
               ", ahead " + std::to_string(ahead_);
  }
  ModelRun(const ModelRun&) = delete;
  ModelRun& operator=(const ModelRun&) = delete;

  ~ModelRun() {
    fault_->clear();
    guard_.reset();
    arena_.reset();
    // Ranges a quarantined slot kept alive stay reserved for good; give them back to the OS so
    // later runs do not read them in every /proc/self/maps.
    for (const auto& [base, size] : leaked_ranges_) ::munmap(reinterpret_cast<void*>(base), size);
  }

  void run(const std::vector<OpSpec>& ops) {
    check_all();
    for (std::size_t i = 0; i < ops.size(); ++i) {
      index_ = i;
      const OpSpec& op = ops[i];
      op_begin(op.fault_seed);
      arm(op.fault_seed, op.fault_seed % 4 != 0);  // one operation in four runs clean
      apply(op);
      fault_->clear();
      ++totals().ops;
      check_all();
    }
    // Tear down without faults: end any capture, let the worker settle, then destroy the arena.
    index_ = ops.size();
    if (guard_) {
      note("end capture (teardown)");
      guard_.reset();
      settle(0);
      reconcile();
      check_all();
    }
    const Address base = arena_->reservation().base();
    const std::size_t size = arena_->reservation().size();
    const TeardownStats before = teardown_stats();
    arena_.reset();
    const TeardownStats after = teardown_stats();
    leaked_mappings_ = after.leaked_blocks - before.leaked_blocks;
    const std::uint64_t leaked_addresses = after.leaked_address_bytes - before.leaked_address_bytes;
    leaked_reservations_ = leaked_addresses / size;
    if (leaked_addresses > 0) leaked_ranges_.emplace_back(base, size);
    if ((quarantined_count() == 0) != (leaked_mappings_ == 0)) {
      fail("teardown left " + std::to_string(leaked_mappings_) + " blocks mapped with " +
           std::to_string(quarantined_count()) + " quarantined slot(s)");
    }
    const std::string problems = kt::check_invariants(world());
    if (!problems.empty()) fail("after the arena's teardown:\n" + problems);
  }

 private:
  // -------------------------------------------------------------------------------------------
  // Plumbing.

  void arm(std::uint64_t seed, bool faults) {
    fault_->clear();
    if (!faults) return;
    for (std::size_t i = 0; i < kFaultedOps.size(); ++i) {
      fault_->fail_fraction(kFaultedOps[i], kFaultFraction, mix(seed + i) ^ seed_);
    }
  }

  // With commit-ahead, waits until the worker has nothing left to do. Faults stay armed while it
  // runs, so that its failure paths (stall, quarantine) are taken too. (Before 231aef5 two
  // sequences' leads could evict each other forever here: see
  // ArenaModelBugs.CommitAheadSettlesWhenTheBudgetHoldsOnlyOneSlotsLead.)
  void settle(std::uint64_t seed) {
    if (ahead_ == 0 || guard_) return;
    arm(mix(seed ^ 0x5e771e), true);
    arena_->wait_until_idle();
    fault_->clear();
  }

  [[noreturn]] void fail(const std::string& why) {
    std::ostringstream text;
    text << "[" << context_ << "] operation #" << index_ << ": " << why << "\nslots:";
    for (std::size_t s = 0; s < slots_.size(); ++s) {
      const ModelSlot& m = slots_[s];
      text << " " << s << ":" << name(m.state) << "/" << m.tokens << "t/" << m.windows << "w";
    }
    text << "\nlast operations:\n";
    for (const std::string& line : trace_) text << "  " << line << "\n";
    if (!budget_.failed) std::cerr << "[ arena model ] first failure: " << text.str();
    budget_.failed = true;
    RC_FAIL(text.str());
  }

  void note(std::string what) {
    trace_.push_back(std::move(what));
    if (trace_.size() > 24) trace_.pop_front();
  }

  void count(const std::string& outcome) { ++totals().outcomes[outcome]; }

  kt::World world() const {
    kt::World world;
    world.driver = fault_.get();
    world.real_driver = real_.get();
    world.pool = pool_.get();
    world.governor = const_cast<Governor*>(&governor_);
    world.tier = tier_;
    if (arena_) world.reservations = arena_->reservations();
    world.leaked_mappings = leaked_mappings_;
    world.leaked_reservations = leaked_reservations_;
    return world;
  }

  std::uint64_t wpf(std::uint64_t tokens) const { return plan_.windows_per_fragment(tokens); }
  std::uint64_t window_bytes() const { return fragments_ * g_; }  // one window in every fragment
  std::uint64_t ahead_target(const ModelSlot& m) const {
    return std::min(wpf(m.tokens) + ahead_, max_windows_);
  }
  std::size_t quarantined_count() const {
    return static_cast<std::size_t>(std::count_if(slots_.begin(), slots_.end(), [](const auto& m) {
      return m.state == State::kQuarantined;
    }));
  }

  // Driver calls that map, unmap or make memory: none may happen during a capture.
  std::uint64_t memory_calls() const {
    const DriverCallCounts calls = fault_->counts();
    return calls.of(DriverOp::kMap) + calls.of(DriverOp::kUnmap) + calls.of(DriverOp::kSetAccess) +
           calls.of(DriverOp::kCreate) + calls.of(DriverOp::kRelease);
  }

  void expect_no_driver_call(std::uint64_t calls_before, const std::string& result) {
    const std::uint64_t made = fault_->counts().total() - calls_before;
    if (made != 0) fail(result + ": refused, yet made " + std::to_string(made) + " driver call(s)");
  }

  void expect_code(const Status& status, StatusCode code, const std::string& result) {
    if (status.code() != code)
      fail(result + " (expected code " + std::to_string(static_cast<int>(code)) + ")");
  }

  // Bytes a commit could get: what is free in the tier plus everything reclaimable (pooled
  // handles, finished slots, windows beyond live lengths), the target slot excepted (busy).
  std::uint64_t headroom(std::size_t target) const {
    const TierStats tier = governor_.stats(tier_);
    std::uint64_t bytes = tier.limit - tier.used + pool_->snapshot().pooled_bytes;
    for (std::size_t s = 0; s < slots_.size(); ++s) {
      const ModelSlot& m = slots_[s];
      if (s == target) continue;
      if (m.state == State::kFinished) bytes += m.windows * window_bytes();
      if (m.state == State::kActive) bytes += (m.windows - wpf(m.tokens)) * window_bytes();
    }
    return bytes;
  }

  // -------------------------------------------------------------------------------------------
  // Observation: what the reservation has mapped under each slot.

  struct Observed {
    std::vector<bool> poisoned;
    std::vector<std::optional<std::uint64_t>> windows;  // nullopt: not one prefix per fragment
    std::vector<std::string> shape;                     // for messages
  };

  Observed observe() const {
    const std::uint64_t slot_windows = fragments_ * max_windows_;
    std::vector<std::vector<bool>> mapped(kSlots, std::vector<bool>(slot_windows, false));
    Observed seen;
    seen.poisoned.assign(kSlots, false);
    for (const Block& block : arena_->reservation().blocks()) {
      for (std::size_t at = block.offset; at < block.offset + block.bytes; at += g_) {
        const std::size_t slot = at / plan_.slot_stride;
        const std::size_t window = (at % plan_.slot_stride) / g_;
        if (slot >= kSlots) continue;
        mapped[slot][window] = true;
        if (block.poisoned) seen.poisoned[slot] = true;
      }
    }
    for (std::size_t s = 0; s < kSlots; ++s) {
      std::optional<std::uint64_t> common;
      bool prefix = true;
      std::string shape;
      for (std::uint64_t f = 0; f < fragments_; ++f) {
        std::uint64_t length = 0;
        while (length < max_windows_ && mapped[s][f * max_windows_ + length]) ++length;
        for (std::uint64_t w = length; w < max_windows_; ++w) {
          if (mapped[s][f * max_windows_ + w]) prefix = false;
        }
        if (common && *common != length) prefix = false;
        common = length;
        shape += (f ? "," : "") + std::to_string(length);
      }
      seen.windows.push_back(prefix ? common : std::nullopt);
      seen.shape.push_back(shape);
    }
    return seen;
  }

  // What the op may have changed beyond its prediction: `reclaimable` lets finished slots go
  // free and active slots lose their windows beyond the live length (a reclaim ran), `target`
  // may be quarantined (its commit or unmap failed), `released` may go free (release()), and
  // with commit-ahead the worker may commit up to an active slot's target or quarantine it (it
  // never evicts anything). Learns those changes; fails on any other.
  struct Leeway {
    bool reclaimable = false;
    std::optional<std::size_t> target;
    std::optional<std::size_t> released;
  };

  void reconcile() { reconcile(Leeway{}); }
  void reconcile(const Leeway& leeway) {
    const Observed seen = observe();
    for (std::size_t s = 0; s < kSlots; ++s) {
      ModelSlot& m = slots_[s];
      const std::string where = "slot " + std::to_string(s) + " (" + name(m.state) + ", " +
                                std::to_string(m.tokens) + " tokens, " + std::to_string(m.windows) +
                                " windows)";
      if (m.state == State::kQuarantined) {
        if (!seen.poisoned[s]) fail(where + ": quarantined, but no poisoned block left under it");
        continue;
      }
      if (seen.poisoned[s]) {
        const bool candidate = (m.state == State::kFinished && m.windows > 0) ||
                               (m.state == State::kActive && m.windows > wpf(m.tokens));
        const bool allowed = leeway.target == s || leeway.released == s ||
                             (leeway.reclaimable && candidate) ||
                             (ahead_ > 0 && m.state == State::kActive);
        if (!allowed) fail(where + ": poisoned blocks appeared under it");
        m.state = State::kQuarantined;
        count("slot quarantined");
        continue;
      }
      if (!seen.windows[s]) {
        fail(where + ": mapped windows per fragment are not one common prefix: " + seen.shape[s]);
      }
      const std::uint64_t w = *seen.windows[s];
      if (w == m.windows) continue;
      bool allowed = false;
      if (m.state == State::kFinished) {
        allowed = (leeway.reclaimable || leeway.released == s) && m.windows > 0 && w == 0;
        if (allowed) {
          m.state = State::kFree;
          count("finished slot reclaimed");
        }
      } else if (m.state == State::kActive) {
        const std::uint64_t live = wpf(m.tokens);
        allowed = (leeway.reclaimable && w == live && m.windows > live) ||
                  (ahead_ > 0 && w == ahead_target(m));  // perhaps after a reclaim
        count(w < m.windows ? "ahead windows reclaimed" : "ahead windows committed");
      }
      if (!allowed)
        fail(where + ": now has " + std::to_string(w) + " windows (" + seen.shape[s] + ")");
      m.windows = w;
    }
  }

  // -------------------------------------------------------------------------------------------
  // Operations.

  // Ends a capture span that is over; the worker resumes (and is let settle) before the
  // operation runs.
  void op_begin(std::uint64_t seed) {
    if (guard_ && capture_ops_left_ == 0) {
      note("end capture");
      guard_.reset();
      count("capture ended");
      settle(seed ^ 0xe4d);
      reconcile();
    }
  }

  // The mix: admit 18%, ensure 40%, finish 14%, reclaim 14%, capture 6%, decode step 8%.
  void apply(const OpSpec& op) {
    const bool captured = guard_.has_value();
    const std::uint64_t calls_before = memory_calls();
    if (op.kind < 18) {
      admit(op);
    } else if (op.kind < 58) {
      ensure(op, false);
    } else if (op.kind < 72) {
      finish(op);
    } else if (op.kind < 86) {
      reclaim(op);
    } else if (op.kind < 92) {
      if (guard_) {
        ensure(op, true);
      } else {
        note("begin capture");
        guard_.emplace(arena_->begin_capture());
        capture_ops_left_ = 1 + op.a % 4;
        count("capture begun");
      }
    } else {
      ensure(op, true);
    }
    if (captured) {
      if (ahead_ > 0) std::this_thread::yield();  // give a misbehaving worker its chance
      if (memory_calls() != calls_before) {
        fail("a map, unmap, set_access, create or release call happened during capture");
      }
      --capture_ops_left_;
    }
    if (!guard_) settle(op.fault_seed);
    reconcile(leeway_);
    leeway_ = {};
    if (failed_target_) {
      const bool poisoned = slots_[*failed_target_].state == State::kQuarantined;
      if (poisoned != failed_said_poisoned_) {
        fail("slot " + std::to_string(*failed_target_) +
             (poisoned ? " was quarantined, yet the error does not say poisoned"
                       : " says poisoned, yet it was not quarantined"));
      }
      failed_target_.reset();
    }
    if (post_) {
      post_();
      post_ = nullptr;
    }
  }

  std::uint64_t pick_tokens(std::uint32_t x, std::uint32_t y) const {
    const std::uint64_t max = plan_.max_context;
    switch (x % 8) {
      case 0:
        return 0;
      case 1:
      case 2:
        return 1 + y % (per_window_ + 1);  // short
      case 3: {
        const std::uint64_t boundary = (1 + y % max_windows_) * per_window_;  // at a boundary
        return std::min(max, boundary + (y >> 8) % 3 - 1);
      }
      default:
        return y % (max + 1);
    }
  }

  std::optional<SlotId> predict_admit(std::uint64_t needed) const {
    std::optional<SlotId> chosen;
    for (SlotId id = 0; id < kSlots; ++id) {
      if (slots_[id].state != State::kFinished) continue;
      if (!chosen) {
        chosen = id;
        continue;
      }
      const std::uint64_t have = slots_[id].windows, best = slots_[*chosen].windows;
      const bool covers = have >= needed, best_covers = best >= needed;
      if ((covers && (!best_covers || have < best)) || (!covers && !best_covers && have > best)) {
        chosen = id;
      }
    }
    for (SlotId id = 0; id < kSlots && !chosen; ++id) {
      if (slots_[id].state == State::kFree) chosen = id;
    }
    return chosen;
  }

  // A failed commit of `request` bytes for `slot`: checks the code against the budget and the
  // faults, and lets the slot be quarantined.
  void commit_failed(const Status& status, std::size_t slot, std::uint64_t request, bool feasible,
                     bool faulted, const std::string& result) {
    if (status.code() == StatusCode::kResourceExhausted) {
      if (feasible && !faulted) {
        fail(result + ": refused, yet the tier could pay " + std::to_string(request) +
             " bytes after reclaiming");
      }
      if (!status.exhaustion() || status.exhaustion()->requested != request) {
        fail(result + ": the refusal does not carry requested = " + std::to_string(request));
      }
    } else if (status.code() != StatusCode::kDriverError || !faulted) {
      fail(result + " (a failed commit must be ResourceExhausted or an injected DriverError)");
    }
    if (!feasible && status.code() != StatusCode::kResourceExhausted) {
      fail(result + ": beyond the budget, expected ResourceExhausted");
    }
    leeway_.target = slot;
    failed_target_ = slot;
    failed_said_poisoned_ = status.message().find("poisoned") != std::string::npos;
  }

  void admit(const OpSpec& op) {
    const std::uint64_t max = plan_.max_context;
    const std::uint64_t tokens = op.b % 16 == 0 ? max + 1 + op.c % 8 : pick_tokens(op.a, op.c);
    const std::uint64_t needed = tokens <= max ? wpf(tokens) : 0;
    const std::string what = "admit " + std::to_string(tokens);
    note(what);
    const std::uint64_t calls = fault_->counts().total();
    const std::uint64_t injected = fault_->injected();
    const std::optional<SlotId> predicted = predict_admit(needed);
    const std::uint64_t have = predicted ? slots_[*predicted].windows : 0;
    const std::uint64_t request = have < needed ? (needed - have) * window_bytes() : 0;
    const bool feasible = predicted && request <= headroom(*predicted);
    Result<SlotId> got = arena_->admit(tokens);
    const bool faulted = fault_->injected() > injected;
    const std::string result =
        what + ": " + (got.ok() ? "slot " + std::to_string(*got) : got.status().to_string());
    note("  -> " + result);

    if (tokens > max) {
      expect_code(got.status(), StatusCode::kInvalidArgument, result);
      expect_no_driver_call(calls, result);
      count("admit beyond max context");
      return;
    }
    if (guard_) {
      expect_code(got.status(), StatusCode::kUnavailable, result);
      expect_no_driver_call(calls, result);
      count("admit refused during capture");
      return;
    }
    if (!predicted) {
      expect_code(got.status(), StatusCode::kUnavailable, result);
      expect_no_driver_call(calls, result);
      count("admit with every slot taken");
      return;
    }
    if (got.ok()) {
      if (*got != *predicted) fail(result + ", expected slot " + std::to_string(*predicted));
      if (!feasible) fail(result + ": admitted beyond the budget");
      ModelSlot& m = slots_[*got];
      const bool reused = m.state == State::kFinished;
      m.state = State::kActive;
      m.tokens = tokens;
      m.windows = std::max(have, needed);
      ++m.generation;
      m.last_used = ++tick_;
      ++expected_.admissions;
      if (reused) ++expected_.reused_admissions;
      leeway_.reclaimable = request > 0;
      writes_.push_back({*got, 0, tokens});
      count(reused ? (request > 0 ? "admit reused + commit" : "admit reused") : "admit ok");
      return;
    }
    if (request == 0) fail(result + ": failed, yet it needed no commit");
    commit_failed(got.status(), *predicted, request, feasible, faulted, result);
    if (got.status().code() == StatusCode::kResourceExhausted) ++expected_.refusals;
    leeway_.reclaimable = true;
    count(got.status().code() == StatusCode::kResourceExhausted ? "admit refused (budget)"
                                                                : "admit failed (fault)");
  }

  void ensure(const OpSpec& op, bool decode_step) {
    std::vector<SlotId> active, inactive;
    for (SlotId id = 0; id < kSlots; ++id) {
      (slots_[id].state == State::kActive ? active : inactive).push_back(id);
    }
    const std::uint64_t max = plan_.max_context;
    SlotId slot = 0;
    std::uint64_t tokens = 0;
    const std::uint32_t mode = op.b % 16;
    if (active.empty() && mode != 0) {
      admit(op);  // nothing to grow yet
      return;
    }
    if (mode == 0) {  // no sequence there, or an unknown slot
      slot =
          inactive.empty() || op.a % 8 == 0 ? kSlots + op.a % 3 : inactive[op.a % inactive.size()];
      tokens = pick_tokens(op.c, op.a);
    } else {
      slot = active[op.a % active.size()];
      const std::uint64_t now = slots_[slot].tokens;
      if (mode == 1) {
        tokens = max + 1 + op.c % 4;  // beyond the max context
      } else if (decode_step) {
        tokens = std::min(max, now + 1 + op.c % 3);
      } else if (mode < 5) {
        tokens = now == 0 ? 0 : op.c % (now + 1);  // shrink (or stay)
      } else if (mode < 11) {
        tokens = std::min(max, now + 1 + op.c % (per_window_ + 1));
      } else {
        tokens = pick_tokens(op.c, op.a);
      }
    }
    const std::string what = "ensure slot " + std::to_string(slot) + " to " +
                             std::to_string(tokens) + (decode_step ? " (decode)" : "");
    note(what);
    const std::uint64_t calls = fault_->counts().total();
    const std::uint64_t injected = fault_->injected();
    const bool known = slot < kSlots;
    const std::uint64_t needed = tokens <= max ? wpf(tokens) : 0;
    const std::uint64_t have = known ? slots_[slot].windows : 0;
    const std::uint64_t request = have < needed ? (needed - have) * window_bytes() : 0;
    const bool feasible = known && request <= headroom(slot);
    const Status status = arena_->ensure(slot, tokens);
    const bool faulted = fault_->injected() > injected;
    const std::string result = what + ": " + status.to_string();
    note("  -> " + result);

    if (!known || tokens > max) {
      expect_code(status, StatusCode::kInvalidArgument, result);
      expect_no_driver_call(calls, result);
      count(known ? "ensure beyond max context" : "ensure of an unknown slot");
      return;
    }
    ModelSlot& m = slots_[slot];
    if (m.state != State::kActive) {
      expect_code(status, StatusCode::kFailedPrecondition, result);
      expect_no_driver_call(calls, result);
      count("ensure without a sequence");
      return;
    }
    ++expected_.ensures;
    const std::uint64_t before = m.tokens;
    if (needed <= m.windows) {
      if (!status.ok()) fail(result + ": its windows were mapped already");
      m.tokens = tokens;
      m.last_used = ++tick_;
      if (tokens > before) writes_.push_back({slot, before, tokens});
      count(tokens < before ? "ensure shrink" : "ensure within mapped windows");
      return;
    }
    if (guard_) {
      expect_code(status, StatusCode::kUnavailable, result);
      if (status.message().find("during graph capture") == std::string::npos) {
        fail(result + ": the refusal does not name the capture");
      }
      expect_no_driver_call(calls, result);
      count("ensure refused during capture");
      return;
    }
    ++expected_.ensures_committing;
    leeway_.reclaimable = true;
    if (status.ok()) {
      if (!feasible) fail(result + ": committed beyond the budget");
      m.windows = needed;
      m.tokens = tokens;
      m.last_used = ++tick_;
      writes_.push_back({slot, before, tokens});
      count("ensure commit");
      return;
    }
    commit_failed(status, slot, request, feasible, faulted, result);
    if (status.code() == StatusCode::kResourceExhausted) ++expected_.refusals;
    count(status.code() == StatusCode::kResourceExhausted ? "ensure refused (budget)"
                                                          : "ensure failed (fault)");
  }

  void finish(const OpSpec& op) {
    std::vector<SlotId> active, inactive;
    for (SlotId id = 0; id < kSlots; ++id) {
      (slots_[id].state == State::kActive ? active : inactive).push_back(id);
    }
    if (active.empty() && op.b % 8 != 0) {
      admit(op);  // nothing to finish yet
      return;
    }
    SlotId slot = 0;
    if (op.b % 8 == 0) {
      slot =
          inactive.empty() || op.a % 8 == 0 ? kSlots + op.a % 3 : inactive[op.a % inactive.size()];
    } else {
      slot = active[op.a % active.size()];
    }
    // release() is finish() and an immediate unmap of the slot (its fence is complete at once
    // on the host).
    const bool release = op.c % 3 == 0;
    const std::string what = (release ? "release slot " : "finish slot ") + std::to_string(slot);
    note(what);
    const std::uint64_t calls = fault_->counts().total();
    const std::uint64_t injected = fault_->injected();
    const Status status = release ? arena_->release(slot) : arena_->finish(slot);
    const bool faulted = fault_->injected() > injected;
    const std::string result = what + ": " + status.to_string();
    note("  -> " + result);
    if (slot >= kSlots) {
      expect_code(status, StatusCode::kInvalidArgument, result);
      expect_no_driver_call(calls, result);
      count("finish of an unknown slot");
      return;
    }
    ModelSlot& m = slots_[slot];
    if (m.state != State::kActive) {
      expect_code(status, StatusCode::kFailedPrecondition, result);
      expect_no_driver_call(calls, result);
      count("finish without a sequence");
      return;
    }
    if (guard_ && !status.ok()) {  // finish maps nothing: refusing it during capture is allowed
      expect_code(status, StatusCode::kUnavailable, result);
      expect_no_driver_call(calls, result);
      count("finish refused during capture");
      return;
    }
    if (!status.ok()) {
      if (status.code() != StatusCode::kDriverError || !faulted) fail(result);
      count("finish failed (fence fault)");
      return;
    }
    m.state = State::kFinished;
    m.tokens = 0;
    m.last_used = ++tick_;
    if (!release) {
      count("finish ok");
      return;
    }
    leeway_.released = slot;
    const bool mapped = m.windows > 0;
    post_ = [this, slot, mapped, faulted, result] {
      const State state = slots_[slot].state;
      if (!faulted && mapped && state != State::kFree) {
        fail(result + ": the slot is " + name(state) + ", not free with its windows unmapped");
      }
      count(state == State::kFree ? "release ok (unmapped)" : "release ok (kept)");
    };
  }

  void reclaim(const OpSpec& op) {
    std::uint64_t bytes = 0;
    switch (op.c % 6) {
      case 0:
        bytes = 0;
        break;
      case 1:
        bytes = 1;
        break;
      case 2:
      case 3:
        bytes = (1 + op.a % 8) * g_;
        break;
      case 4:
        bytes = (op.a % 20) * window_bytes();
        break;
      default:
        bytes = UINT64_MAX;
        break;
    }
    const std::string what = "reclaim " + std::to_string(bytes);
    note(what);
    // The candidates in the order the contract gives: finished slots least recently used
    // first, then windows beyond active live lengths, least recently used first.
    std::vector<std::size_t> order;
    for (const State state : {State::kFinished, State::kActive}) {
      std::vector<std::size_t> group;
      for (std::size_t s = 0; s < kSlots; ++s) {
        const ModelSlot& m = slots_[s];
        if (m.state != state) continue;
        if (state == State::kFinished ? m.windows > 0 : m.windows > wpf(m.tokens)) {
          group.push_back(s);
        }
      }
      std::sort(group.begin(), group.end(), [&](std::size_t x, std::size_t y) {
        return slots_[x].last_used < slots_[y].last_used;
      });
      order.insert(order.end(), group.begin(), group.end());
    }
    const std::vector<ModelSlot> before = slots_;
    const std::uint64_t calls = fault_->counts().total();
    const std::uint64_t injected = fault_->injected();
    const std::uint64_t used_before = governor_.stats(tier_).used;
    const std::uint64_t returned = arena_->reclaim(bytes);
    const bool faulted = fault_->injected() > injected;
    const std::uint64_t used_after = governor_.stats(tier_).used;
    const std::string result = what + ": returned " + std::to_string(returned);
    note("  -> " + result);
    if (guard_) {
      if (returned != 0) fail(result + " during capture");
      expect_no_driver_call(calls, result);
      count("reclaim during capture");
      return;
    }
    leeway_.reclaimable = true;
    if (ahead_ > 0) {  // the worker commits again meanwhile: only the model's leeway applies
      count("reclaim (commit-ahead)");
      return;
    }
    if (used_after > used_before || returned > used_before - used_after) {
      fail(result + ", yet the tier went from " + std::to_string(used_before) + " to " +
           std::to_string(used_after) + " bytes used");
    }
    if (returned != used_before - used_after) {
      fail(result + ", yet the tier got back " + std::to_string(used_before - used_after));
    }
    // Which candidates it touched, checked once reconcile() learned the new state.
    post_ = [this, before, order, bytes, returned, faulted, result] {
      std::vector<std::size_t> touched;
      std::uint64_t unmapped = 0;
      for (std::size_t s : order) {
        const ModelSlot& was = before[s];
        const ModelSlot& now = slots_[s];
        if (now.state == was.state && now.windows == was.windows) continue;
        touched.push_back(s);
      }
      count(touched.empty() ? "reclaim (nothing)" : "reclaim");
      if (faulted) return;  // a fence or release fault may skip a candidate or keep its bytes
      for (std::size_t i = 0; i < touched.size(); ++i) {
        if (touched[i] != order[i]) {
          fail(result + ": reclaimed slot " + std::to_string(touched[i]) +
               " out of order (expected slot " + std::to_string(order[i]) + " next)");
        }
      }
      if (bytes == 0 && !touched.empty()) fail(result + ": reclaimed for 0 bytes");
      if (bytes > 0 && !order.empty() && touched.empty()) fail(result + ": reclaimed nothing");
      if (touched.size() < order.size() && returned < bytes) {
        fail(result + ": stopped before giving back " + std::to_string(bytes) + " bytes");
      }
      for (std::size_t i = 0; i + 1 < touched.size(); ++i) {
        const ModelSlot& was = before[touched[i]];
        unmapped +=
            (was.windows - (was.state == State::kActive ? wpf(was.tokens) : 0)) * window_bytes();
      }
      if (unmapped >= bytes && !touched.empty()) {
        fail(result + ": went on unmapping after " + std::to_string(unmapped) +
             " bytes, which were enough");
      }
    };
  }

  // -------------------------------------------------------------------------------------------
  // Content: two 8-byte tags per (layer, K/V, head) of a sampled token, at both ends of the
  // head's bytes, salted with the slot's generation.

  struct Write {
    SlotId slot;
    std::uint64_t from, to;
  };

  bool sampled(std::uint64_t token) const {
    const std::uint64_t in_window = token % per_window_;
    return in_window < 2 || in_window + 2 >= per_window_ || token % 37 == 0;
  }

  std::uint64_t tag(SlotId slot, std::uint64_t generation, std::uint64_t token,
                    std::uint64_t piece) const {
    return mix(seed_ ^
               mix((std::uint64_t{slot} << 56) ^ (generation << 36) ^ (token << 8) ^ piece));
  }

  template <typename Fn>
  void for_each_piece(SlotId slot, std::uint64_t from, std::uint64_t to, Fn&& fn) const {
    const KvView view = arena_->view();
    const Geometry& geometry = plan_.geometry;
    const std::uint64_t piece_bytes = std::uint64_t{geometry.head_dim} * geometry.element_bytes();
    for (std::uint64_t t = from; t < to; ++t) {
      if (!sampled(t)) continue;
      std::uint64_t piece = 0;
      for (std::uint32_t l = 0; l < geometry.layers; ++l) {
        for (std::uint32_t kv = 0; kv < 2; ++kv) {
          for (std::uint32_t h = 0; h < geometry.kv_heads; ++h, ++piece) {
            const Address at = view.address(slot, l, kv, h, t);
            fn(t, piece, at, at + piece_bytes - sizeof(std::uint64_t));
          }
        }
      }
    }
  }

  // Direct loads and stores: check_all() has verified that these windows are mapped
  // read-write in /proc/self/maps.
  void write_tokens(SlotId slot, std::uint64_t from, std::uint64_t to) {
    const std::uint64_t generation = slots_[slot].generation;
    for_each_piece(slot, from, to,
                   [&](std::uint64_t t, std::uint64_t piece, Address head, Address tail) {
                     const std::uint64_t value = tag(slot, generation, t, piece);
                     const std::uint64_t inverse = ~value;
                     std::memcpy(reinterpret_cast<void*>(head), &value, sizeof value);
                     std::memcpy(reinterpret_cast<void*>(tail), &inverse, sizeof inverse);
                   });
  }

  void check_content() {
    for (SlotId s = 0; s < kSlots; ++s) {
      const ModelSlot& m = slots_[s];
      if (m.state != State::kActive) continue;
      for_each_piece(
          s, 0, m.tokens, [&](std::uint64_t t, std::uint64_t piece, Address head, Address tail) {
            std::uint64_t value = 0, inverse = 0;
            std::memcpy(&value, reinterpret_cast<const void*>(head), sizeof value);
            std::memcpy(&inverse, reinterpret_cast<const void*>(tail), sizeof inverse);
            const std::uint64_t expected = tag(s, m.generation, t, piece);
            if (value != expected || inverse != ~expected) {
              fail("slot " + std::to_string(s) + " token " + std::to_string(t) + " piece " +
                   std::to_string(piece) + " reads " + std::to_string(value) + "/" +
                   std::to_string(~inverse) + ", wrote " + std::to_string(expected));
            }
          });
    }
  }

  // -------------------------------------------------------------------------------------------
  // After every operation.

  void check_all() {
    const std::string problems = kt::check_invariants(world());
    if (!problems.empty()) fail("invariants:\n" + problems);
    const TierStats tier = governor_.stats(tier_);
    if (tier.used > tier.limit) fail("the tier uses more than its limit");
    const ArenaStats stats = arena_->stats();
    std::uint32_t active = 0, finished = 0, quarantined = 0;
    std::uint64_t committed = 0, live = 0, reclaimable = 0, active_committed = 0;
    for (SlotId s = 0; s < kSlots; ++s) {
      const ModelSlot& m = slots_[s];
      const std::string where = "slot " + std::to_string(s) + " (" + name(m.state) + ")";
      switch (m.state) {
        case State::kActive:
          ++active;
          live += m.tokens * plan_.bytes_per_token;
          active_committed += m.windows * window_bytes();
          if (m.windows < wpf(m.tokens)) {
            fail(where + ": " + std::to_string(m.windows) + " windows do not cover " +
                 std::to_string(m.tokens) + " live tokens");
          }
          break;
        case State::kFinished:
          ++finished;
          reclaimable += m.windows * window_bytes();
          break;
        case State::kQuarantined:
          ++quarantined;
          break;
        case State::kFree:
          break;
      }
      if (m.state != State::kQuarantined) {
        committed += m.windows * window_bytes();
        if (arena_->tokens(s) != m.tokens) {
          fail(where + ": the arena says " + std::to_string(arena_->tokens(s)) + " tokens, the " +
               "model " + std::to_string(m.tokens));
        }
      }
      if (arena_->slot_base(s) != arena_->reservation().base() + s * plan_.slot_stride) {
        fail(where + ": its base moved");
      }
    }
    if (stats.active_slots != active || stats.finished_slots != finished ||
        stats.quarantined_slots != quarantined) {
      fail("stats count " + std::to_string(stats.active_slots) + " active, " +
           std::to_string(stats.finished_slots) + " finished, " +
           std::to_string(stats.quarantined_slots) + " quarantined slots; the model " +
           std::to_string(active) + ", " + std::to_string(finished) + ", " +
           std::to_string(quarantined));
    }
    if (stats.live_bytes != live) fail("stats live bytes " + std::to_string(stats.live_bytes));
    if (quarantined == 0) {
      const double waste =
          live == 0 ? 0.0
                    : static_cast<double>(active_committed - live) / static_cast<double>(live);
      if (std::abs(stats.waste_ratio - waste) > 1e-9 * (1 + waste)) {
        fail("waste ratio " + std::to_string(stats.waste_ratio) + ", the model " +
             std::to_string(waste));
      }
    }
    if (quarantined == 0) {
      const std::uint64_t mapped = arena_->reservation().mapped_bytes();
      if (stats.committed_bytes != mapped || committed != mapped) {
        fail("committed bytes " + std::to_string(stats.committed_bytes) + " (model " +
             std::to_string(committed) + ") differ from the reservation's mapped bytes " +
             std::to_string(mapped));
      }
      if (stats.reclaimable_bytes != reclaimable) {
        fail("reclaimable bytes " + std::to_string(stats.reclaimable_bytes) + ", the model " +
             std::to_string(reclaimable));
      }
    }
    if (stats.admissions != expected_.admissions ||
        stats.reused_admissions != expected_.reused_admissions ||
        stats.ensures != expected_.ensures ||
        stats.ensures_committing != expected_.ensures_committing ||
        stats.refusals != expected_.refusals) {
      fail("counters: admissions " + std::to_string(stats.admissions) + "/" +
           std::to_string(expected_.admissions) + ", reused " +
           std::to_string(stats.reused_admissions) + "/" +
           std::to_string(expected_.reused_admissions) + ", ensures " +
           std::to_string(stats.ensures) + "/" + std::to_string(expected_.ensures) +
           ", committing " + std::to_string(stats.ensures_committing) + "/" +
           std::to_string(expected_.ensures_committing) + ", refusals " +
           std::to_string(stats.refusals) + "/" + std::to_string(expected_.refusals) +
           " (arena/model)");
    }
    // New live tokens are written once the checks above said their windows are mapped
    // read-write; then every live token is read back.
    for (const auto& [slot, from, to] : writes_) {
      if (slots_[slot].state == State::kActive) write_tokens(slot, from, to);
    }
    writes_.clear();
    check_content();
  }

  const std::uint64_t seed_;
  const std::uint32_t ahead_;
  ShrinkBudget& budget_;
  std::string context_;
  // The world. Declaration order matters: the guard before the arena, the arena before the
  // pool, the pool before the governor, the fault driver before the host driver.
  std::unique_ptr<Driver> real_;
  std::unique_ptr<FaultDriver> fault_;
  Governor governor_;
  TierId tier_ = 0;
  std::unique_ptr<HandlePool> pool_;
  std::unique_ptr<Arena> arena_;
  std::optional<Arena::CaptureGuard> guard_;
  int capture_ops_left_ = 0;
  std::size_t leaked_mappings_ = 0;
  std::size_t leaked_reservations_ = 0;
  std::vector<std::pair<Address, std::size_t>> leaked_ranges_;

  LayoutPlan plan_;
  std::size_t g_ = 0;
  std::uint64_t fragments_ = 0;
  std::uint64_t max_windows_ = 0;  // per fragment
  std::uint64_t per_window_ = 0;   // tokens per window of one fragment

  std::vector<ModelSlot> slots_;
  std::uint64_t tick_ = 0;
  ArenaStats expected_;  // the counters only

  // Set by the operation, consumed in apply().
  Leeway leeway_;
  std::optional<std::size_t> failed_target_;
  bool failed_said_poisoned_ = false;
  std::function<void()> post_;
  std::vector<Write> writes_;

  std::size_t index_ = 0;
  std::deque<std::string> trace_;
};

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

// ---------------------------------------------------------------------------------------------
// Plain tests: the threads of the Concurrency section of DESIGN.md at once (for ThreadSanitizer),
// and one test per arena bug the model found, each lining its case up deterministically.

// A driver that passes every call through to another, except that an unmap can be held at a
// gate (to line a race up deterministically) and made to fail.
class GateDriver final : public Driver {
 public:
  explicit GateDriver(Driver& inner) : inner_(inner) {}

  // The next unmap waits until open(); from now on, while `fail` holds, every unmap fails
  // without reaching the inner driver.
  void hold_next_unmap(bool fail) {
    std::lock_guard lock(mutex_);
    hold_ = true;
    fail_ = fail;
  }
  void wait_until_held() {
    std::unique_lock lock(mutex_);
    changed_.wait(lock, [&] { return held_; });
  }
  void open() {
    {
      std::lock_guard lock(mutex_);
      hold_ = false;
    }
    changed_.notify_all();
  }
  void stop_failing() {
    std::lock_guard lock(mutex_);
    fail_ = false;
  }
  // The addresses of the unmap calls made so far, in order.
  std::vector<Address> unmaps() const {
    std::lock_guard lock(mutex_);
    return unmaps_;
  }

  DriverInfo info() const override { return inner_.info(); }
  Granularity granularity() const override { return inner_.granularity(); }
  bool maps_handle_subranges() const override { return inner_.maps_handle_subranges(); }

 private:
  Result<Address> do_reserve(std::size_t bytes, std::size_t alignment) override {
    return inner_.reserve(bytes, alignment);
  }
  Status do_free(Address base, std::size_t bytes) override { return inner_.free(base, bytes); }
  Result<Handle> do_create(std::size_t bytes) override { return inner_.create(bytes); }
  Status do_release(Handle handle) override { return inner_.release(handle); }
  Status do_map(Address address, std::size_t bytes, Handle handle,
                std::size_t handle_offset) override {
    return inner_.map(address, bytes, handle, handle_offset);
  }
  Status do_set_access(Address address, std::size_t bytes, Access access) override {
    return inner_.set_access(address, bytes, access);
  }
  Status do_unmap(Address address, std::size_t bytes) override {
    bool fail = false;
    {
      std::unique_lock lock(mutex_);
      unmaps_.push_back(address);
      if (hold_ && !held_) {
        held_ = true;
        changed_.notify_all();
        changed_.wait(lock, [&] { return !hold_; });
      }
      fail = fail_;
    }
    if (fail) {
      return Status::DriverError("gate: unmap failed on purpose",
                                 DriverFailure{"unmap", "GATE", 0});
    }
    return inner_.unmap(address, bytes);
  }
  Status do_synchronize() override { return inner_.synchronize(); }
  Status do_write(Address address, const void* source, std::size_t bytes) override {
    return inner_.write(address, source, bytes);
  }
  Status do_read(void* destination, Address address, std::size_t bytes) override {
    return inner_.read(destination, address, bytes);
  }
  Result<Fence> do_record_fence(Stream stream) override { return inner_.record_fence(stream); }
  Result<bool> do_fence_done(Fence fence) override { return inner_.fence_done(fence); }
  Status do_destroy_fence(Fence fence) override { return inner_.destroy_fence(fence); }
  Status do_copy(Address destination, Address source, std::size_t bytes, Stream stream) override {
    return inner_.copy(destination, source, bytes, stream);
  }
  Status do_wait_fence(Fence fence) override { return inner_.wait_fence(fence); }

  Driver& inner_;
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::vector<Address> unmaps_;
  bool hold_ = false;
  bool held_ = false;
  bool fail_ = false;
};

// The host driver (page granule) under a gate and a fault driver, a governor tier, a pool and
// an arena of the small geometry.
struct Rig {
  struct Options {
    std::uint64_t tier_granules = 256;
    std::uint64_t pooled_granules = 8;
    Layout layout = Layout::kTokenMajor;
    std::uint64_t windows = 8;  // per fragment of a slot
    std::uint32_t slots = 2;
    std::uint32_t ahead = 0;
  };

  explicit Rig(const Options& options) {
    auto driver = make_host_driver();
    EXPECT_TRUE(driver.ok());
    real = std::move(driver).value();
    gate = std::make_unique<GateDriver>(*real);
    fault = std::make_unique<FaultDriver>(*gate);
    g = real->granule();
    tier = governor.add_tier("rig", options.tier_granules * g);
    pool = std::make_unique<HandlePool>(
        *fault, PoolOptions{.max_pooled_bytes = options.pooled_granules * g}, &governor, tier);
    auto probe = plan_layout(small_geometry(), options.layout, g, 1);
    EXPECT_TRUE(probe.ok());
    auto plan = plan_layout(small_geometry(), options.layout, g,
                            options.windows * g / probe->contiguous_bytes_per_token);
    EXPECT_TRUE(plan.ok());
    auto made = Arena::create(
        *pool, governor, ArenaOptions{*plan, options.slots, tier, options.ahead, milliseconds(0)});
    EXPECT_TRUE(made.ok()) << made.status().to_string();
    arena = std::move(made).value();
  }
  ~Rig() {
    arena.reset();
    pool.reset();
  }

  // Tokens that fill `windows` windows of every fragment.
  std::uint64_t tokens_for(std::uint64_t windows) const {
    return windows * g / arena->plan().contiguous_bytes_per_token;
  }
  // The windows mapped from the start of every fragment of the slot (the least of them).
  std::uint64_t mapped_windows(SlotId slot) const {
    const LayoutPlan& plan = arena->plan();
    const std::vector<Block> blocks = arena->reservation().blocks();
    std::uint64_t least = UINT64_MAX;
    for (std::uint64_t f = 0; f < plan.fragments; ++f) {
      const std::uint64_t start = slot * plan.slot_stride + f * plan.fragment_stride;
      std::uint64_t length = 0;
      for (const Block& block : blocks) {
        if (block.offset == start + length * g) length += block.bytes / g;
      }
      least = std::min(least, length);
    }
    return least;
  }
  std::uint64_t used() const { return governor.stats(tier).used; }
  kt::World world() const {
    return kt::World{fault.get(), real.get(),
                     pool.get(),  const_cast<Governor*>(&governor),
                     tier,        arena->reservations()};
  }

  std::unique_ptr<Driver> real;
  std::unique_ptr<GateDriver> gate;
  std::unique_ptr<FaultDriver> fault;
  std::size_t g = 0;
  Governor governor;
  TierId tier = 0;
  std::unique_ptr<HandlePool> pool;
  std::unique_ptr<Arena> arena;
};

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
