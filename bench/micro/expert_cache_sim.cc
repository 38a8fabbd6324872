// The expert cache's policy under synthetic routing, on the CPU: no model runs and nothing is
// timed. For a published mixture's shape under a weight budget (the slots are the split's,
// `plan_weight_split` with the experts cached), steps of `batch` tokens each route every
// sparse layer's tokens to top_k distinct experts drawn from
//   uniform   every expert alike (what dummy weights give: a cache's worst case)
//   zipf-S    expert of rank r with weight 1 / r^S, the ranks a fixed shuffle per layer
//             (synthetic skew, standing in for a trained router's favourites)
// and acquires them from the ExpertCache (waves of at most its slots, as the CPU model does),
// beside an LRU cache of the same slots as the baseline. Printed: the hit rates, the expert
// bytes missed per token (misses x the expert's real bytes / tokens), and that over a bus of
// the rate given (default 55 GB/s, the H100/H200 machines' pinned host-to-device rate): the
// least time per token the misses cost. The first `warmup` steps are left out of every count.
//
// Usage: expert_cache_sim [model, default qwen3-30b-a3b] [budget GiB, default 16]
//                         [bus GB/s, default 55] [steps, default 400]
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <list>
#include <numeric>
#include <random>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "kvvm/model/config.h"
#include "kvvm/model/kv_config.h"
#include "kvvm/model/weight_memory.h"
#include "model/weights/expert_cache.h"

namespace {

using kvvm::Address;
using kvvm::Status;
using kvvm::model::detail::ExpertCache;
using kvvm::model::detail::ExpertCacheShape;

constexpr std::uint64_t kSimulatedBytes = 64;  // what the simulation copies per expert
constexpr std::uint64_t kGranule = std::uint64_t{2} << 20;

// LRU over (layer, expert): the baseline policy.
class Lru {
 public:
  explicit Lru(std::uint32_t slots) : slots_(slots) {}
  // Returns whether `key` was resident; makes it the most recent, evicting the least recent
  // when full.
  bool touch(std::uint64_t key) {
    auto it = where_.find(key);
    if (it != where_.end()) {
      order_.splice(order_.begin(), order_, it->second);
      return true;
    }
    if (where_.size() == slots_) {
      where_.erase(order_.back());
      order_.pop_back();
    }
    order_.push_front(key);
    where_[key] = order_.begin();
    return false;
  }

