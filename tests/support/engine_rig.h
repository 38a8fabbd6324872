// A test rig for the Engine on the CPU backend: a fixture model loaded once, a KvSpace and an
// Engine over it, requests submitted (at once or before a chosen step) and run to completion,
// with every request's tokens, end and stats collected; plus the ledger check that every
// byte went back after the run.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <deque>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "kvvm/engine/engine.h"
#include "kvvm/engine/kv_space.h"
#include "kvvm/model/config.h"
#include "kvvm/model/model.h"
#include "kvvm/model/safetensors.h"
#include "kvvm/model/weights.h"
#include "support/test_data.h"

namespace kvvm::testing {

// A checkpoint from tests/data/models on the CPU model (two threads: CI has two cores).
struct FixtureModel {
  model::ModelConfig config;
  std::unique_ptr<model::WeightFiles> files;
  model::ModelWeights weights;
  std::unique_ptr<model::Model> model;

  static std::unique_ptr<FixtureModel> load(const std::string& name,
                                            model::ModelLimits limits = {.max_step_tokens = 64,
                                                                         .max_chunks = 8}) {
    const std::string dir = test::model_fixture_dir(name);
    auto made = std::make_unique<FixtureModel>();
    auto config = model::load_model_config(dir);
    EXPECT_TRUE(config.ok()) << config.status().to_string();
    if (!config.ok()) return nullptr;
    made->config = *config;
    auto files = model::WeightFiles::open_dir(dir);
    EXPECT_TRUE(files.ok()) << files.status().to_string();
    if (!files.ok()) return nullptr;
    made->files = std::move(files).value();
    auto weights = model::bind_weights(made->config, *made->files);
    EXPECT_TRUE(weights.ok()) << weights.status().to_string();
    if (!weights.ok()) return nullptr;
    made->weights = *weights;
    model::CpuModelOptions options;
    options.limits = limits;
    options.threads = 2;
    auto cpu = model::make_cpu_model(made->config, made->weights, options);
    EXPECT_TRUE(cpu.ok()) << cpu.status().to_string();
    if (!cpu.ok()) return nullptr;
    made->model = std::move(cpu).value();
    return made;
  }
};

// What became of one request.
struct Outcome {
  engine::EngineRequest request;
  Status submit_status;           // not OK: refused at submit (no callback ever runs)
  double submit_retry_after = 0;  // Engine::retry_after() right after a refused submit
  engine::RequestId id = 0;
  std::vector<std::int32_t> tokens;
  int finish_events = 0;  // exactly one for every submitted request
  engine::RequestEnd end = engine::RequestEnd::kLength;
  Status error;
  double retry_after_seconds = 0;
  engine::RequestStats stats;

  bool refused_at_submit() const { return !submit_status.ok(); }
  bool completed() const {
    return submit_status.ok() && finish_events == 1 &&
           (end == engine::RequestEnd::kStop || end == engine::RequestEnd::kLength);
  }
  bool overloaded_in_queue() const {
    return submit_status.ok() && finish_events == 1 && end == engine::RequestEnd::kError &&
           retry_after_seconds > 0;
  }
};

// A prompt of `n` ids drawn from `seed`, away from the special ids at the top of the vocabulary.
inline std::vector<std::int32_t> rig_prompt(std::size_t n, std::uint64_t seed,
                                            std::int32_t vocab = 1000) {
  std::vector<std::int32_t> ids(n);
  std::uint64_t x = seed * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull;
  for (auto& id : ids) {
    x ^= x >> 31;
    x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 29;
    id = static_cast<std::int32_t>(x % static_cast<std::uint64_t>(vocab));
  }
  return ids;
}

class EngineRig {
 public:
  // A KvSpace with `kv_options` and an Engine with `engine_options` over `model`.
  static std::unique_ptr<EngineRig> make(FixtureModel& model,
                                         const engine::KvSpaceOptions& kv_options,
                                         const engine::EngineOptions& engine_options) {
    std::unique_ptr<EngineRig> rig(new EngineRig());
    auto kv = engine::KvSpace::create(model.config, kv_options);
    EXPECT_TRUE(kv.ok()) << kv.status().to_string();
    if (!kv.ok()) return nullptr;
    rig->kv_ = std::move(kv).value();
    auto made = engine::Engine::create(*model.model, *rig->kv_, engine_options);
    EXPECT_TRUE(made.ok()) << made.status().to_string();
    if (!made.ok()) return nullptr;
    rig->engine_ = std::move(made).value();
    return rig;
  }

