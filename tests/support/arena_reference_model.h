// The reference model of Arena that arena_reference_model_test.cc compares it against: it runs
// generated operations on the real arena, predicts each result and checks the state after every
// operation. What it predicts and checks is described at the top of arena_reference_model_test.cc.
#pragma once

#include <rapidcheck.h>
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

#include "kvvm/governor/governor.h"
#include "kvvm/kv/arena.h"
#include "kvvm/kv/layout.h"
#include "kvvm/vmm/driver.h"
#include "kvvm/vmm/fault_driver.h"
#include "kvvm/vmm/handle_pool.h"
#include "kvvm/vmm/host_driver.h"
#include "kvvm/vmm/reservation.h"
#include "support/arena_gate_rig.h"
#include "support/invariants.h"
#include "support/pattern.h"

namespace kvvm::testing::arena_model {

// Windows per fragment of a slot, by layout, so every layout has 12 to 16 windows per slot.
std::uint64_t windows_per_fragment_of(Layout layout);

inline constexpr std::uint32_t kSlots = 5;
inline constexpr std::uint64_t kTierPercent = 45;  // of every slot fully committed: often hit
inline constexpr std::uint64_t kPoolGranules = 3;  // handles returned above this are released
inline constexpr double kFaultFraction = 0.04;
inline constexpr std::array kFaultedOps = {DriverOp::kCreate,    DriverOp::kMap,
                                           DriverOp::kSetAccess, DriverOp::kUnmap,
                                           DriverOp::kRelease,   DriverOp::kFence};

struct OpSpec {
  int kind = 0;
  std::uint32_t a = 0, b = 0, c = 0;
  std::uint64_t fault_seed = 0;
};

std::ostream& operator<<(std::ostream& os, const OpSpec& op);

// A generated run, and the shrink search's state: whether the property failed, the runs since,
// and the shortest failing run so far.
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
Totals& totals();

// ---------------------------------------------------------------------------------------------
// The model.

enum class State { kFree, kActive, kFinished, kQuarantined };

const char* name(State state);

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

  void run(const std::vector<OpSpec>& ops);

 private:
  // -------------------------------------------------------------------------------------------
  // Plumbing.

  void arm(std::uint64_t seed, bool faults);

  // With commit-ahead, waits until the worker has nothing left to do. Faults stay armed while it
  // runs, so that its failure paths (stall, quarantine) are taken too. (Before 231aef5 two
  // sequences' leads could evict each other forever here: see
  // ArenaModelBugs.CommitAheadSettlesWhenTheBudgetHoldsOnlyOneSlotsLead.)
  void settle(std::uint64_t seed);

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

  void note(std::string what);

  void count(const std::string& outcome) { ++totals().outcomes[outcome]; }

  kt::World world() const;

  std::uint64_t wpf(std::uint64_t tokens) const { return plan_.windows_per_fragment(tokens); }
  std::uint64_t window_bytes() const { return fragments_ * g_; }  // one window in every fragment
  std::uint64_t ahead_target(const ModelSlot& m) const;
  std::size_t quarantined_count() const;

  // Driver calls that map, unmap or make memory: none may happen during a capture.
  std::uint64_t memory_calls() const;

  void expect_no_driver_call(std::uint64_t calls_before, const std::string& result);

  void expect_code(const Status& status, StatusCode code, const std::string& result);

  // Bytes a commit could get: what is free in the tier plus everything reclaimable (pooled
  // handles, finished slots, windows beyond live lengths), the target slot excepted (busy).
  std::uint64_t headroom(std::size_t target) const;

  // -------------------------------------------------------------------------------------------
  // Observation: what the reservation has mapped under each slot.

  struct Observed {
    std::array<bool, kSlots> poisoned{};
    std::vector<std::optional<std::uint64_t>> windows;  // nullopt: not one prefix per fragment
    std::vector<std::string> shape;                     // for messages
  };

  Observed observe() const;

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
  void reconcile(const Leeway& leeway);

  // -------------------------------------------------------------------------------------------
  // Operations.

  // Ends a capture span that is over; the worker resumes (and is let settle) before the
  // operation runs.
  void op_begin(std::uint64_t seed);

  // The mix: admit 18%, ensure 40%, finish 14%, reclaim 14%, capture 6%, decode step 8%.
  void apply(const OpSpec& op);

  std::uint64_t pick_tokens(std::uint32_t x, std::uint32_t y) const;

  std::optional<SlotId> predict_admit(std::uint64_t needed) const;

  // A failed commit of `request` bytes for `slot`: checks the code against the budget and the
  // faults, and lets the slot be quarantined.
  void commit_failed(const Status& status, std::size_t slot, std::uint64_t request, bool feasible,
                     bool faulted, const std::string& result);

  void admit(const OpSpec& op);

  void ensure(const OpSpec& op, bool decode_step);

  void finish(const OpSpec& op);

  void reclaim(const OpSpec& op);

  // -------------------------------------------------------------------------------------------
  // Content: two 8-byte tags per (layer, K/V, head) of a sampled token, at both ends of the
  // head's bytes, salted with the slot's generation.

  struct Write {
    SlotId slot;
    std::uint64_t from, to;
  };

  bool sampled(std::uint64_t token) const;

  std::uint64_t tag(SlotId slot, std::uint64_t generation, std::uint64_t token,
                    std::uint64_t piece) const;

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
  void write_tokens(SlotId slot, std::uint64_t from, std::uint64_t to);

  void check_content();

  // -------------------------------------------------------------------------------------------
  // After every operation.

  void check_all();

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

}  // namespace kvvm::testing::arena_model
