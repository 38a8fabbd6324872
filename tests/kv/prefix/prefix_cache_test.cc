// The automatic prefix cache on every backend: hits map cached windows and charge only the
// remainder, verified ids (a forced collision never shares), salts, the switch, the
// last-token rule, eviction order, reset, metrics, and fault sweeps.
#include "kvvm/kv/prefix/prefix_cache.h"

#include <gtest/gtest.h>

#include <functional>
#include <numeric>
#include <optional>
#include <string>

#include "support/arena_fixture.h"
#include "support/fault_sweep.h"

namespace kvvm {
namespace {

template <typename Backend>
class PrefixCacheTest : public testing::ArenaFixture<Backend> {
 protected:
  std::uint64_t per_window() const { return this->tokens_for_windows(this->arena_->plan(), 1); }

  PrefixCache& make_cache(std::uint32_t slots, std::uint64_t context_windows,
                          PrefixCacheOptions options = {}) {
    cache_.reset();
    this->make_arena(Layout::kTokenMajor, slots, context_windows);
    if (options.model_identity.empty()) options.model_identity = "test-small";
    auto made = PrefixCache::create(*this->arena_, *this->governor_, std::move(options));
    EXPECT_TRUE(made.ok()) << made.status().to_string();
    cache_ = std::move(made).value();
    return *cache_;
  }
  void TearDown() override {
    cache_.reset();
    testing::ArenaFixture<Backend>::TearDown();
  }

  // A prompt of `tokens` ids; `stem` tokens from `common`, the rest from `seed`.
  static std::vector<TokenId> prompt(std::uint64_t tokens, std::uint64_t seed) {
    std::vector<TokenId> ids(tokens);
    for (std::uint64_t i = 0; i < tokens; ++i) {
      ids[i] = static_cast<TokenId>(testing::mix(seed * 1000003 + i) % 50000);
    }
    return ids;
  }

  // The KV bytes a model would write: a function of the token id and its position only.
  // Writes them for the sampled tokens of [from, to), or (check) reads and compares them.
  void visit_kv(SlotId slot, std::span<const TokenId> ids, std::uint64_t from, std::uint64_t to,
                bool check) {
    const KvView view = this->arena_->view();
    const Geometry& geometry = this->arena_->plan().geometry;
    const std::size_t bytes = geometry.head_dim * geometry.element_bytes();
    std::vector<std::uint8_t> seen(bytes);
    for (std::uint64_t t : this->sample(*this->arena_, from, to)) {
      for (std::uint32_t l = 0; l < geometry.layers; ++l) {
        for (std::uint32_t kv = 0; kv < 2; ++kv) {
          for (std::uint32_t h = 0; h < geometry.kv_heads; ++h) {
            const auto data = testing::pattern(
                bytes, testing::mix(ids[t] ^ (t << 24)) ^ (l << 12) ^ (kv << 8) ^ h);
            const Address at = view.address(slot, l, kv, h, t);
            if (!check) {
              Status written = this->fault_->write(at, data.data(), bytes);
              ASSERT_TRUE(written.ok()) << written.to_string();
              continue;
            }
            ASSERT_TRUE(this->fault_->read(seen.data(), at, bytes).ok());
            ASSERT_EQ(seen, data) << "token " << t << " layer " << l;
          }
        }
      }
    }
  }
  void write_kv(SlotId slot, std::span<const TokenId> ids, std::uint64_t from, std::uint64_t to) {
    visit_kv(slot, ids, from, to, false);
  }
  void expect_kv(SlotId slot, std::span<const TokenId> ids, std::uint64_t from, std::uint64_t to) {
    visit_kv(slot, ids, from, to, true);
  }
  // Admits `ids`, writes what is not cached, reports all written; returns the admission.
  CacheAdmission run_prompt(std::span<const TokenId> ids, std::uint64_t salt) {
    auto admitted = cache_->admit(ids, salt);
    EXPECT_TRUE(admitted.ok()) << admitted.status().to_string();
    if (!admitted.ok()) return {};
    write_kv(admitted->slot, ids, admitted->cached_tokens, ids.size());
    EXPECT_TRUE(cache_->written(admitted->slot, ids.size()).ok());
    expect_kv(admitted->slot, ids, 0, ids.size());
    return *admitted;
  }
  std::uint64_t used() const { return this->governor_->stats(this->tier_).used; }

