// The reference model of Reservation that reservation_model_test.cc compares it against: it runs
// generated operations on the real reservations, predicts each result and checks the state after
// every operation. What it predicts and checks is described at the top of
// reservation_model_test.cc.
#pragma once

#include <rapidcheck.h>
#include <sys/mman.h>

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

namespace kvvm::testing::reservation_model {

namespace kt = ::kvvm::testing;

inline constexpr std::size_t kMaxReservations = 3;
inline constexpr std::size_t kMinGranules = 8;
inline constexpr std::size_t kMaxGranules = 32;
inline constexpr std::uint64_t kTierGranules = 24;  // well below 3 x 32: the limit is often hit
inline constexpr std::uint64_t kPoolGranules = 3;   // handles returned above this are released
inline constexpr double kFaultFraction = 0.05;
inline constexpr std::array kFaultedOps = {DriverOp::kMap, DriverOp::kSetAccess, DriverOp::kUnmap,
                                           DriverOp::kCreate, DriverOp::kRelease};

// One generated operation: `kind` picks the operation, the other numbers are interpreted
// against the state it meets (which reservation, which range, which handle, which mode).
struct OpSpec {
  int kind = 0;
  std::uint32_t a = 0, b = 0, c = 0, d = 0, e = 0;
  std::uint64_t fault_seed = 0;
  bool operator==(const OpSpec&) const = default;
};

std::ostream& operator<<(std::ostream& os, const OpSpec& op);

// The shrink search's state: whether the property failed, the runs since, and the shortest
// failing run so far.
struct ShrinkBudget {
  bool failed = false;
  int runs = 0;
  std::uint64_t seed = 0;  // the shortest failing run so far
  std::vector<OpSpec> ops;
};
ShrinkBudget& shrink_budget();

// What the whole test did, printed once at the end of the run.
struct Totals {
  std::uint64_t runs = 0;
  std::uint64_t ops = 0;
  std::map<std::string, std::uint64_t> outcomes;  // "commit ok", "release refused", ...
};
Totals& totals();

// ---------------------------------------------------------------------------------------------
// The model.

struct ModelBlock {
  std::size_t bytes = 0;
  Handle handle = kNoHandle;
  std::size_t handle_offset = 0;
  Access access = Access::kNone;
  bool shared = false;
  bool poisoned = false;
};

bool same(const Block& actual, std::size_t offset, const ModelBlock& model);
std::string show(std::size_t offset, const ModelBlock& b);
std::string show(const Block& b);

struct ModelReservation {
  std::unique_ptr<Reservation> reservation;
  std::size_t granules = 0;
  std::map<std::size_t, ModelBlock> blocks;  // by offset
};

// What a range check against the model says.
enum class Coverage { kCovered, kPoisoned, kInvalid };

class ModelRun {
 public:
  explicit ModelRun(std::uint64_t seed);
  ModelRun(const ModelRun&) = delete;
  ModelRun& operator=(const ModelRun&) = delete;

  // The ranges deliberately leaked by failed teardowns stay mapped for good (nothing in kvvm
  // may touch them again). The test gives them back to the OS once the run is over, so that
  // later runs do not pay for them in every read of /proc/self/maps.
  ~ModelRun() {
    live_.clear();
    for (const auto& [base, size] : leaked_ranges_) ::munmap(reinterpret_cast<void*>(base), size);
  }

  void run(const std::vector<OpSpec>& ops);

 private:
  // -------------------------------------------------------------------------------------------
  // Plumbing.

  void arm_faults(const OpSpec& op);

  [[noreturn]] void fail(const std::string& why) {
    ShrinkBudget& budget = shrink_budget();
    budget.failed = true;
    budget.seed = seed_;
    budget.ops = *ops_;
    std::ostringstream text;
    text << "operation #" << index_ << ": " << why << "\nlast operations:\n";
    for (const std::string& line : trace_) text << "  " << line << "\n";
    RC_FAIL(text.str());
  }

  void note(std::string what);

