// Fault sweeps by position: the k-th driver call (of any kind, or of one kind) of an operation
// is made to fail, for k = 1, 2, ... until a run injects nothing (the operation made fewer
// calls), each on a freshly prepared world; the invariants are checked after every run.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "kvvm/base/status.h"
#include "kvvm/vmm/driver.h"
#include "kvvm/vmm/fault_driver.h"
#include "support/invariants.h"

namespace kvvm::testing {

// How the k-th failure of one family of positions is forced.
struct FaultArm {
  std::string name;  // names the position in failure messages: "call 3 of <name>"
  std::function<void(FaultDriver&, std::uint64_t k)> arm;
};
// The k-th driver call of any kind.
FaultArm any_call();
// One family per op: the k-th call of that op.
std::vector<FaultArm> calls_of(std::span<const DriverOp> ops);

struct FaultSweep {
  std::string name;  // printed with the count of forced positions
  std::vector<FaultArm> arms = {any_call()};
  // The current world's fault driver: a check may replace it (after a deliberate leak).
  std::function<FaultDriver&()> fault;
  // The world whose invariants are checked after every run.
  std::function<World()> world;
  // Prepares a fresh world, calls arm() right before the operation under test, runs it and
  // stores its status in `status` (void, so that it may ASSERT: a fatal failure ends the sweep).
  std::function<void(const std::function<void()>& arm, Status& status)> run;
  // The operation's own contract, after the plan is cleared and the invariants are checked;
  // tears the world down when the next run needs it gone. A fatal failure ends the sweep.
  std::function<void(const Status&)> check;
};

// Runs the sweep over every arm and prints "[ sweep ] <name>: forced N positions". Returns N,
// the runs that injected a fault (each arm visits one more position, the one that did not).
std::uint64_t sweep_faults(const FaultSweep& sweep);

}  // namespace kvvm::testing