 private:
  std::uint32_t slots_;
  std::list<std::uint64_t> order_;
  std::unordered_map<std::uint64_t, std::list<std::uint64_t>::iterator> where_;
};

struct Result {
  double hit_rate = 0, lru_hit_rate = 0, missed_per_token = 0;
};

Result simulate(const kvvm::model::WeightSplit& split, std::uint32_t top_k, double zipf,
                std::uint32_t batch, std::uint32_t steps, std::uint32_t warmup) {
  const kvvm::model::WeightSizes& sizes = split.sizes;
  const std::uint32_t layers = sizes.sparse_layers, experts = sizes.experts;
  const std::uint32_t slots = split.expert_slots;
  std::vector<unsigned char> staging(std::uint64_t{layers} * experts * kSimulatedBytes);
  std::vector<unsigned char> device(std::uint64_t{slots} * kSimulatedBytes);
  ExpertCache cache(ExpertCacheShape{layers, experts, slots, kSimulatedBytes},
                    reinterpret_cast<Address>(device.data()), staging.data(),
                    [](Address to, const unsigned char* from, std::uint64_t bytes) {
                      std::memcpy(reinterpret_cast<unsigned char*>(to), from, bytes);
                      return Status::Ok();
                    });
  if (!cache.preload().ok()) std::abort();
  Lru lru(slots);
  for (std::uint32_t s = 0; s < slots; ++s)
    lru.touch(std::uint64_t{s % layers} * experts + s / layers);

  std::mt19937_64 random(1234);
  // Per layer: expert of rank r is ranks[l][r]; its weight 1 / (r + 1)^zipf.
  std::vector<std::vector<std::uint32_t>> ranks(layers, std::vector<std::uint32_t>(experts));
  for (auto& order : ranks) {
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), random);
  }
  std::vector<double> weight(experts);
  for (std::uint32_t r = 0; r < experts; ++r) weight[r] = 1.0 / std::pow(r + 1.0, zipf);
  std::discrete_distribution<std::uint32_t> pick(weight.begin(), weight.end());

  std::uint64_t lookups = 0, hits = 0, lru_lookups = 0, lru_hits = 0, misses = 0, tokens = 0;
  std::vector<std::uint32_t> rows(experts), ids, counts;
  std::vector<Address> at;
  for (std::uint32_t step = 0; step < steps; ++step) {
    const bool counted = step >= warmup;
    if (counted) tokens += batch;
    for (std::uint32_t l = 0; l < layers; ++l) {
      std::fill(rows.begin(), rows.end(), 0);
      for (std::uint32_t t = 0; t < batch; ++t) {
        std::vector<std::uint32_t> chosen;
        while (chosen.size() < top_k) {
          const std::uint32_t e = ranks[l][pick(random)];
          if (std::find(chosen.begin(), chosen.end(), e) == chosen.end()) chosen.push_back(e);
        }
        for (std::uint32_t e : chosen) ++rows[e];
      }
      ids.clear();
      counts.clear();
      for (std::uint32_t e = 0; e < experts; ++e) {
        if (rows[e] == 0) continue;
        ids.push_back(e);
        counts.push_back(rows[e]);
      }
      const kvvm::model::ExpertCacheStats before = cache.stats();
      for (std::size_t first = 0; first < ids.size(); first += slots) {
        const std::size_t n = std::min<std::size_t>(slots, ids.size() - first);
        at.resize(n);
        const Status status =
            cache.acquire(l, std::span<const std::uint32_t>(ids).subspan(first, n),
                          std::span<const std::uint32_t>(counts).subspan(first, n), at);
        if (!status.ok()) std::abort();
      }
      const kvvm::model::ExpertCacheStats after = cache.stats();
      std::uint64_t layer_lru_hits = 0;
      for (std::uint32_t e : ids) layer_lru_hits += lru.touch(std::uint64_t{l} * experts + e);
      if (!counted) continue;
      lookups += after.lookups - before.lookups;
      hits += after.hits - before.hits;
      misses += after.misses - before.misses;
      lru_lookups += ids.size();
      lru_hits += layer_lru_hits;
    }
  }
  Result out;
  out.hit_rate = lookups == 0 ? 0 : static_cast<double>(hits) / lookups;
  out.lru_hit_rate = lru_lookups == 0 ? 0 : static_cast<double>(lru_hits) / lru_lookups;
  out.missed_per_token =
      tokens == 0 ? 0
                  : static_cast<double>(misses) * sizes.expert_bytes / static_cast<double>(tokens);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string model = argc > 1 ? argv[1] : "qwen3-30b-a3b";
  const double budget_gib = argc > 2 ? std::atof(argv[2]) : 16.0;
  const double bus = argc > 3 ? std::atof(argv[3]) : 55.0;
  const auto steps = static_cast<std::uint32_t>(argc > 4 ? std::atoi(argv[4]) : 400);
  kvvm::Result<kvvm::model::ModelConfig> config = kvvm::model::builtin_model_config(model);
  if (!config.ok() || !config->moe.enabled()) {
    std::fprintf(stderr, "expert_cache_sim: %s is not a built-in mixture of experts\n",
                 model.c_str());
    return 2;
  }
  const kvvm::DType element =
      config->dtype == kvvm::DType::kFp16 ? kvvm::DType::kFp16 : kvvm::DType::kBf16;
  const kvvm::model::WeightSizes sizes = kvvm::model::weight_sizes(*config, element);
  const auto budget = static_cast<std::uint64_t>(budget_gib * (1ull << 30));
  auto split = kvvm::model::plan_weight_split(
      sizes, kGranule, budget, 0, kvvm::model::ExpertPlacement::kCache, config->moe.top_k);
  if (!split.ok()) {
    std::fprintf(stderr, "expert_cache_sim: %s\n", split.status().to_string().c_str());
    return 2;
  }
  if (!split->expert_cache()) {
    std::fprintf(stderr, "expert_cache_sim: %.1f GiB holds every expert of %s\n", budget_gib,
                 model.c_str());
    return 2;
  }
  std::printf("%s, %s\n", model.c_str(), split->describe().c_str());
  std::printf("synthetic routing, %u steps (the first %u left out), top %u of %u per layer\n",
              steps, steps / 4, config->moe.top_k, config->moe.experts);
  std::printf("%-9s %5s %9s %9s %14s %18s\n", "routing", "batch", "hit rate", "LRU hit",
              "missed/token", "bus ms/token");
  for (double zipf : {0.0, 0.8, 1.2}) {
    for (std::uint32_t batch : {1u, 8u, 64u}) {
      const Result r = simulate(*split, config->moe.top_k, zipf, batch, steps, steps / 4);
      char name[16];
      if (zipf == 0.0) {
        std::snprintf(name, sizeof name, "uniform");
      } else {
        std::snprintf(name, sizeof name, "zipf-%.1f", zipf);
      }
      std::printf("%-9s %5u %8.1f%% %8.1f%% %10.1f MiB %12.2f @%.0f\n", name, batch,
                  100 * r.hit_rate, 100 * r.lru_hit_rate, r.missed_per_token / (1 << 20),
                  r.missed_per_token / (bus * 1e9) * 1e3, bus);
    }
  }
  return 0;
}
