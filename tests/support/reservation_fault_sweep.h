// The runner of the Reservation fault sweeps (docs/ARCHITECTURE.md "Tests"): the world of one
// trial, the content patterns written into it, the state captured before and after an operation and
// the sweep itself.
//
// How a sweep works: the operation runs once without faults to count the N driver calls it
// makes; then, for each position i in 1..N, a FRESH world (its own driver, fault driver,
// governor and pool, so that the driver's cumulative call counts and tables describe this
// world only) is prepared identically, FaultDriver::fail_nth_call(i) is armed right before the
// operation, the operation runs, the plan is cleared and the outcome is checked. A single fault
// can never reach the "residual" branch (the undo path has to fail as well), so double-fault
// variants also fail the first unmap of the undo path.
//
// Content: every committed window gets a pattern at its first and last bytes right after its
// commit; after every operation the pattern is read back through every healthy, accessible
// block of every live reservation (a shared block reads its owner's pattern).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kvvm/governor/governor.h"
#include "kvvm/vmm/driver.h"
#include "kvvm/vmm/fault_driver.h"
#include "kvvm/vmm/handle_pool.h"
#include "kvvm/vmm/host_driver.h"
#include "kvvm/vmm/reservation.h"
#include "support/backends.h"
#include "support/invariants.h"
#include "support/pattern.h"

namespace kvvm::testing::reservation_sweep {

namespace kt = ::kvvm::testing;
using kt::mix;  // splitmix64

inline constexpr std::uint64_t kTierGranules = 256;
inline constexpr std::size_t kPatternBytes = 64;
inline constexpr std::size_t kNoPoolBound = 256ull << 20;  // the pool keeps every returned handle

// ---------------------------------------------------------------------------------------------
// The world of one trial.

struct Rig {
  // Declaration order is destruction order reversed: reservations go first, then the pool
  // (which deregisters its reclaimer), the governor, the fault driver, the real driver.
  std::unique_ptr<Driver> real;
  std::unique_ptr<FaultDriver> fault;
  Governor governor;
  TierId tier = 0;
  std::unique_ptr<HandlePool> pool;
  std::vector<std::unique_ptr<Reservation>> reservations;  // null once torn down
  // Expected pattern seed of each window: (reservation index, window offset) -> seed.
  std::map<std::pair<std::size_t, std::size_t>, std::uint64_t> seeds;
  std::uint64_t fills = 0;
  std::size_t leaked_mappings = 0;
  std::size_t leaked_reservations = 0;
  std::size_t g = 0;  // the granule

  Reservation& at(std::size_t r) { return *reservations.at(r); }

  kt::World world() {
    kt::World world;
    world.driver = fault.get();
    world.real_driver = real.get();
    world.pool = pool.get();
    world.governor = &governor;
    world.tier = tier;
    for (const auto& reservation : reservations) {
      if (reservation) world.reservations.push_back(reservation.get());
    }
    world.leaked_mappings = leaked_mappings;
    world.leaked_reservations = leaked_reservations;
    return world;
  }
};

template <typename B>
std::unique_ptr<Rig> make_rig(std::uint64_t max_pooled_bytes) {
  auto rig = std::make_unique<Rig>();
  rig->real = kt::make_driver_or_null<B>();
  if (!rig->real) return nullptr;
  rig->fault = std::make_unique<FaultDriver>(*rig->real);
  rig->g = rig->real->granule();
  rig->tier = rig->governor.add_tier("sweep", kTierGranules * rig->g);
  rig->pool = std::make_unique<HandlePool>(
      *rig->fault, PoolOptions{.max_pooled_bytes = max_pooled_bytes}, &rig->governor, rig->tier);
  return rig;
}

void add_reservation(Rig& rig, std::size_t granules);

// Prepares a grant for the whole range and commits [first, first + count) granules of
// reservation `r` read-write in handles of `handle_granules` granules.
Status commit_granules(Rig& rig, std::size_t r, std::size_t first, std::size_t count,
                       std::size_t handle_granules = 1);

// ---------------------------------------------------------------------------------------------
// Content patterns.

std::vector<unsigned char> pattern(std::uint64_t seed);

// Writes a fresh pattern at the first and last bytes of each window of
// [first, first + count) granules of reservation `r` (which must be mapped read-write).
void fill(Rig& rig, std::size_t r, std::size_t first, std::size_t count);

// The windows [to_first, to_first + count) of reservation `to` show the same bytes as the
// windows from `from_first` of reservation `from` (a shared mapping).
void share_seeds(Rig& rig, std::size_t from, std::size_t from_first, std::size_t to,
                 std::size_t to_first, std::size_t count);

// Reads every window of every healthy, accessible block of every live reservation back and
// compares it with the pattern written there; returns the differences.
std::string verify_content(Rig& rig);

// ---------------------------------------------------------------------------------------------
// State before and after an operation.

std::string show(const Block& b);

std::string show(const std::vector<Block>& blocks);

// The blocks lying inside / outside [offset, offset + len).
std::vector<Block> inside(const std::vector<Block>& blocks, std::size_t offset, std::size_t len);
std::vector<Block> outside(const std::vector<Block>& blocks, std::size_t offset, std::size_t len);

std::uint64_t bytes_of(const std::vector<Block>& blocks);

struct State {
  std::vector<std::vector<Block>> blocks;  // by reservation index; empty once torn down
  std::vector<std::uint64_t> residual;
  PoolSnapshot pool;
  TierStats tier;
  HostDriverTables tables;  // host backends only
  TeardownStats teardown;
};

State capture(const Rig& rig);

DriverCallCounts minus(const DriverCallCounts& after, const DriverCallCounts& before);

bool mentions(const Status& status, std::string_view word);

std::string range_text(std::size_t offset, std::size_t len);

// ---------------------------------------------------------------------------------------------
// The sweep runner.

struct Trial {
  std::uint64_t position = 0;   // 0: the clean run
  std::uint64_t positions = 0;  // N, known after the clean run
  Status status;                // what the operation returned
  State before;                 // captured right before the operation
  DriverCallCounts calls;       // fault-driver calls the operation made (with failures)
  std::uint64_t injected = 0;

