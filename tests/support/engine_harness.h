// What the engine tests share: a fixture model on the CPU, a KV space for it, a collector of
// request events, and the check that an engine left nothing behind in the arena or the
// governor's ledger.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "kvvm/engine/engine.h"
#include "kvvm/engine/kv_space.h"
#include "kvvm/model/model.h"
#include "kvvm/model/safetensors.h"
#include "kvvm/model/weights.h"
#include "support/test_data.h"

namespace kvvm::engine::testing {

// A fixture checkpoint (tests/data/models/NAME), its expected.json and a CPU model of it.
struct LoadedModel {
  model::ModelConfig config;
  std::unique_ptr<model::WeightFiles> files;
  nlohmann::json expected;
  std::unique_ptr<model::Model> model;

  // Another CPU model of the same weights with `config` changed (eos ids, say).
  std::unique_ptr<model::Model> variant(const model::ModelConfig& changed) const {
    auto weights = model::bind_weights(changed, *files);
    EXPECT_TRUE(weights.ok()) << weights.status().to_string();
    model::CpuModelOptions options;
    options.threads = 2;
    auto made = model::make_cpu_model(changed, *weights, options);
    EXPECT_TRUE(made.ok()) << made.status().to_string();
    return made.ok() ? std::move(made).value() : nullptr;
  }
};

inline std::unique_ptr<LoadedModel> load_fixture(const std::string& name) {
  const std::string dir = test::model_fixture_dir(name);
  auto loaded = std::make_unique<LoadedModel>();
  auto config = model::load_model_config(dir);
  EXPECT_TRUE(config.ok()) << config.status().to_string();
  if (!config.ok()) return nullptr;
  loaded->config = *config;
  auto files = model::WeightFiles::open_dir(dir);
  EXPECT_TRUE(files.ok()) << files.status().to_string();
  if (!files.ok()) return nullptr;
  loaded->files = std::move(files).value();
  std::ifstream in(std::filesystem::path(dir) / "expected.json");
  loaded->expected = nlohmann::json::parse(in);
  loaded->model = loaded->variant(loaded->config);
  if (loaded->model == nullptr) return nullptr;
  return loaded;
}

// llama-tiny, loaded once for the whole binary (the tests run one at a time).
inline LoadedModel& llama() {
  static std::unique_ptr<LoadedModel> loaded = load_fixture("llama-tiny");
  EXPECT_NE(loaded, nullptr);
  return *loaded;
}

inline std::unique_ptr<KvSpace> make_kv(const model::ModelConfig& config, std::uint32_t slots,
                                        std::uint64_t context = 128, std::uint64_t budget = 0) {
  KvSpaceOptions options;
  options.max_slots = slots;
  options.max_context = context;
  options.budget_bytes = budget;
  // The host driver's page granule: the tiny models' windows hold a couple of tokens, so
  // sequences cross many windows and the prefix cache publishes short prefixes.
  options.host_granule = 0;
  auto kv = KvSpace::create(config, options);
  EXPECT_TRUE(kv.ok()) << kv.status().to_string();
  return kv.ok() ? std::move(kv).value() : nullptr;
}

// Every event of every request, by request id.
struct Outcome {
  std::vector<std::int32_t> tokens;
  std::string text;
  int events = 0;
  int finished_events = 0;
  RequestEnd end = RequestEnd::kLength;
  Status error;
  double retry_after_seconds = 0;
  RequestStats stats;
};

class Collector {
 public:
  RequestCallback callback() {
    return [this](const RequestEvent& event) {
      std::lock_guard lock(mutex_);
      Outcome& o = outcomes_[event.id];
      ++o.events;
      o.tokens.insert(o.tokens.end(), event.tokens.begin(), event.tokens.end());
      o.text += event.text;
      if (event.finished) {
        ++o.finished_events;
        o.end = event.end;
        o.error = event.error;
        o.retry_after_seconds = event.retry_after_seconds;
        if (event.stats != nullptr) o.stats = *event.stats;
      }
    };
  }
  Outcome get(RequestId id) const {
    std::lock_guard lock(mutex_);
    auto it = outcomes_.find(id);
    return it == outcomes_.end() ? Outcome{} : it->second;
  }
  std::size_t finished_count() const {
    std::lock_guard lock(mutex_);
    std::size_t n = 0;
    for (const auto& [id, o] : outcomes_) n += o.finished_events;
    return n;
  }

 private:
  mutable std::mutex mutex_;
  std::map<RequestId, Outcome> outcomes_;
};

// After the engine is gone: no slot active, and once the arena and the pool give back what
// they keep for reuse, the tier's ledger is at zero (nothing leaked, nothing double-billed).
inline void expect_clean(KvSpace& kv) {
  Arena& arena = kv.arena();
  EXPECT_EQ(arena.stats().active_slots, 0u);
  arena.reclaim(std::numeric_limits<std::uint64_t>::max());
  arena.pool().trim(std::numeric_limits<std::uint64_t>::max());
  const TierStats tier = kv.governor().stats(arena.tier());
  EXPECT_EQ(tier.used, 0u);
  EXPECT_EQ(tier.reserved, 0u);
}

inline EngineRequest greedy_request(std::vector<std::int32_t> prompt, std::uint32_t max_tokens) {
  EngineRequest request;
  request.prompt = std::move(prompt);
  request.max_tokens = max_tokens;
  request.use_model_eos = false;  // as the reference's continuations
  return request;
}

}  // namespace kvvm::engine::testing
