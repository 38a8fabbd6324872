// A plain (non-typed) fixture for the arena's collaborators: the host driver behind a
// fault-injecting one, a governor with one tier and a handle pool charging it.
#pragma once

#include <gtest/gtest.h>

#include <memory>

#include "kvvm/governor/governor.h"
#include "kvvm/vmm/fault_driver.h"
#include "kvvm/vmm/handle_pool.h"
#include "kvvm/vmm/host_driver.h"

namespace kvvm::testing {

class VmmFixture : public ::testing::Test {
 protected:
  void SetUp() override {
    auto host = make_host_driver();
    ASSERT_TRUE(host.ok()) << host.status().to_string();
    host_ = std::move(host).value();
    fault_ = std::make_unique<FaultDriver>(*host_);
    g_ = fault_->granule();
    tier_ = governor_.add_tier("test", 64 * g_);
    pool_ = std::make_unique<HandlePool>(*fault_, PoolOptions{}, &governor_, tier_);
  }
  std::uint64_t used() const { return governor_.stats(tier_).used; }

  std::unique_ptr<Driver> host_;
  std::unique_ptr<FaultDriver> fault_;
  std::size_t g_ = 0;
  Governor governor_;
  TierId tier_ = 0;
  std::unique_ptr<HandlePool> pool_;
};

}  // namespace kvvm::testing