  std::string where() const {
    return position == 0 ? std::string("clean run")
                         : "fault at position " + std::to_string(position) + " of " +
                               std::to_string(positions);
  }
};

// What an operation did, as its check classified it.
enum class Outcome {
  kCompleted,  // returned OK with the complete result
  kRestored,   // failed and restored the exact prior state
  kResidual,   // failed and reported what stayed changed (poisoned, quarantined)
  kLeaked,     // teardown whose synchronization failed: deliberately leaked, counted
};

struct SweepResult {
  std::uint64_t positions = 0;
  std::map<Outcome, std::uint64_t> outcomes;  // over the faulted positions only
  std::uint64_t count(Outcome outcome) const {
    auto it = outcomes.find(outcome);
    return it == outcomes.end() ? 0 : it->second;
  }
};

struct Sweep {
  std::string name;
  std::uint64_t max_pooled_bytes = kNoPoolBound;
  std::function<void(Rig&)> setup;
  std::function<Status(Rig&)> op;
  // Checks the outcome (the fault plan is already cleared) and classifies it. May do more
  // to the world afterwards (retries).
  std::function<Outcome(Rig&, const Trial&)> check;
  // Arms the faults of position i (1-based); default: fail_nth_call(i).
  std::function<void(FaultDriver&, std::uint64_t)> arm;
  // The number of positions, from the clean run; default: the driver calls it made.
  std::function<std::uint64_t(const Trial&)> count_positions;
  // Faults each armed position must inject: exactly this many, or (0) at least one.
  std::uint64_t injections = 1;
};

template <typename B>
SweepResult run_sweep(const Sweep& sweep) {
  SweepResult result;
  std::uint64_t& positions = result.positions;
  for (std::uint64_t position = 0; position == 0 || position <= positions; ++position) {
    const std::string label =
        sweep.name + (position == 0 ? std::string(", clean run")
                                    : ", fault at position " + std::to_string(position));
    SCOPED_TRACE(label);
    std::unique_ptr<Rig> rig = make_rig<B>(sweep.max_pooled_bytes);
    if (!rig) {
      ADD_FAILURE() << label << ": the driver could not be made";
      return result;
    }
    sweep.setup(*rig);
    if (::testing::Test::HasFatalFailure()) return result;

    Trial trial;
    trial.position = position;
    trial.positions = positions;
    trial.before = capture(*rig);
    const DriverCallCounts calls_before = rig->fault->counts();
    const std::uint64_t injected_before = rig->fault->injected();
    if (position > 0) {
      if (sweep.arm) {
        sweep.arm(*rig->fault, position);
      } else {
        rig->fault->fail_nth_call(position);
      }
    }
    trial.status = sweep.op(*rig);
    rig->fault->clear();
    trial.calls = minus(rig->fault->counts(), calls_before);
    trial.injected = rig->fault->injected() - injected_before;

    if (position == 0) {
      EXPECT_TRUE(trial.status.ok()) << label << ": " << trial.status.to_string();
      EXPECT_EQ(trial.injected, 0u) << label;
      positions = sweep.count_positions ? sweep.count_positions(trial) : trial.calls.total();
      trial.positions = positions;
      if (positions == 0) break;
    } else if (sweep.injections > 0) {
      EXPECT_EQ(trial.injected, sweep.injections)
          << label << ": the armed fault(s) were not all injected";
    } else {
      EXPECT_GE(trial.injected, 1u) << label << ": the armed fault was never injected";
    }
    const Outcome outcome = sweep.check(*rig, trial);
    if (::testing::Test::HasFatalFailure()) return result;
    if (position == 0) {
      EXPECT_EQ(outcome, Outcome::kCompleted) << label;
    } else {
      ++result.outcomes[outcome];
    }
  }
  std::cout << "[ sweep ] " << sweep.name << ": forced " << positions << " positions ("
            << result.count(Outcome::kCompleted) << " completed, "
            << result.count(Outcome::kRestored) << " restored, " << result.count(Outcome::kResidual)
            << " residual, " << result.count(Outcome::kLeaked) << " leaked)\n";
  EXPECT_GT(positions, 0u) << sweep.name << ": the operation made no driver call";
  return result;
}

// Arms position i and also fails the first unmap after it (the undo path's).
void arm_with_failing_undo(FaultDriver& fault, std::uint64_t position);
// The typed suite's fixture, shared by the sweep files (gtest wants one fixture class per suite).

template <typename B>
class FaultSweepTest : public ::testing::Test {
 protected:
  // Skips the CUDA instantiation without a GPU. Each trial makes its own driver (see the top
  // of this file); this one only proves the backend is there.
  void SetUp() override { KVVM_MAKE_DRIVER_OR_SKIP(B, real_); }

  std::unique_ptr<Driver> real_;
};

}  // namespace kvvm::testing::reservation_sweep
