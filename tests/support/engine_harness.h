// What the engine tests share: a fixture model on the CPU, a KV space for it, the record of
// every request's events (by id through a Collector, or per submission through an EngineRig
// that owns the space and the engine), and the check that an engine left nothing behind in
// the arena or the governor's ledger.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <deque>
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
#include "kvvm/model/config.h"
#include "kvvm/model/model.h"
#include "kvvm/model/safetensors.h"
#include "kvvm/model/weights.h"
#include "kvvm/tokenizer/tokenizer.h"
#include "support/test_data.h"

namespace kvvm::engine::testing {

// Small step limits: long prompts are prefilled in several chunks, so the pressure tests see
// requests interleave and preempt one another.
inline constexpr model::ModelLimits kSmallStepLimits{.max_step_tokens = 64, .max_chunks = 8};

// A fixture checkpoint (tests/data/models/NAME), its expected.json and a CPU model of it
// (two threads: CI has two cores).
struct FixtureModel {
  model::ModelConfig config;
  model::ModelLimits limits;
  std::unique_ptr<model::WeightFiles> files;
  nlohmann::json expected;
  std::unique_ptr<model::Model> model;

  // Another CPU model of the same weights with `config` changed (eos ids, say).
  std::unique_ptr<model::Model> variant(const model::ModelConfig& changed) const {
    auto weights = model::bind_weights(changed, *files);
    EXPECT_TRUE(weights.ok()) << weights.status().to_string();
    if (!weights.ok()) return nullptr;
    model::CpuModelOptions options;
    options.limits = limits;
    options.threads = 2;
    auto made = model::make_cpu_model(changed, *weights, options);
    EXPECT_TRUE(made.ok()) << made.status().to_string();
    return made.ok() ? std::move(made).value() : nullptr;
  }
};

inline std::unique_ptr<FixtureModel> load_fixture(const std::string& name,
                                                  model::ModelLimits limits = {}) {
  const std::string dir = test::model_fixture_dir(name);
  auto loaded = std::make_unique<FixtureModel>();
  auto config = model::load_model_config(dir);
  EXPECT_TRUE(config.ok()) << config.status().to_string();
  if (!config.ok()) return nullptr;
  loaded->config = *config;
  loaded->limits = limits;
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
// llama-tiny's tokenizer (text, stop strings and a grammar's vocabulary in engine tests).
inline const tokenizer::Tokenizer& llama_tokenizer() {
  static std::unique_ptr<tokenizer::Tokenizer> loaded = [] {
    auto t = tokenizer::Tokenizer::load(test::model_fixture_dir("llama-tiny") + "/tokenizer.json");
    EXPECT_TRUE(t.ok()) << t.status().to_string();
    return t.ok() ? std::move(t).value() : nullptr;
  }();
  return *loaded;
}

inline FixtureModel& llama() {
  static std::unique_ptr<FixtureModel> loaded = load_fixture("llama-tiny");
  EXPECT_NE(loaded, nullptr);
  return *loaded;
}

inline std::unique_ptr<KvSpace> make_kv(const model::ModelConfig& config,
                                        const KvSpaceOptions& options) {
  auto kv = KvSpace::create(config, options);
  EXPECT_TRUE(kv.ok()) << kv.status().to_string();
  return kv.ok() ? std::move(kv).value() : nullptr;
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
  return make_kv(config, options);
}

// What became of one request.
struct Outcome {
  EngineRequest request;
  Status submit_status;           // not OK: refused at submit (no callback ever runs)
  double submit_retry_after = 0;  // Engine::retry_after() right after a refused submit
  RequestId id = 0;
  std::vector<std::int32_t> tokens;
  std::string text;
  int events = 0;
  int finished_events = 0;  // exactly one for every submitted request
  RequestEnd end = RequestEnd::kLength;
  Status error;
  double retry_after_seconds = 0;
  RequestStats stats;

  bool refused_at_submit() const { return !submit_status.ok(); }
  bool completed() const {
    return submit_status.ok() && finished_events == 1 &&
           (end == RequestEnd::kStop || end == RequestEnd::kLength);
  }
  bool overloaded_in_queue() const {
    return submit_status.ok() && finished_events == 1 && end == RequestEnd::kError &&
           retry_after_seconds > 0;
  }
};

// Adds one event to what `o` saw.
inline void record(Outcome& o, const RequestEvent& event) {
  ++o.events;
  o.tokens.insert(o.tokens.end(), event.tokens.begin(), event.tokens.end());
  o.text += event.text;
  if (!event.finished) return;
  ++o.finished_events;
  o.end = event.end;
  o.error = event.error;
  o.retry_after_seconds = event.retry_after_seconds;
  if (event.stats != nullptr) o.stats = *event.stats;
}

// Every event of every request, by request id.
class Collector {
 public:
  RequestCallback callback() {
    return [this](const RequestEvent& event) {
      std::lock_guard lock(mutex_);
      record(outcomes_[event.id], event);
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
// they keep for reuse, no grant is left open and the tier's ledger is at zero (nothing leaked,
// nothing double-billed). Where a fault may have poisoned a mapping (`quarantine_may_hold`),
// the ledger may still hold what the pool owns: the quarantined handles and the windows of
// quarantined slots, never reused.
inline void expect_clean(KvSpace& kv, const std::string& where = "",
                         bool quarantine_may_hold = false) {
  Arena& arena = kv.arena();
  EXPECT_EQ(arena.stats().active_slots, 0u) << where;
  arena.reclaim(std::numeric_limits<std::uint64_t>::max());
  arena.pool().trim(std::numeric_limits<std::uint64_t>::max());
  const TierStats tier = kv.governor().stats(arena.tier());
  const PoolSnapshot pool = arena.pool().snapshot();
  const ArenaStats stats = arena.stats();
  EXPECT_EQ(tier.reserved, 0u) << where;
  EXPECT_EQ(tier.used, pool.owned_bytes) << where;
  EXPECT_EQ(pool.pooled_bytes, 0u) << where;
  if (!quarantine_may_hold || (pool.quarantined_bytes == 0 && stats.quarantined_slots == 0)) {
    EXPECT_EQ(tier.used, 0u) << where;
    EXPECT_EQ(stats.committed_bytes, 0u) << where;
  }
}

inline EngineOptions no_cache() {
  EngineOptions options;
  options.prefix_cache = false;
  return options;
}

inline EngineRequest greedy_request(std::vector<std::int32_t> prompt, std::uint32_t max_tokens) {
  EngineRequest request;
  request.prompt = std::move(prompt);
  request.max_tokens = max_tokens;
  request.use_model_eos = false;  // as the reference's continuations
  return request;
}

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

// A KvSpace and an Engine over a fixture model, with the outcome of every submission.
class EngineRig {
 public:
  static std::unique_ptr<EngineRig> make(FixtureModel& model, const KvSpaceOptions& kv_options,
                                         const EngineOptions& engine_options) {
    std::unique_ptr<EngineRig> rig(new EngineRig());
    rig->kv_ = make_kv(model.config, kv_options);
    if (rig->kv_ == nullptr) return nullptr;
    auto made = Engine::create(*model.model, *rig->kv_, engine_options);
    EXPECT_TRUE(made.ok()) << made.status().to_string();
    if (!made.ok()) return nullptr;
    rig->engine_ = std::move(made).value();
    return rig;
  }

  // Submits now; returns the outcome's index.
  std::size_t submit(EngineRequest request) {
    Outcome& outcome = outcomes_.emplace_back();
    outcome.request = request;
    Result<RequestId> id = engine_->submit(
        std::move(request), [&outcome](const RequestEvent& event) { record(outcome, event); });
    if (id.ok()) {
      outcome.id = *id;
    } else {
      outcome.submit_status = id.status();
      outcome.submit_retry_after = engine_->retry_after();
    }
    return outcomes_.size() - 1;
  }

  Status run() { return engine_->run_until_idle(); }

  Engine& engine() { return *engine_; }
  KvSpace& kv() { return *kv_; }
  const Outcome& outcome(std::size_t i) const { return outcomes_[i]; }
  const std::deque<Outcome>& outcomes() const { return outcomes_; }

  // Ends the engine: its thread joins, its prefix cache lets go of every entry.
  void end_engine() { engine_.reset(); }

  // Ends the engine, then expect_clean, where a fault may have quarantined a mapping.
  void expect_ledger_returns(const std::string& where) {
    end_engine();
    expect_clean(*kv_, where, /*quarantine_may_hold=*/true);
  }

 private:
  EngineRig() = default;
  std::deque<Outcome> outcomes_;  // a deque: the callbacks hold references
  std::unique_ptr<KvSpace> kv_;
  std::unique_ptr<Engine> engine_;
};

// The tokens `request` gets alone: a fresh space and engine with the same options (a roomy
// budget), nothing else submitted.
inline std::vector<std::int32_t> solo_tokens(FixtureModel& model, KvSpaceOptions kv_options,
                                             const EngineOptions& engine_options,
                                             const EngineRequest& request) {
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

// A small host KV space for engine tests on llama-tiny: 16 KiB windows (8 tokens), 4 slots of
// 64 tokens.
inline KvSpaceOptions small_space_options() {
  KvSpaceOptions options;
  options.host_granule = 16 << 10;
  options.max_slots = 4;
  options.max_context = 64;
  return options;
}

}  // namespace kvvm::engine::testing
