// Property test of the prefix cache on the host backend: random token streams built from a few
// shared stems with random lengths and suffixes, two tenants, random releases, extensions and
// evictions under a tight budget. Every sequence writes the KV a model would (a function of the
// token id and position only) for the tokens the cache did not supply, and must read back, for
// every token, exactly what a private computation would have written.
#include <gtest/gtest.h>
#include <rapidcheck.h>
#include <rapidcheck/gtest.h>

#include <map>
#include <memory>

#include "kvvm/kv/arena.h"
#include "kvvm/kv/prefix/prefix_cache.h"
#include "kvvm/vmm/host_driver.h"
#include "support/invariants.h"
#include "support/pattern.h"

namespace kvvm {
namespace {

constexpr std::size_t kHeadBytes = 128;  // head dim 64, fp16

std::vector<std::uint8_t> expected_bytes(TokenId id, std::uint64_t t, std::uint32_t l,
                                         std::uint32_t kv, std::uint32_t h) {
  return testing::pattern(kHeadBytes, testing::mix(id ^ (t << 24)) ^ (l << 12) ^ (kv << 8) ^ h);
}

struct Live {
  SlotId slot = 0;
  std::vector<TokenId> ids;
  std::uint64_t written = 0;
};

RC_GTEST_PROP(PrefixCachePropertyTest, EverySequenceReadsWhatAPrivateComputationWrites, ()) {
  auto made = make_host_driver();
  RC_ASSERT(made.ok());
  std::unique_ptr<Driver> driver = std::move(made).value();
  const std::uint64_t g = driver->granule();
  Governor governor;
  const std::uint64_t budget_windows = *rc::gen::inRange<std::uint64_t>(24, 80);
  const TierId tier = governor.add_tier("cache", budget_windows * g);
  auto pool = std::make_unique<HandlePool>(*driver, PoolOptions{.max_pooled_bytes = 4 * g},
                                           &governor, tier);
  const Geometry geometry{"prop", 2, 2, 64, DType::kFp16};  // 1 KiB per token
  const std::uint64_t per_window = g / geometry.bytes_per_token();
  auto plan = plan_layout(geometry, Layout::kTokenMajor, g, 16 * per_window);
  RC_ASSERT(plan.ok());
  auto arena = Arena::create(*pool, governor, ArenaOptions{*plan, 12, tier});
  RC_ASSERT(arena.ok());
  PrefixCacheOptions options;
  options.model_identity = "prop";
  auto cache = PrefixCache::create(**arena, governor, options);
  RC_ASSERT(cache.ok());
  const KvView view = (*arena)->view();

  const auto stems = *rc::gen::container<std::vector<std::vector<TokenId>>>(
      3,
      rc::gen::container<std::vector<TokenId>>(12 * per_window, rc::gen::inRange<TokenId>(0, 8)));
  const auto write = [&](const Live& live, std::uint64_t from, std::uint64_t to) {
    for (std::uint64_t t = from; t < to; ++t) {
      for (std::uint32_t l = 0; l < 2; ++l) {
        for (std::uint32_t kv = 0; kv < 2; ++kv) {
          for (std::uint32_t h = 0; h < 2; ++h) {
            const auto data = expected_bytes(live.ids[t], t, l, kv, h);
            RC_ASSERT(
                driver->write(view.address(live.slot, l, kv, h, t), data.data(), data.size()).ok());
          }
        }
      }
    }
  };
  const auto check = [&](const Live& live) {
    std::vector<std::uint8_t> seen(kHeadBytes);
    for (std::uint64_t t = 0; t < live.written; ++t) {
      for (std::uint32_t l = 0; l < 2; ++l) {
        for (std::uint32_t kv = 0; kv < 2; ++kv) {
          for (std::uint32_t h = 0; h < 2; ++h) {
            RC_ASSERT(
                driver->read(seen.data(), view.address(live.slot, l, kv, h, t), kHeadBytes).ok());
            RC_ASSERT(seen == expected_bytes(live.ids[t], t, l, kv, h));
          }
        }
      }
    }
  };

  std::map<SlotId, Live> live;
  std::uint64_t hits = 0;
  const int steps = *rc::gen::inRange(20, 60);
  for (int step = 0; step < steps; ++step) {
    const int op = *rc::gen::inRange(0, 10);
    if (op < 5) {  // a new request: a stem's prefix, then a random suffix
      const auto& stem = stems[*rc::gen::inRange<std::size_t>(0, stems.size())];
      const std::uint64_t shared = *rc::gen::inRange<std::uint64_t>(0, stem.size());
      auto suffix = *rc::gen::container<std::vector<TokenId>>(
          *rc::gen::inRange<std::size_t>(1, 2 * per_window), rc::gen::inRange<TokenId>(0, 8));
      Live next;
      next.ids.assign(stem.begin(), stem.begin() + static_cast<std::ptrdiff_t>(shared));
      next.ids.insert(next.ids.end(), suffix.begin(), suffix.end());
      auto admitted = (*cache)->admit(next.ids, *rc::gen::inRange<std::uint64_t>(0, 2));
      if (!admitted.ok()) {
        const StatusCode code = admitted.status().code();
        RC_ASSERT(code == StatusCode::kResourceExhausted || code == StatusCode::kUnavailable);
        continue;
      }
      RC_ASSERT(admitted->cached_tokens < next.ids.size());  // the last token is computed
      hits += admitted->cached_tokens;
      next.slot = admitted->slot;
      write(next, admitted->cached_tokens, next.ids.size());
      next.written = next.ids.size();
      RC_ASSERT((*cache)->written(next.slot, next.written).ok());
      check(next);
      live[next.slot] = next;
    } else if (op < 7 && !live.empty()) {  // one finishes
      auto it = std::next(live.begin(), *rc::gen::inRange<std::size_t>(0, live.size()));
      check(it->second);
      RC_ASSERT((*cache)->release(it->first).ok());
      live.erase(it);
    } else if (op < 9 && !live.empty()) {  // one generates a few tokens
      Live& sequence =
          std::next(live.begin(), *rc::gen::inRange<std::size_t>(0, live.size()))->second;
      const auto more = *rc::gen::container<std::vector<TokenId>>(
          *rc::gen::inRange<std::size_t>(1, per_window + 2), rc::gen::inRange<TokenId>(0, 8));
      if (sequence.written + more.size() > plan->max_context) continue;
      if (!(*arena)->ensure(sequence.slot, sequence.written + more.size()).ok()) continue;
      RC_ASSERT((*cache)->extend(sequence.slot, more).ok());
      sequence.ids.insert(sequence.ids.end(), more.begin(), more.end());
      write(sequence, sequence.written, sequence.ids.size());
      sequence.written = sequence.ids.size();
      RC_ASSERT((*cache)->written(sequence.slot, sequence.written).ok());
      check(sequence);
    } else {
      (void)(*cache)->evict(*rc::gen::inRange<std::uint64_t>(1, 8) * g);
    }
    for (const auto& [slot, sequence] : live) check(sequence);
  }
  RC_TAG(hits > 0 ? "some hits" : "no hits");
  const PrefixCacheStats stats = (*cache)->stats();
  RC_ASSERT(stats.hits == hits);
  testing::World world{driver.get(), driver.get(), pool.get(),
                       &governor,    tier,         (*arena)->reservations()};
  RC_ASSERT(testing::check_invariants(world) == "");
  for (const auto& [slot, sequence] : live) RC_ASSERT((*cache)->release(slot).ok());
  cache->reset();
  arena->reset();
  world.reservations.clear();
  RC_ASSERT(testing::check_invariants(world) == "");
}

}  // namespace
}  // namespace kvvm
