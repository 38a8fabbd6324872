// KvManager, the engine's one KV seam: the same script of admissions, growth, publishing and
// releases is run through a manager and, on a second identical space, straight against the
// arena (caching off) or a PrefixCache over it (caching on). Slots, cached tokens and every
// statistic must match; the padding slot is counted in the space's slots; preallocation
// commits the whole context once and keeps it mapped for the next admission.
#include "kvvm/engine/kv_manager.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kvvm/engine/kv_space.h"
#include "kvvm/kv/prefix/prefix_cache.h"
#include "kvvm/model/config.h"
#include "support/test_data.h"

namespace kvvm::engine {
namespace {

// llama-tiny's token-major token is 2 KiB: a 16 KiB granule holds 8 tokens.
constexpr std::uint64_t kGranule = 16 << 10;
constexpr std::uint64_t kContext = 64;
constexpr char kIdentity[] = "llama-tiny";

model::ModelConfig tiny_config() {
  auto config = model::load_model_config(test::model_fixture_dir("llama-tiny"));
  EXPECT_TRUE(config.ok()) << config.status().to_string();
  return config.ok() ? *config : model::ModelConfig{};
}

KvSpaceOptions space_options() {
  KvSpaceOptions options;
  options.host_granule = kGranule;
  options.max_slots = 4;
  options.max_context = kContext;
  return options;
}

KvManagerOptions manager_options(bool caching, bool preallocate = false) {
  KvManagerOptions options;
  options.prefix_cache = caching;
  options.model_identity = kIdentity;
  options.preallocate = preallocate;
  return options;
}

std::unique_ptr<KvSpace> make_space(const KvSpaceOptions& options = space_options()) {
  auto space = KvSpace::create(tiny_config(), options);
  EXPECT_TRUE(space.ok()) << space.status().to_string();
  return space.ok() ? std::move(space).value() : nullptr;
}

std::vector<std::int32_t> ids(std::size_t n, std::int32_t first) {
  std::vector<std::int32_t> out(n);
  for (std::size_t i = 0; i < n; ++i) out[i] = first + static_cast<std::int32_t>(i * 7 % 97);
  return out;
}

// The operations the engine makes, implemented either way.
class Kv {
 public:
  virtual ~Kv() = default;
  virtual Result<KvAdmission> admit(const std::vector<std::int32_t>& prompt,
                                    std::uint64_t salt) = 0;
  virtual Status ensure(SlotId slot, std::uint64_t tokens) = 0;
  virtual Status extend(SlotId slot, const std::vector<std::int32_t>& more) = 0;
  virtual Status written(SlotId slot, std::uint64_t tokens) = 0;
  virtual Status release(SlotId slot) = 0;
  virtual KvManagerStats stats() = 0;
};

class ThroughManager : public Kv {
 public:
  explicit ThroughManager(KvManager& manager) : manager_(manager) {}
  Result<KvAdmission> admit(const std::vector<std::int32_t>& prompt, std::uint64_t salt) override {
    return manager_.admit(prompt, salt);
  }
  Status ensure(SlotId slot, std::uint64_t tokens) override {
    return manager_.ensure(slot, tokens);
  }
  Status extend(SlotId slot, const std::vector<std::int32_t>& more) override {
    return manager_.extend(slot, more);
  }
  Status written(SlotId slot, std::uint64_t tokens) override {
    return manager_.written(slot, tokens);
  }
  Status release(SlotId slot) override { return manager_.release(slot); }
  KvManagerStats stats() override { return manager_.stats(); }