  std::unique_ptr<PrefixCache> cache_;
};
TYPED_TEST_SUITE(PrefixCacheTest, testing::AllBackends, testing::BackendNames);

TYPED_TEST(PrefixCacheTest, AHitMapsTheCachedWindowsAndChargesOnlyTheRemainder) {
  this->make_budget(4096, 0);
  PrefixCache& cache = this->make_cache(8, 16);
  const std::uint64_t pw = this->per_window();
  const std::uint64_t g = this->arena_->plan().granule;
  const auto first = this->prompt(10 * pw, 1);
  const CacheAdmission a = this->run_prompt(first, 7);
  EXPECT_EQ(a.cached_tokens, 0u);
  EXPECT_EQ(cache.stats().published_windows, 10u);
  // The same system prompt and a different question.
  auto second = first;
  const auto question = this->prompt(2 * pw + 1, 2);
  second.insert(second.end(), question.begin(), question.end());
  const std::uint64_t before = this->used();
  const CacheAdmission b = this->run_prompt(second, 7);
  EXPECT_EQ(b.cached_tokens, 10 * pw);
  EXPECT_EQ(this->used() - before, 3 * g) << "windows 10..12 only";
  const PrefixCacheStats stats = cache.stats();
  EXPECT_EQ(stats.queries, first.size() + second.size());
  EXPECT_EQ(stats.hits, 10 * pw);
  EXPECT_EQ(stats.entries, 12u) << "10 shared, 2 more whole windows of the second prompt";
  EXPECT_EQ(stats.pinned_bytes, stats.cached_bytes);
  EXPECT_EQ(this->arena_->stats().shared_saved_bytes, 10 * g);
  // The first sequence goes: the second still pins every window. Once it goes too, every
  // entry stays cached, unpinned, and still hits.
  ASSERT_TRUE(cache.release(a.slot).ok());
  EXPECT_EQ(cache.stats().pinned_bytes, cache.stats().cached_bytes);
  ASSERT_TRUE(cache.release(b.slot).ok());
  EXPECT_EQ(cache.stats().pinned_bytes, 0u);
  EXPECT_EQ(cache.stats().cached_bytes, 12 * g);
  const CacheAdmission c = this->run_prompt(first, 7);
  EXPECT_EQ(c.cached_tokens, 9 * pw) << "the last token is always left to compute";
  EXPECT_EQ(testing::check_invariants(this->world()), "");
}

TYPED_TEST(PrefixCacheTest, SaltsIsolateAndTheSwitchTurnsSharingOff) {
  this->make_cache(8, 16);
  const auto ids = this->prompt(6 * this->per_window(), 3);
  this->run_prompt(ids, 1);
  EXPECT_EQ(this->run_prompt(ids, 2).cached_tokens, 0u) << "another tenant never shares";
  EXPECT_GT(this->run_prompt(ids, 1).cached_tokens, 0u);

  PrefixCacheOptions disabled;
  disabled.enabled = false;
  PrefixCache& off = this->make_cache(8, 16, disabled);
  this->run_prompt(ids, 1);
  EXPECT_EQ(this->run_prompt(ids, 1).cached_tokens, 0u);
  EXPECT_EQ(off.stats().published_windows, 0u);
  EXPECT_EQ(off.stats().hits, 0u);
  EXPECT_EQ(testing::check_invariants(this->world()), "");
}

TYPED_TEST(PrefixCacheTest, AForcedCollisionNeverSharesAnotherRequestsKv) {
  // Every window of every chain hashes to one key: only the stored ids tell them apart.
  PrefixCacheOptions weak;
  weak.hash = [](const CacheKey& parent, std::span<const TokenId>) {
    return CacheKey{parent.low, 1};
  };
  PrefixCache& cache = this->make_cache(8, 16, weak);
  const std::uint64_t pw = this->per_window();
  const auto a = this->prompt(4 * pw, 11);
  const auto b = this->prompt(4 * pw, 12);
  this->run_prompt(a, 0);
  const CacheAdmission other = this->run_prompt(b, 0);  // expect_kv inside checks its bytes
  EXPECT_EQ(other.cached_tokens, 0u);
  EXPECT_GT(cache.stats().collisions, 0u);
  EXPECT_EQ(testing::check_invariants(this->world()), "");
}

TYPED_TEST(PrefixCacheTest, EvictionTakesLeastRecentlyUsedLeavesFirstAndNeverPinnedOnes) {
  this->make_budget(4096, 0);
  PrefixCache& cache = this->make_cache(8, 16);
  const std::uint64_t pw = this->per_window();
  const std::uint64_t g = this->arena_->plan().granule;
  const auto old_ids = this->prompt(4 * pw, 21);
  const auto new_ids = this->prompt(4 * pw, 22);
  const auto live_ids = this->prompt(4 * pw, 23);
  ASSERT_TRUE(cache.release(this->run_prompt(old_ids, 0).slot).ok());
  ASSERT_TRUE(cache.release(this->run_prompt(new_ids, 0).slot).ok());
  const CacheAdmission live = this->run_prompt(live_ids, 0);
  ASSERT_EQ(cache.stats().entries, 12u);

  // One window's worth: the oldest chain's last window (a leaf) goes, nothing else.
  EXPECT_EQ(cache.evict(g), g);
  EXPECT_EQ(cache.stats().entries, 11u);
  auto probe_old = old_ids;
  probe_old.push_back(1);
  auto probe_new = new_ids;
  probe_new.push_back(1);
  EXPECT_EQ(this->run_prompt(probe_new, 0).cached_tokens, 4 * pw);
  EXPECT_EQ(this->run_prompt(probe_old, 0).cached_tokens, 3 * pw) << "its leaf went first";
  // Everything evictable goes; the live sequence's windows stay pinned.
  (void)cache.evict(~std::uint64_t{0});
  EXPECT_EQ(cache.stats().pinned_bytes, cache.stats().cached_bytes);
  EXPECT_GE(cache.stats().entries, 4u);
  auto probe_live = live_ids;
  probe_live.push_back(1);
  EXPECT_EQ(this->run_prompt(probe_live, 0).cached_tokens, 4 * pw);
  ASSERT_TRUE(cache.release(live.slot).ok());
  EXPECT_EQ(testing::check_invariants(this->world()), "");
}

// The order is by last use, not by when an entry became evictable: the chain used first goes
// first even when it was released last, and a parent becomes a leaf when its last child goes.
TYPED_TEST(PrefixCacheTest, EvictionFollowsLastUseNotReleaseOrder) {
  this->make_budget(4096, 0);
  PrefixCache& cache = this->make_cache(8, 16);
  const std::uint64_t pw = this->per_window();
  const std::uint64_t g = this->arena_->plan().granule;
  const auto first_ids = this->prompt(4 * pw, 51);
  const auto second_ids = this->prompt(4 * pw, 52);
  const CacheAdmission first = this->run_prompt(first_ids, 0);
  const CacheAdmission second = this->run_prompt(second_ids, 0);
  ASSERT_TRUE(cache.release(second.slot).ok());
  ASSERT_TRUE(cache.release(first.slot).ok());
  ASSERT_EQ(cache.stats().entries, 8u);
  ASSERT_EQ(cache.stats().pinned_bytes, 0u);

  // Two windows: the first chain's leaf, then its parent (older than every second-chain entry).
  EXPECT_EQ(cache.evict(2 * g), 2 * g);
  auto probe_first = first_ids;
  probe_first.push_back(1);
  auto probe_second = second_ids;
  probe_second.push_back(1);
  EXPECT_EQ(cache.lookup(probe_first, 0), 2 * pw);
  EXPECT_EQ(cache.lookup(probe_second, 0), 4 * pw);

  // A hit makes the first chain's remaining windows the newest: the second chain goes next.
  const CacheAdmission again = this->run_prompt(probe_first, 0);
  EXPECT_EQ(again.cached_tokens, 2 * pw);
  ASSERT_TRUE(cache.release(again.slot).ok());
  const std::uint64_t entries = cache.stats().entries;
  EXPECT_EQ(cache.evict(g), g);
  EXPECT_EQ(cache.stats().entries, entries - 1);
  EXPECT_EQ(cache.lookup(probe_second, 0), 3 * pw);
  EXPECT_EQ(cache.lookup(probe_first, 0), 4 * pw) << "republished by the hit, then kept";
  EXPECT_EQ(testing::check_invariants(this->world()), "");
}

TYPED_TEST(PrefixCacheTest, BudgetPressureEvictsBeforeAnAdmissionIsRefused) {
  this->make_budget(24, 0);  // 24 windows in all
  PrefixCache& cache = this->make_cache(8, 20);
  const std::uint64_t pw = this->per_window();
  // 16 windows cached and unreferenced.
  for (std::uint64_t seed : {31, 32}) {
    ASSERT_TRUE(cache.release(this->run_prompt(this->prompt(8 * pw, seed), 0).slot).ok());
  }
  (void)this->arena_->reclaim(~std::uint64_t{0});  // finished slots unmapped: bytes are held
  EXPECT_EQ(cache.stats().cached_bytes, 16 * this->arena_->plan().granule);
  // A 16-window request fits only if the cache gives memory back.
  auto big = cache.admit(this->prompt(16 * pw, 33), 0);
  ASSERT_TRUE(big.ok()) << big.status().to_string();
  EXPECT_GT(cache.stats().evictions, 0u);
  EXPECT_EQ(testing::check_invariants(this->world()), "");
}

TYPED_TEST(PrefixCacheTest, ResetDropsEveryUnreferencedEntry) {
  PrefixCache& cache = this->make_cache(8, 16);
  const std::uint64_t pw = this->per_window();
  ASSERT_TRUE(cache.release(this->run_prompt(this->prompt(4 * pw, 41), 0).slot).ok());
  const CacheAdmission live = this->run_prompt(this->prompt(3 * pw, 42), 0);
  EXPECT_EQ(cache.reset(), 4u);
  EXPECT_EQ(cache.stats().entries, 3u) << "pinned by the live sequence";
  ASSERT_TRUE(cache.release(live.slot).ok());
  EXPECT_EQ(cache.reset(), 3u);
  EXPECT_EQ(cache.stats().cached_bytes, 0u);
  EXPECT_EQ(testing::check_invariants(this->world()), "");
}

TYPED_TEST(PrefixCacheTest, BadInputIsRefused) {
  PrefixCache& cache = this->make_cache(4, 4);
  EXPECT_EQ(cache.admit({}, 0).status().code(), StatusCode::kInvalidArgument);
  const auto too_long = this->prompt(5 * this->per_window(), 1);
  EXPECT_EQ(cache.admit(too_long, 0).status().code(), StatusCode::kInvalidArgument);
  const auto ids = this->prompt(this->per_window(), 2);
  auto admitted = cache.admit(ids, 0);
  ASSERT_TRUE(admitted.ok());
  EXPECT_EQ(cache.written(admitted->slot, ids.size() + 1).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(cache.written(admitted->slot + 1, 1).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(cache.stats().published_windows, 0u);
}

// Every driver call of publish (sealing), lookup-and-map and eviction made to fail in turn.
TYPED_TEST(PrefixCacheTest, FaultSweepsKeepTheInvariants) {
  const DriverOp kinds[] = {DriverOp::kCreate, DriverOp::kMap, DriverOp::kSetAccess,
                            DriverOp::kUnmap, DriverOp::kRelease};
  for (const std::string phase : {"publish", "lookup", "evict"}) {
    std::vector<TokenId> ids, question;
    // The slot whose KV the operation must leave intact (none for eviction).
    std::optional<SlotId> intact;
    testing::FaultSweep sweep;
    sweep.name = "prefix cache " + phase;
    sweep.arms = testing::calls_of(kinds);
    sweep.fault = [this]() -> FaultDriver& { return *this->fault_; };
    sweep.world = [this] { return this->world(); };
    sweep.run = [&](const std::function<void()>& arm, Status& status) {
      this->make_budget(4096, 0);
      PrefixCache& cache = this->make_cache(8, 16);
      ids = this->prompt(4 * this->per_window(), 51);
      question = ids;
      question.push_back(7);
      intact.reset();
      if (phase == "publish") {
        auto admitted = cache.admit(ids, 0);
        ASSERT_TRUE(admitted.ok());
        this->write_kv(admitted->slot, ids, 0, ids.size());
        intact = admitted->slot;
        arm();
        status = cache.written(admitted->slot, ids.size());
        return;
      }
      const CacheAdmission first = this->run_prompt(ids, 0);
      if (phase == "evict") {
        ASSERT_TRUE(cache.release(first.slot).ok());
      } else {
        intact = first.slot;
      }
      arm();
      if (phase == "lookup") {
        status = cache.admit(question, 0).status();
      } else {
        (void)cache.evict(~std::uint64_t{0});
      }
    };
    sweep.check = [&](const Status&) {
      if (intact) this->expect_kv(*intact, ids, 0, ids.size());
      // Whatever failed, the cache still serves a correct prompt afterwards.
      if (this->pool_->snapshot().handles_quarantined == 0) {
        auto again = this->cache_->admit(question, 0);
        ASSERT_TRUE(again.ok()) << again.status().to_string();
        this->write_kv(again->slot, question, again->cached_tokens, question.size());
        this->expect_kv(again->slot, question, 0, question.size());
      }
      const bool leaked = this->pool_->snapshot().handles_quarantined > 0;
      this->cache_.reset();
      this->arena_.reset();
      if (leaked) this->replace_driver();
    };
    testing::sweep_faults(sweep);
  }
}

}  // namespace
}  // namespace kvvm
