// Helpers shared by the governor tests: a bounded wait for a condition and a ledger check.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <thread>

#include "kvvm/governor/governor.h"

namespace kvvm::testing {

inline constexpr std::uint64_t kMiB = 1024 * 1024;
// Long enough that a correct implementation never times out, yet a broken one fails
// instead of hanging the suite.
inline constexpr std::chrono::milliseconds kLongWait = std::chrono::minutes(1);

// Spins until `pred` holds; false if it never does (a hang turned into a failure).
inline bool eventually(const std::function<bool()>& pred) {
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (!pred()) {
    if (std::chrono::steady_clock::now() > give_up) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

inline void expect_ledger(const Governor& g, TierId tier, std::uint64_t used,
                          std::uint64_t reserved) {
  const TierStats s = g.stats(tier);
  EXPECT_EQ(s.used, used);
  EXPECT_EQ(s.reserved, reserved);
}

}  // namespace kvvm::testing