 private:
  KvManager& manager_;
};

// What the engine did before the seam: the arena, or a prefix cache in front of it.
class Direct : public Kv {
 public:
  Direct(KvSpace& space, bool caching) : space_(space) {
    if (!caching) return;
    PrefixCacheOptions options;
    options.model_identity = kIdentity;
    auto cache = PrefixCache::create(space.arena(), space.governor(), options);
    EXPECT_TRUE(cache.ok()) << cache.status().to_string();
    if (cache.ok()) cache_ = std::move(cache).value();
  }
  Result<KvAdmission> admit(const std::vector<std::int32_t>& prompt, std::uint64_t salt) override {
    if (!cache_) {
      Result<SlotId> slot = space_.arena().admit(prompt.size());
      if (!slot.ok()) return slot.status();
      return KvAdmission{.slot = *slot, .cached_tokens = 0};
    }
    Result<CacheAdmission> a = cache_->admit(as_ids(prompt), salt);
    if (!a.ok()) return a.status();
    return KvAdmission{.slot = a->slot, .cached_tokens = a->cached_tokens};
  }
  Status ensure(SlotId slot, std::uint64_t tokens) override {
    return space_.arena().ensure(slot, tokens);
  }
  Status extend(SlotId slot, const std::vector<std::int32_t>& more) override {
    return cache_ ? cache_->extend(slot, as_ids(more)) : Status::Ok();
  }
  Status written(SlotId slot, std::uint64_t tokens) override {
    return cache_ ? cache_->written(slot, tokens) : Status::Ok();
  }
  // Ends keep the windows mapped for the next admission (finish, not release).
  Status release(SlotId slot) override {
    return cache_ ? cache_->finish(slot) : space_.arena().finish(slot);
  }
  KvManagerStats stats() override {
    KvManagerStats s;
    const TierStats tier = space_.governor().stats(space_.arena().tier());
    if (cache_) s.prefix = cache_->stats();
    s.arena = space_.arena().stats();
    // In use: what active sequences map, physically (finished slots' windows are reclaimable).
    s.usage = static_cast<double>(s.arena.physical_bytes -
                                  std::min(s.arena.physical_bytes, s.arena.reclaimable_bytes)) /
              static_cast<double>(tier.limit);
    return s;
  }