  void count(const std::string& outcome) { ++totals().outcomes[outcome]; }

  kt::World world();

  struct Snapshot {
    PoolSnapshot pool;
    TierStats tier;
    std::uint64_t calls = 0;
  };
  Snapshot snapshot() const;

  // A refused call changed nothing: no driver call, the same pool, the same ledger.
  void expect_unchanged(const Snapshot& before, const std::string& what);

  static bool is_refusal(const Status& status);

  // -------------------------------------------------------------------------------------------
  // Predictions, from the contract and the model only.

  bool range_ok(const ModelReservation& m, std::size_t offset, std::size_t len) const;

  bool free_in_model(const ModelReservation& m, std::size_t offset, std::size_t len) const;

  Coverage coverage(const ModelReservation& m, std::size_t offset, std::size_t len) const;

  std::map<std::size_t, ModelBlock>::const_iterator block_at(const ModelReservation& m,
                                                             std::size_t offset) const;

  // A free run of windows starting at or after window `start` (wrapping): its first window
  // and its length in granules, or length 0 when every window is taken.
  std::pair<std::size_t, std::size_t> free_run(const ModelReservation& m, std::size_t start) const;

  // -------------------------------------------------------------------------------------------
  // Operations.

  // The mix: create 7%, destroy 3%, commit 35%, release 22%, map_shared 18%, set_access 15%.
  void apply(const OpSpec& op);

  void create(const OpSpec& op);

  void destroy(std::size_t r, bool fail_sync);

  static std::string show_ranges(const std::vector<Range>& ranges);

  // One commit() of a range, or (sometimes) one commit_ranges() of two.
  void commit(const OpSpec& op);

  // Adds the reservation's poisoned blocks inside `ranges` that the model does not know yet;
  // any other unknown block is a failure. Returns how many were added.
  std::size_t learn_residual(ModelReservation& m, const Reservation& reservation,
                             const std::vector<Range>& ranges, const std::string& result);

  // A range for release and set_access: mostly a run of whole adjacent blocks, sometimes an
  // arbitrary (often malformed) range.
  std::pair<std::size_t, std::size_t> pick_range(const ModelReservation& m, const OpSpec& op);

  void release(const OpSpec& op);

  void set_access(const OpSpec& op);

  void map_shared(const OpSpec& op);

  // -------------------------------------------------------------------------------------------
  // Content.

  // A write into memory that is not read-write faults: check the real mapping first, so a
  // bookkeeping bug fails the property instead of crashing the test.
  void check_writable(const Reservation& reservation, const Range& range,
                      const std::string& result);

  void write_tags(const Reservation& reservation, std::size_t offset, const Block& block);

  // -------------------------------------------------------------------------------------------
  // After every operation.

  void check_all();

  const std::uint64_t seed_;
  // The world. Declaration order matters: reservations (in live_) go before the pool, the
  // pool before the governor, the fault driver before the host driver.
  std::unique_ptr<Driver> real_;
  std::unique_ptr<FaultDriver> fault_;
  Governor governor_;
  TierId tier_ = 0;
  std::unique_ptr<HandlePool> pool_;
  bool fail_sync_ = false;  // read by every reservation's teardown synchronizer
  std::vector<ModelReservation> live_;
  std::size_t leaked_mappings_ = 0;
  std::size_t leaked_reservations_ = 0;
  std::vector<std::pair<Address, std::size_t>> leaked_ranges_;
  std::size_t g_ = 0;

  // The model beyond the blocks: each handle's tags by granule, its size, and the handles
  // known to be quarantined (a poisoned block mapped them).
  std::map<Handle, std::vector<std::uint64_t>> tags_;
  std::map<Handle, std::size_t> handle_bytes_;
  std::set<Handle> quarantined_;
  std::uint64_t next_tag_ = 0;

  const std::vector<OpSpec>* ops_ = nullptr;
  std::size_t index_ = 0;
  std::deque<std::string> trace_;
};

}  // namespace kvvm::testing::reservation_model
