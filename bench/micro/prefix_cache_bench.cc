// Prefix-cache lookup cost per prompt token on the host, beside hashing the same tokens with
// SHA-256 in 16-token blocks chained through the parent digest (what vLLM recommends for
// multi-tenant deployments) and with the bare chained XXH3-128 kvvm uses. items_per_second
// is prompt tokens per second. And the cost of one eviction victim at 1k, 10k and 100k
// cached windows: a full cache reclaims on every admission, so it must not grow with the
// cache. docs/PERFORMANCE.md has the figures and the commands.
#include <benchmark/benchmark.h>

#include <memory>
#include <vector>

#include "kvvm/kv/arena.h"
#include "kvvm/kv/arena_stack.h"
#include "kvvm/kv/prefix/prefix_cache.h"
#include "kvvm/model/kv_config.h"
#include "kvvm/vmm/host_driver.h"

#if defined(KVVM_HAS_OPENSSL)
#include <openssl/evp.h>
#endif

namespace kvvm {
namespace {

std::vector<TokenId> make_prompt(std::size_t tokens) {
  std::vector<TokenId> ids(tokens);
  std::uint64_t x = 0x9e3779b97f4a7c15ull;
  for (TokenId& id : ids) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    id = static_cast<TokenId>(x % 128000);
  }
  return ids;
}

// llama-3-8b geometry on a 2 MiB host granule: a window is 16 tokens, as vLLM's block.
struct CacheRig {
  std::unique_ptr<Driver> driver;
  std::unique_ptr<ArenaStack> stack;
  std::unique_ptr<PrefixCache> cache;

  Status make(std::size_t tokens) {
    auto made = make_host_driver({.granule = 2u << 20, .populate = false});
    if (!made.ok()) return made.status();
    driver = std::move(made).value();
    auto config = model::builtin_model_config("llama-3-8b");
    if (!config.ok()) return config.status();
    auto plan = plan_layout(model::kv_geometry(*config, DType::kFp16), Layout::kTokenMajor,
                            driver->granule(), tokens + 16);
    if (!plan.ok()) return plan.status();
    auto created = ArenaStack::create(
        *driver, ArenaStackOptions{.tier_name = "bench",
                                   .budget_bytes = 64ull << 30,
                                   .arena = ArenaOptions{.plan = *plan, .max_slots = 4}});
    if (!created.ok()) return created.status();
    stack = std::move(created).value();
    PrefixCacheOptions options;
    options.model_identity = "llama-3-8b";
    auto cached = PrefixCache::create(stack->arena(), stack->governor(), options);
    if (!cached.ok()) return cached.status();
    cache = std::move(cached).value();
    return Status::Ok();
  }
};

// A lookup of a prompt whose every whole window is cached: keys, table probes, id checks.
void BM_PrefixCacheLookup(benchmark::State& state) {
  const auto tokens = static_cast<std::size_t>(state.range(0));
  CacheRig rig;
  if (Status made = rig.make(tokens); !made.ok())
    return state.SkipWithError(made.message().c_str());
  const std::vector<TokenId> prompt = make_prompt(tokens);
  auto admitted = rig.cache->admit(prompt, 1);
  if (!admitted.ok()) return state.SkipWithError(admitted.status().message().c_str());
  if (Status w = rig.cache->written(admitted->slot, tokens); !w.ok()) {
    return state.SkipWithError(w.message().c_str());
  }
  std::uint64_t hit = 0;
  for (auto _ : state) {
    hit = rig.cache->lookup(prompt, 1);
    benchmark::DoNotOptimize(hit);
  }
  state.counters["hit_tokens"] = static_cast<double>(hit);
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * tokens));
}
BENCHMARK(BM_PrefixCacheLookup)->Arg(1024)->Arg(8192);

// The chained XXH3-128 alone, per 16-token window.
void BM_Xxh3ChainHash(benchmark::State& state) {
  const auto tokens = static_cast<std::size_t>(state.range(0));
  const std::vector<TokenId> prompt = make_prompt(tokens);
  for (auto _ : state) {
    CacheKey key{};
    for (std::size_t at = 0; at + 16 <= tokens; at += 16) {
      key = xxh3_chain_hash(key, std::span<const TokenId>(prompt.data() + at, 16));
    }
    benchmark::DoNotOptimize(key);
  }
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * tokens));
}
BENCHMARK(BM_Xxh3ChainHash)->Arg(1024)->Arg(8192);