 private:
  static std::span<const TokenId> as_ids(const std::vector<std::int32_t>& v) {
    return {reinterpret_cast<const TokenId*>(v.data()), v.size()};
  }
  KvSpace& space_;
  std::unique_ptr<PrefixCache> cache_;
};

struct Trace {
  std::vector<KvAdmission> admissions;
  std::vector<KvManagerStats> stats;  // after each phase
};

// A prompt, its continuation published, the same prompt again (same tenant, then another),
// everything released, then the prompt with its continuation.
Trace run_script(Kv& kv) {
  Trace trace;
  const std::vector<std::int32_t> prompt = ids(20, 11);
  const std::vector<std::int32_t> generated = ids(6, 300);
  std::vector<std::int32_t> whole = prompt;
  whole.insert(whole.end(), generated.begin(), generated.end());
  const auto admit = [&](const std::vector<std::int32_t>& p, std::uint64_t salt) {
    Result<KvAdmission> a = kv.admit(p, salt);
    EXPECT_TRUE(a.ok()) << a.status().to_string();
    trace.admissions.push_back(a.ok() ? *a : KvAdmission{.slot = 999, .cached_tokens = 999});
    return a.ok() ? a->slot : SlotId{0};
  };
  const auto ok = [](const Status& s) { EXPECT_TRUE(s.ok()) << s.to_string(); };

  const SlotId first = admit(prompt, 1);
  ok(kv.ensure(first, prompt.size()));
  ok(kv.written(first, prompt.size()));
  ok(kv.extend(first, generated));
  ok(kv.ensure(first, whole.size()));
  ok(kv.written(first, whole.size()));
  trace.stats.push_back(kv.stats());

  const SlotId again = admit(prompt, 1);
  const SlotId other_tenant = admit(prompt, 2);
  trace.stats.push_back(kv.stats());

  ok(kv.release(first));
  ok(kv.release(again));
  ok(kv.release(other_tenant));
  trace.stats.push_back(kv.stats());

  const SlotId continued = admit(whole, 1);
  ok(kv.ensure(continued, whole.size() + 1));
  trace.stats.push_back(kv.stats());
  ok(kv.release(continued));
  trace.stats.push_back(kv.stats());
  return trace;
}

void expect_same(const KvManagerStats& got, const KvManagerStats& want, const std::string& where) {
  EXPECT_DOUBLE_EQ(got.usage, want.usage) << where;
  const PrefixCacheStats& p = got.prefix;
  const PrefixCacheStats& q = want.prefix;
  EXPECT_EQ(p.queries, q.queries) << where;
  EXPECT_EQ(p.hits, q.hits) << where;
  EXPECT_EQ(p.entries, q.entries) << where;
  EXPECT_EQ(p.cached_bytes, q.cached_bytes) << where;
  EXPECT_EQ(p.pinned_bytes, q.pinned_bytes) << where;
  EXPECT_EQ(p.published_windows, q.published_windows) << where;
  EXPECT_EQ(p.duplicate_windows, q.duplicate_windows) << where;
  EXPECT_EQ(p.evictions, q.evictions) << where;
  EXPECT_EQ(p.collisions, q.collisions) << where;
  const ArenaStats& a = got.arena;
  const ArenaStats& b = want.arena;
  EXPECT_EQ(a.committed_bytes, b.committed_bytes) << where;
  EXPECT_EQ(a.live_bytes, b.live_bytes) << where;
  EXPECT_EQ(a.reclaimable_bytes, b.reclaimable_bytes) << where;
  EXPECT_EQ(a.active_slots, b.active_slots) << where;
  EXPECT_EQ(a.finished_slots, b.finished_slots) << where;
  EXPECT_EQ(a.admissions, b.admissions) << where;
  EXPECT_EQ(a.reused_admissions, b.reused_admissions) << where;
  EXPECT_EQ(a.refusals, b.refusals) << where;
  EXPECT_EQ(a.ensures, b.ensures) << where;
  EXPECT_EQ(a.ensures_committing, b.ensures_committing) << where;
  EXPECT_EQ(a.physical_bytes, b.physical_bytes) << where;
  EXPECT_EQ(a.readonly_windows, b.readonly_windows) << where;
  EXPECT_EQ(a.cow_copies + a.cow_in_place, b.cow_copies + b.cow_in_place) << where;
}

TEST(KvManager, ScriptMatchesTheArenaAndTheCacheItStandsFor) {
  for (const bool caching : {true, false}) {
    const std::string where = caching ? "caching on" : "caching off";
    auto managed_space = make_space();
    auto direct_space = make_space();
    ASSERT_NE(managed_space, nullptr);
    ASSERT_NE(direct_space, nullptr);
    auto manager = KvManager::create(*managed_space, manager_options(caching));
    ASSERT_TRUE(manager.ok()) << manager.status().to_string();
    EXPECT_EQ((*manager)->caching(), caching) << where;
    ThroughManager through(**manager);
    Direct direct(*direct_space, caching);

    const Trace got = run_script(through);
    const Trace want = run_script(direct);
    ASSERT_EQ(got.admissions.size(), want.admissions.size());
    for (std::size_t i = 0; i < got.admissions.size(); ++i) {
      const std::string which = where + ", admission " + std::to_string(i);
      EXPECT_EQ(got.admissions[i].slot, want.admissions[i].slot) << which;
      EXPECT_EQ(got.admissions[i].cached_tokens, want.admissions[i].cached_tokens) << which;
    }
    ASSERT_EQ(got.stats.size(), want.stats.size());
    for (std::size_t i = 0; i < got.stats.size(); ++i) {
      expect_same(got.stats[i], want.stats[i], where + ", phase " + std::to_string(i));
    }

    // What the script is for: the same tenant shares whole windows, another tenant never does.
    // Admissions: first, again, other tenant, continued.
    ASSERT_EQ(got.admissions.size(), 4u);
    if (caching) {
      EXPECT_EQ(got.admissions[1].cached_tokens, 16u) << "two whole windows of the prompt";
      EXPECT_EQ(got.admissions[2].cached_tokens, 0u) << "another tenant";
      EXPECT_EQ(got.admissions[3].cached_tokens, 24u) << "the published continuation";
      EXPECT_GT(got.stats.back().prefix.published_windows, 0u);
      EXPECT_GT(got.stats.back().prefix.hits, 0u);
    } else {
      for (const KvAdmission& a : got.admissions) EXPECT_EQ(a.cached_tokens, 0u) << where;
      EXPECT_EQ(got.stats.back().prefix.queries, 0u) << where;
      EXPECT_EQ(got.stats.back().prefix.entries, 0u) << where;
    }
    EXPECT_EQ(got.stats.back().arena.active_slots, 0u) << where;
  }
}

TEST(KvManager, SequencesSizeTheSpaceWithThePaddingSlot) {
  KvSpaceOptions options = space_options();
  options.max_slots = 99;  // ignored once sequences is set
  options.sequences = 2;
  auto space = make_space(options);
  ASSERT_NE(space, nullptr);
  EXPECT_EQ(space->options().max_slots, 2 + kPadSlots);
  EXPECT_EQ(space->options().sequences, 2u);

  auto manager = KvManager::create(*space, manager_options(false));
  ASSERT_TRUE(manager.ok()) << manager.status().to_string();
  KvManager& kv = **manager;
  ASSERT_TRUE(kv.reserve_pad_slot().ok());
  ASSERT_TRUE(kv.pad_slot().has_value());
  EXPECT_EQ(kv.reserve_pad_slot().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(kv.stats().arena.active_slots, 1u);

  // The padding slot taken, exactly `sequences` sequences still fit.
  std::vector<SlotId> slots;
  for (int i = 0; i < 2; ++i) {
    Result<KvAdmission> a = kv.admit(ids(5, i), 0);
    ASSERT_TRUE(a.ok()) << a.status().to_string();
    EXPECT_NE(a->slot, *kv.pad_slot());
    slots.push_back(a->slot);
  }
  Result<KvAdmission> over = kv.admit(ids(5, 9), 0);
  EXPECT_EQ(over.status().code(), StatusCode::kUnavailable) << over.status().to_string();
  for (const SlotId slot : slots) EXPECT_TRUE(kv.release(slot).ok());
  kv.release_pad_slot();
  EXPECT_FALSE(kv.pad_slot().has_value());
  EXPECT_EQ(kv.stats().arena.active_slots, 0u);

  // Callers that give max_slots alone keep it.
  KvSpaceOptions plain = space_options();
  plain.max_slots = 5;
  auto sized = make_space(plain);
  ASSERT_NE(sized, nullptr);
  EXPECT_EQ(sized->options().max_slots, 5u);
}

TEST(KvManager, PreallocationCommitsTheContextOnceAndNeverGrows) {
  auto space = make_space();
  ASSERT_NE(space, nullptr);
  auto refused = KvManager::create(*space, manager_options(true, true));
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);

  auto manager = KvManager::create(*space, manager_options(false, true));
  ASSERT_TRUE(manager.ok()) << manager.status().to_string();
  KvManager& kv = **manager;
  Result<KvAdmission> a = kv.admit(ids(10, 1), 0);
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  EXPECT_EQ(a->cached_tokens, 0u);
  EXPECT_EQ(space->arena().tokens(a->slot), kContext);
  const std::uint64_t ensures = kv.stats().arena.ensures;
  EXPECT_TRUE(kv.ensure(a->slot, 12).ok());
  EXPECT_EQ(space->arena().tokens(a->slot), kContext) << "an ensure lowered the preallocation";
  EXPECT_EQ(kv.stats().arena.ensures, ensures);
  EXPECT_TRUE(kv.release(a->slot).ok());
  EXPECT_EQ(kv.stats().arena.active_slots, 0u);

  // Released, the slot keeps its windows (reclaimable, not in use): the next admission takes
  // them without a driver call, as a preallocating server reuses the cache it allocated once.
  const KvManagerStats released = kv.stats();
  EXPECT_EQ(released.arena.reclaimable_bytes, released.arena.physical_bytes);
  EXPECT_GT(released.arena.physical_bytes, 0u);
  EXPECT_EQ(released.usage, 0.0);
  const Driver& driver = space->arena().pool().driver();
  const DriverCallCounts before = driver.counts();
  Result<KvAdmission> b = kv.admit(ids(20, 3), 0);
  ASSERT_TRUE(b.ok()) << b.status().to_string();
  EXPECT_EQ(b->slot, a->slot);
  EXPECT_EQ(space->arena().tokens(b->slot), kContext);
  EXPECT_EQ(kv.stats().arena.reused_admissions, 1u);
  const DriverCallCounts after = driver.counts();
  for (DriverOp op : {DriverOp::kCreate, DriverOp::kMap, DriverOp::kSetAccess, DriverOp::kUnmap}) {
    EXPECT_EQ(after.of(op), before.of(op)) << to_string(op) << " calls on reuse";
  }
  EXPECT_TRUE(kv.release(b->slot).ok());
}

TEST(KvManager, RefusalsAreTheArenasAndHoldNothing) {
  KvSpaceOptions options = space_options();
  options.budget_bytes = 2 * kGranule;  // two windows: 16 tokens
  auto space = make_space(options);
  ASSERT_NE(space, nullptr);
  for (const bool caching : {true, false}) {
    auto manager = KvManager::create(*space, manager_options(caching));
    ASSERT_TRUE(manager.ok()) << manager.status().to_string();
    KvManager& kv = **manager;
    Result<KvAdmission> too_big = kv.admit(ids(40, 1), 0);
    EXPECT_EQ(too_big.status().code(), StatusCode::kResourceExhausted)
        << too_big.status().to_string();
    EXPECT_EQ(kv.stats().arena.active_slots, 0u);
    Result<KvAdmission> fits = kv.admit(ids(10, 1), 0);
    ASSERT_TRUE(fits.ok()) << fits.status().to_string();
    EXPECT_EQ(kv.ensure(fits->slot, 40).code(), StatusCode::kResourceExhausted);
    EXPECT_TRUE(kv.release(fits->slot).ok());
    EXPECT_EQ(kv.stats().arena.active_slots, 0u);
  }
}

}  // namespace
}  // namespace kvvm::engine