  // Submits now; returns the outcome's index.
  std::size_t submit(engine::EngineRequest request) {
    Outcome& outcome = outcomes_.emplace_back();
    outcome.request = request;
    Result<engine::RequestId> id =
        engine_->submit(std::move(request), [&outcome](const engine::RequestEvent& event) {
          outcome.tokens.insert(outcome.tokens.end(), event.tokens.begin(), event.tokens.end());
          if (!event.finished) return;
          ++outcome.finish_events;
          outcome.end = event.end;
          outcome.error = event.error;
          outcome.retry_after_seconds = event.retry_after_seconds;
          if (event.stats != nullptr) outcome.stats = *event.stats;
        });
    if (id.ok()) {
      outcome.id = *id;
    } else {
      outcome.submit_status = id.status();
      outcome.submit_retry_after = engine_->retry_after();
    }
    return outcomes_.size() - 1;
  }

  Status run() { return engine_->run_until_idle(); }

  engine::Engine& engine() { return *engine_; }
  engine::KvSpace& kv() { return *kv_; }
  const Outcome& outcome(std::size_t i) const { return outcomes_[i]; }
  const std::deque<Outcome>& outcomes() const { return outcomes_; }

  // Ends the engine (its prefix cache lets go of every entry), reclaims every finished
  // window, trims the pool, and checks that no grant is left open and the tier's ledger
  // holds nothing, or, where a fault poisoned a mapping, only what the pool owns (the
  // quarantined handles and the windows of quarantined slots, never reused).
  void expect_ledger_returns(const std::string& where) {
    engine_.reset();
    Arena& arena = kv_->arena();
    EXPECT_EQ(arena.stats().active_slots, 0u) << where;
    arena.reclaim(std::numeric_limits<std::uint64_t>::max());
    arena.pool().trim(std::numeric_limits<std::uint64_t>::max());
    const TierStats tier = kv_->governor().stats(arena.tier());
    const PoolSnapshot pool = arena.pool().snapshot();
    const ArenaStats stats = arena.stats();
    EXPECT_EQ(tier.reserved, 0u) << where;
    EXPECT_EQ(tier.used, pool.owned_bytes) << where;
    EXPECT_EQ(pool.pooled_bytes, 0u) << where;
    if (pool.quarantined_bytes == 0 && stats.quarantined_slots == 0) {
      EXPECT_EQ(tier.used, 0u) << where;
      EXPECT_EQ(stats.committed_bytes, 0u) << where;
    }
  }

 private:
  EngineRig() = default;
  std::deque<Outcome> outcomes_;  // a deque: the callbacks hold references
  std::unique_ptr<engine::KvSpace> kv_;
  std::unique_ptr<engine::Engine> engine_;
};

// The tokens `request` gets alone: a fresh space and engine with the same options (a roomy
// budget), nothing else submitted.
inline std::vector<std::int32_t> solo_tokens(FixtureModel& model, engine::KvSpaceOptions kv_options,
                                             const engine::EngineOptions& engine_options,
                                             const engine::EngineRequest& request) {
  kv_options.budget_bytes = 0;
  kv_options.driver = nullptr;
  auto rig = EngineRig::make(model, kv_options, engine_options);
  if (!rig) return {};
  const std::size_t i = rig->submit(request);
  const Status run = rig->run();
  EXPECT_TRUE(run.ok()) << run.to_string();
  const Outcome& outcome = rig->outcome(i);
  EXPECT_TRUE(outcome.completed()) << "solo run: " << outcome.error.to_string();
  EXPECT_EQ(outcome.stats.preemptions, 0u) << "a request alone was preempted";
  return outcome.tokens;
}

}  // namespace kvvm::testing