// A cache of `windows` unpinned windows in chains of 64 (one 1,024-token prompt each), on a
// one-layer, one-head, 64-wide fp16 geometry over 4 KiB host pages: 16 tokens per window, no
// byte populated, so 100k windows cost no memory. Every slot is reclaimed afterwards, so the
// handles are held by the cache alone and each victim gives its window back.
struct EvictionRig {
  static constexpr std::size_t kChainWindows = 64;
  static constexpr std::size_t kWindowTokens = 16;
  std::unique_ptr<Driver> driver;
  std::unique_ptr<ArenaStack> stack;
  std::unique_ptr<PrefixCache> cache;

  Status make(std::size_t windows) {
    auto made = make_host_driver({.granule = 4096, .populate = false});
    if (!made.ok()) return made.status();
    driver = std::move(made).value();
    const Geometry geometry{.name = "one-head", .layers = 1, .kv_heads = 1, .head_dim = 64};
    const std::size_t tokens = kChainWindows * kWindowTokens;
    auto plan = plan_layout(geometry, Layout::kTokenMajor, driver->granule(), tokens + 16);
    if (!plan.ok()) return plan.status();
    auto created = ArenaStack::create(
        *driver, ArenaStackOptions{.tier_name = "bench",
                                   .budget_bytes = 64ull << 30,
                                   .arena = ArenaOptions{.plan = *plan, .max_slots = 4}});
    if (!created.ok()) return created.status();
    stack = std::move(created).value();
    PrefixCacheOptions options;
    options.model_identity = "one-head";
    auto cached = PrefixCache::create(stack->arena(), stack->governor(), options);
    if (!cached.ok()) return cached.status();
    cache = std::move(cached).value();
    std::vector<TokenId> prompt(tokens + 1);
    for (std::size_t chain = 0; chain * kChainWindows < windows; ++chain) {
      for (std::size_t t = 0; t < prompt.size(); ++t) {
        prompt[t] = static_cast<TokenId>(chain * prompt.size() + t);
      }
      auto admitted = cache->admit(prompt, 1);
      if (!admitted.ok()) return admitted.status();
      if (Status w = cache->written(admitted->slot, tokens); !w.ok()) return w;
      if (Status r = cache->release(admitted->slot); !r.ok()) return r;
    }
    (void)stack->arena().reclaim(~std::uint64_t{0});
    return Status::Ok();
  }
};

// One victim per iteration (the least recently used leaf: its window unheld, its handle given
// back to the driver); 500 victims at every size, so the smallest cache keeps half.
void BM_PrefixCacheEvictVictim(benchmark::State& state) {
  const auto windows = static_cast<std::size_t>(state.range(0));
  EvictionRig rig;
  if (Status made = rig.make(windows); !made.ok()) {
    return state.SkipWithError(made.message().c_str());
  }
  const std::uint64_t window =
      rig.stack->arena().plan().fragments * rig.stack->arena().plan().granule;
  const std::uint64_t before = rig.cache->stats().entries;
  for (auto _ : state) {
    std::uint64_t given = rig.cache->evict(window);
    benchmark::DoNotOptimize(given);
  }
  const std::uint64_t evicted = before - rig.cache->stats().entries;
  if (evicted != static_cast<std::uint64_t>(state.iterations())) {
    return state.SkipWithError("a victim per call was not evicted");
  }
  state.counters["cached_windows"] = static_cast<double>(before);
  state.SetItemsProcessed(static_cast<std::int64_t>(evicted));
}
BENCHMARK(BM_PrefixCacheEvictVictim)
    ->Arg(1000)
    ->Arg(10000)
    ->Arg(100000)
    ->Iterations(500)
    ->Unit(benchmark::kMicrosecond);

#if defined(KVVM_HAS_OPENSSL)
// SHA-256 over (parent digest, 16 token ids) per block, as vLLM's sha256 block hashing.
void BM_Sha256ChainHash(benchmark::State& state) {
  const auto tokens = static_cast<std::size_t>(state.range(0));
  const std::vector<TokenId> prompt = make_prompt(tokens);
  EVP_MD_CTX* context = EVP_MD_CTX_new();
  unsigned char digest[32] = {};
  for (auto _ : state) {
    for (std::size_t at = 0; at + 16 <= tokens; at += 16) {
      unsigned int length = 0;
      EVP_DigestInit_ex(context, EVP_sha256(), nullptr);
      EVP_DigestUpdate(context, digest, sizeof digest);
      EVP_DigestUpdate(context, prompt.data() + at, 16 * sizeof(TokenId));
      EVP_DigestFinal_ex(context, digest, &length);
    }
    benchmark::DoNotOptimize(digest);
  }
  EVP_MD_CTX_free(context);
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * tokens));
}
BENCHMARK(BM_Sha256ChainHash)->Arg(1024)->Arg(8192);
#endif

}  // namespace
}  // namespace kvvm
