// A typed-test fixture for arena tests: one backend's driver behind a fault-injecting one, a
// governor with one tier, a handle pool and an arena, destroyed in the right order; plus
// token-pattern writers and checkers that go through the KvView.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "kvvm/kv/arena.h"
#include "kvvm/vmm/fault_driver.h"
#include "support/backends.h"
#include "support/invariants.h"
#include "support/pattern.h"

namespace kvvm::testing {

// A small geometry whose token is 1 KiB (2 layers, 2 KV heads, head dim 64, fp16), so
// windows hold G / 1 KiB tokens in token-major and fragments are many in head-major.
inline Geometry small_geometry() { return Geometry{"test-small", 2, 2, 64, DType::kFp16}; }

template <typename Backend>
class ArenaFixture : public ::testing::Test {
 protected:
  void SetUp() override {
    KVVM_MAKE_DRIVER_OR_SKIP(Backend, real_);
    fault_ = std::make_unique<FaultDriver>(*real_);
    g_ = real_->granule();
    make_budget(4096, 64);
  }
  // A fresh governor with a tier of `granules` and a pool keeping up to `pooled` granules.
  void make_budget(std::size_t granules, std::size_t pooled) {
    arena_.reset();
    pool_.reset();
    governor_ = std::make_unique<Governor>();
    tier_ = governor_->add_tier("arena", granules * g_);
    pool_ = std::make_unique<HandlePool>(*fault_, PoolOptions{.max_pooled_bytes = pooled * g_},
                                         governor_.get(), tier_);
  }
  void TearDown() override {
    arena_.reset();
    pool_.reset();
  }

  // Tokens that fill `windows` windows of one fragment in this layout.
  std::uint64_t tokens_for_windows(const LayoutPlan& plan, std::uint64_t windows) const {
    return windows * g_ / plan.contiguous_bytes_per_token;
  }

  Arena& make_arena(Layout layout, std::uint32_t slots, std::uint64_t context_windows,
                    std::uint32_t ahead = 0) {
    const Geometry geometry = small_geometry();
    const std::uint64_t contiguous =
        layout == Layout::kTokenMajor ? geometry.bytes_per_token()
        : layout == Layout::kSeqMajor
            ? geometry.bytes_per_token() / (2 * geometry.layers)
            : geometry.bytes_per_token() / (2 * geometry.layers * geometry.kv_heads);
    auto plan = plan_layout(geometry, layout, g_, context_windows * g_ / contiguous);
    EXPECT_TRUE(plan.ok()) << plan.status().to_string();
    auto arena = Arena::create(
        *pool_, *governor_, ArenaOptions{*plan, slots, tier_, ahead, std::chrono::milliseconds(0)});
    EXPECT_TRUE(arena.ok()) << arena.status().to_string();
    arena_ = std::move(arena).value();
    return *arena_;
  }

  World world() const {
    World w{fault_.get(), real_.get(), pool_.get(), governor_.get(), tier_, {}};
    if (arena_) w.reservations = arena_->reservations();
    return w;
  }

  // Writes a token- and position-dependent pattern for every (layer, kv, head) of the tokens
  // [from, to) through the KvView, and checks it reads back.
  // The tokens of [from, to) worth writing: the first and last two of every window of the
  // token-major layout, and every 61st (checking all of them at a 2 MiB granule is slow).
  std::vector<std::uint64_t> sample(const Arena& arena, std::uint64_t from, std::uint64_t to) {
    const std::uint64_t per_window =
        std::max<std::uint64_t>(1, g_ / arena.plan().geometry.bytes_per_token());
    std::vector<std::uint64_t> tokens;
    for (std::uint64_t t = from; t < to; ++t) {
      const std::uint64_t in_window = t % per_window;
      if (in_window < 2 || in_window + 2 >= per_window || t % 61 == 0) tokens.push_back(t);
    }
    return tokens;
  }

  void write_tokens(const Arena& arena, SlotId slot, std::uint64_t from, std::uint64_t to,
                    std::uint64_t seed) {
    const KvView view = arena.view();
    const Geometry& geometry = arena.plan().geometry;
    const std::size_t bytes = geometry.head_dim * geometry.element_bytes();
    for (std::uint64_t t : sample(arena, from, to)) {
      for (std::uint32_t l = 0; l < geometry.layers; ++l) {
        for (std::uint32_t kv = 0; kv < 2; ++kv) {
          for (std::uint32_t h = 0; h < geometry.kv_heads; ++h) {
            const auto data = pattern(bytes, seed ^ (t << 20) ^ (l << 12) ^ (kv << 8) ^ h);
            Status written = fault_->write(view.address(slot, l, kv, h, t), data.data(), bytes);
            ASSERT_TRUE(written.ok()) << written.to_string();
          }
        }
      }
    }
  }
  void expect_tokens(const Arena& arena, SlotId slot, std::uint64_t from, std::uint64_t to,
                     std::uint64_t seed) {
    const KvView view = arena.view();
    const Geometry& geometry = arena.plan().geometry;
    const std::size_t bytes = geometry.head_dim * geometry.element_bytes();
    std::vector<std::uint8_t> seen(bytes);
    for (std::uint64_t t : sample(arena, from, to)) {
      for (std::uint32_t l = 0; l < geometry.layers; ++l) {
        for (std::uint32_t kv = 0; kv < 2; ++kv) {
          for (std::uint32_t h = 0; h < geometry.kv_heads; ++h) {
            const auto data = pattern(bytes, seed ^ (t << 20) ^ (l << 12) ^ (kv << 8) ^ h);
            ASSERT_TRUE(fault_->read(seen.data(), view.address(slot, l, kv, h, t), bytes).ok());
            ASSERT_EQ(seen, data) << "token " << t << " layer " << l << " kv " << kv << " head "
                                  << h;
          }
        }
      }
    }
  }

  // A fresh driver after a run that leaked memory on purpose (a poisoned mapping stays mapped
  // and its handle charged), so the next run's driver-side counts compare again. The old
  // drivers are kept alive: their leaked mappings may still be read.
  void replace_driver() {
    arena_.reset();
    pool_.reset();
    retired_real_.push_back(std::move(real_));
    retired_fault_.push_back(std::move(fault_));
    real_ = make_driver_or_null<Backend>();
    ASSERT_NE(real_, nullptr);
    fault_ = std::make_unique<FaultDriver>(*real_);
  }

  // Declared first: destroyed last, after the fault drivers wrapping them.
  std::vector<std::unique_ptr<Driver>> retired_real_;
  std::vector<std::unique_ptr<FaultDriver>> retired_fault_;
  std::unique_ptr<Driver> real_;
  std::unique_ptr<FaultDriver> fault_;
  std::size_t g_ = 0;
  std::unique_ptr<Governor> governor_;
  TierId tier_ = 0;
  std::unique_ptr<HandlePool> pool_;
  std::unique_ptr<Arena> arena_;
};
}  // namespace kvvm::testing
