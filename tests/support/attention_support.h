// Shared by the attention tests: an arena of a chosen geometry on any driver, a compact host
// mirror of the same layout (what the float64 reference reads), random data in the cache's
// element type (never zeros), and the error measure of METHOD.md.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kvvm/governor/governor.h"
#include "kvvm/kernels/attention.h"
#include "kvvm/kv/arena.h"
#include "kvvm/kv/layout.h"
#include "kvvm/vmm/handle_pool.h"

namespace kvvm::testing {

inline DType dtype_of(DType element) {
  return element == DType::kBf16 ? DType::kBf16 : DType::kFp16;
}

// Elements drawn uniformly from [-scale, scale] in the cache's element type; a zero draw is
// replaced so no element is zero.
inline std::vector<std::uint8_t> random_elements(DType element, std::size_t count,
                                                 std::mt19937_64& random, float scale = 1.0f) {
  std::vector<std::uint8_t> bytes(count * 2);
  std::uniform_real_distribution<float> draw(-scale, scale);
  for (std::size_t i = 0; i < count; ++i) {
    float value = draw(random);
    if (value == 0.0f) value = scale / 4;
    float_to_element(element, value, &bytes[i * 2]);
  }
  return bytes;
}

inline double to_double(DType element, const std::uint8_t* at) {
  return element_to_float(element, at);
}

// ||out - ref|| / ||ref|| over every element (out in the element type); NaN when any output is
// NaN or infinite, so a comparison against a tolerance fails.
inline double relative_error(DType element, const std::vector<std::uint8_t>& out,
                             const std::vector<double>& ref) {
  double diff = 0, norm = 0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    const double value = to_double(element, &out[i * 2]);
    if (!std::isfinite(value)) return NAN;
    diff += (value - ref[i]) * (value - ref[i]);
    norm += ref[i] * ref[i];
  }
  return std::sqrt(diff) / std::sqrt(norm);
}

// Elements of `out` that are NaN (outputs are poisoned with 0xff bytes, a NaN in fp16 and
// bf16, before every run: one left means it was never written).
inline std::size_t count_nan(DType element, const std::vector<std::uint8_t>& out) {
  std::size_t nans = 0;
  for (std::size_t i = 0; i + 1 < out.size(); i += 2) {
    if (std::isnan(to_double(element, &out[i]))) ++nans;
  }
  return nans;
}

inline double tolerance(DType element) { return element == DType::kBf16 ? 1e-2 : 5e-3; }

// A governor, pool and arena over `driver` (which must outlive it), commit-ahead as asked.
struct KvArena {
  Governor governor;
  TierId tier = 0;
  std::unique_ptr<HandlePool> pool;
  std::unique_ptr<Arena> arena;

  static std::unique_ptr<KvArena> make(Driver& driver, const Geometry& geometry, Layout layout,
                                       std::uint64_t max_context, std::uint32_t slots,
                                       std::uint32_t ahead = 0) {
    auto made = std::make_unique<KvArena>();
    auto plan = plan_layout(geometry, layout, driver.granule(), max_context);
    EXPECT_TRUE(plan.ok()) << plan.status().to_string();
    if (!plan.ok()) return nullptr;
    made->tier = made->governor.add_tier("kv", plan->slot_stride * slots + 8 * driver.granule());
    made->pool = std::make_unique<HandlePool>(driver, PoolOptions{.max_pooled_bytes = 0},
                                              &made->governor, made->tier);
    auto arena = Arena::create(*made->pool, made->governor,
                               ArenaOptions{*plan, slots, made->tier, ahead, {}});
    EXPECT_TRUE(arena.ok()) << arena.status().to_string();
    if (!arena.ok()) return nullptr;
    made->arena = std::move(arena).value();
    return made;
  }
};

// A host copy of the cache in the same layout, packed (16-byte granules, so its strides are
// the layout's and nothing more), which the float64 reference reads.
struct Mirror {
  LayoutPlan plan;
  std::vector<std::uint8_t> bytes;
  KvView view;

  Mirror(const Geometry& geometry, Layout layout, std::uint64_t max_context, std::uint32_t slots) {
    auto planned = plan_layout(geometry, layout, 16, max_context);
    if (!planned.ok()) throw std::runtime_error(planned.status().to_string());
    plan = *planned;
    bytes.assign(plan.slot_stride * slots, 0xff);  // NaN: a read of an unwritten byte shows
    view = plan.view(reinterpret_cast<std::uintptr_t>(bytes.data()));
  }
};

}  // namespace kvvm::testing
