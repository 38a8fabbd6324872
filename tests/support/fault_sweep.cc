#include "support/fault_sweep.h"

#include <gtest/gtest.h>

#include <iostream>

namespace kvvm::testing {

FaultArm any_call() {
  return {"any kind", [](FaultDriver& fault, std::uint64_t k) { fault.fail_nth_call(k); }};
}

std::vector<FaultArm> calls_of(std::span<const DriverOp> ops) {
  std::vector<FaultArm> arms;
  for (DriverOp op : ops) {
    arms.push_back({std::string(to_string(op)),
                    [op](FaultDriver& fault, std::uint64_t k) { fault.fail_nth(op, k); }});
  }
  return arms;
}

std::uint64_t sweep_faults(const FaultSweep& sweep) {
  std::uint64_t forced = 0;
  for (const FaultArm& arm : sweep.arms) {
    for (std::uint64_t k = 1;; ++k) {
      FaultDriver* armed = nullptr;
      std::uint64_t injected = 0;
      Status status = Status::Ok();
      sweep.run(
          [&] {
            armed = &sweep.fault();
            injected = armed->injected();
            arm.arm(*armed, k);
          },
          status);
      if (armed != nullptr) armed->clear();
      if (::testing::Test::HasFatalFailure()) return forced;
      if (armed == nullptr) {
        ADD_FAILURE() << sweep.name << ": the run never armed call " << k << " of " << arm.name;
        return forced;
      }
      const bool hit = armed->injected() > injected;
      SCOPED_TRACE(sweep.name + ": call " + std::to_string(k) + " of " + arm.name +
                   (hit ? " failed -> " : " never came -> ") + status.to_string());
      EXPECT_EQ(check_invariants(sweep.world()), "");
      sweep.check(status);
      if (::testing::Test::HasFatalFailure()) return forced;
      if (!hit) break;
      ++forced;
    }
  }
  std::cout << "[ sweep ] " << sweep.name << ": forced " << forced << " positions\n";
  return forced;
}

}  // namespace kvvm::testing
