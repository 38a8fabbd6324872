// What the scheduling tests share: a fake clock the scheduler reads (no assertion depends on
// wall time), a roomy KV space, and the llama fixture behind a model whose steps take a known
// time on that clock.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "kvvm/model/model.h"
#include "support/engine_harness.h"

namespace kvvm::engine::scheduling_test {

using std::chrono::microseconds;
using std::chrono::milliseconds;
using std::chrono::seconds;
using testing::Collector;
using testing::EngineRig;
using testing::expect_clean;
using testing::greedy_request;
using testing::llama;
using testing::make_kv;
using testing::no_cache;
using testing::rig_prompt;
using testing::solo_tokens;

using SteadyClock = std::chrono::steady_clock;

// The scheduler's time, moved only by the test.
class FakeClock {
 public:
  std::function<SteadyClock::time_point()> fn() {
    return [this] { return now_; };
  }
  void advance(SteadyClock::duration by) { now_ += by; }
  SteadyClock::time_point now() const { return now_; }

 private:
  SteadyClock::time_point now_ = SteadyClock::time_point{} + std::chrono::hours(1);
};

inline KvSpaceOptions roomy_space() {
  KvSpaceOptions options;
  options.max_slots = 3;
  options.max_context = 128;
  return options;
}

// The fixture's model, each step of which takes `fixed` + `per_token` a token on the fake clock
// (and nothing else moves it): the step times the engine measures are exactly that line.
class TimedModel : public model::Model {
 public:
  TimedModel(model::Model& inner, FakeClock& clock, microseconds fixed, microseconds per_token)
      : Model(inner.config(), inner.limits()),
        inner_(inner),
        clock_(clock),
        fixed_(fixed),
        per_token_(per_token) {}
  model::Backend backend() const override { return inner_.backend(); }
  Status forward(const model::StepBatch& batch, const model::StepOutput& out) override {
    clock_.advance(fixed_ + per_token_ * static_cast<std::int64_t>(batch.token_ids.size()));
    steps.push_back(batch.token_ids.size());
    return inner_.forward(batch, out);
  }
  std::vector<std::size_t> steps;  // each step's tokens

 private:
  model::Model& inner_;
  FakeClock& clock_;
  microseconds fixed_, per_token_;
};

struct TimedRig {
  FakeClock clock;
  testing::FixtureModel fixture;  // owns the TimedModel
  TimedModel* model = nullptr;
  std::unique_ptr<EngineRig> rig;
};

// The llama fixture behind a TimedModel of `fixed` a step + `per_token` a token.
inline std::unique_ptr<TimedRig> timed_rig(EngineOptions options,
                                           microseconds fixed = microseconds(1000),
                                           microseconds per_token = microseconds(100)) {
  auto t = std::make_unique<TimedRig>();
  testing::FixtureModel& base = llama();
  auto model = std::make_unique<TimedModel>(*base.model, t->clock, fixed, per_token);
  t->model = model.get();
  t->fixture.config = base.config;
  t->fixture.limits = base.limits;
  t->fixture.model = std::move(model);
  options.clock = t->clock.fn();
  t->rig = EngineRig::make(t->fixture, roomy_space(), options);
  if (t->rig == nullptr) return nullptr;
  return t;
}

}  // namespace kvvm::engine::scheduling_test
