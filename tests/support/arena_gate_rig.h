// The arena under a gate driver for the deterministic arena tests: a driver that can hold an
// unmap at a gate (to line a race up) and make it fail, beneath a fault driver, a governor tier,
// a pool and an arena of a small geometry.
#pragma once

#include <gtest/gtest.h>

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
#include "support/arena_fixture.h"
#include "support/invariants.h"

namespace kvvm::testing::arena_model {

namespace kt = ::kvvm::testing;
using std::chrono::milliseconds;

// The 1 KiB-token geometry (2 layers, 2 KV heads, head dim 64, fp16): a page holds 4 tokens in
// token-major, 16 per fragment in seq-major and 32 per fragment in head-major.
using kt::small_geometry;

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

}  // namespace kvvm::testing::arena_model
