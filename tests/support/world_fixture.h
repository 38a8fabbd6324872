// A typed-test fixture holding one backend's driver, a governor with one tier, a handle pool
// and the reservations made on them, destroyed in the right order.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "kvvm/governor/governor.h"
#include "kvvm/vmm/handle_pool.h"
#include "kvvm/vmm/reservation.h"
#include "support/backends.h"
#include "support/invariants.h"

namespace kvvm::testing {

template <typename Backend>
class WorldTest : public ::testing::Test {
 protected:
  static constexpr std::size_t kTierGranules = 512;

  void SetUp() override {
    KVVM_MAKE_DRIVER_OR_SKIP(Backend, driver_);
    g_ = driver_->granule();
    tier_ = governor_.add_tier("test", kTierGranules * g_);
    pool_ = std::make_unique<HandlePool>(*driver_, PoolOptions{.max_pooled_bytes = 128 * g_},
                                         &governor_, tier_);
  }

  void TearDown() override {
    reservations_.clear();
    pool_.reset();
  }

  Reservation& reserve(std::size_t granules, ReservationOptions options = {}) {
    auto made = Reservation::create(*pool_, granules * g_, std::move(options));
    EXPECT_TRUE(made.ok()) << made.status().to_string();
    reservations_.push_back(std::move(made).value());
    return *reservations_.back();
  }

  Grant grant(std::size_t granules) {
    auto made = governor_.prepare(tier_, granules * g_);
    EXPECT_TRUE(made.ok()) << made.status().to_string();
    return std::move(made).value();
  }

  // Commits [first, first + count) granules with a fresh grant settled at what was charged.
  Status commit(Reservation& reservation, std::size_t first, std::size_t count,
                CommitOptions options = {}) {
    Grant paid = grant(count);
    Status status = reservation.commit(first * g_, count * g_, &paid, options);
    paid.commit_charged();
    return status;
  }

  World world() const {
    World w{
        driver_.get(), driver_.get(), pool_.get(), const_cast<Governor*>(&governor_), tier_, {}};
    for (const auto& reservation : reservations_) w.reservations.push_back(reservation.get());
    w.leaked_mappings = leaked_mappings_;
    w.leaked_reservations = leaked_reservations_;
    return w;
  }

  void expect_invariants() { EXPECT_EQ(check_invariants(world()), ""); }

  std::unique_ptr<Driver> driver_;
  std::size_t g_ = 0;
  Governor governor_;
  TierId tier_ = 0;
  std::unique_ptr<HandlePool> pool_;
  std::vector<std::unique_ptr<Reservation>> reservations_;
  std::size_t leaked_mappings_ = 0;
  std::size_t leaked_reservations_ = 0;
};

}  // namespace kvvm::testing
