// Where the engine's steps spend the host's time (EngineStats::phases): every model step is
// counted, the model's own waits land in `wait` and the rest of its forward in `launch`.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <thread>

#include "kvvm/engine/engine.h"
#include "kvvm/model/model.h"
#include "support/engine_harness.h"

namespace kvvm::engine {
namespace {

using testing::EngineRig;
using testing::expect_clean;
using testing::greedy_request;
using testing::llama;

constexpr double kWaitSeconds = 0.0015;
constexpr auto kForwardSleep = std::chrono::milliseconds(3);

// The fixture's model, each forward of which sleeps kForwardSleep and reports kWaitSeconds of it
// as a wait for the device, as the CUDA backend reports its stream synchronization.
class WaitingModel : public model::Model {
 public:
  explicit WaitingModel(model::Model& inner)
      : Model(inner.config(), inner.limits()), inner_(inner) {}
  model::Backend backend() const override { return inner_.backend(); }
  Status forward(const model::StepBatch& batch, const model::StepOutput& out) override {
    std::this_thread::sleep_for(kForwardSleep);
    ++waits_.steps;
    waits_.seconds += kWaitSeconds;
    return inner_.forward(batch, out);
  }
  model::ForwardWaits forward_waits() const override { return waits_; }

 private:
  model::Model& inner_;
  model::ForwardWaits waits_;
};

TEST(EnginePhaseTimes, CountEveryModelStepAndSplitTheForwardAtTheModelsWait) {
  testing::FixtureModel& base = llama();
  testing::FixtureModel fixture;
  fixture.config = base.config;
  fixture.limits = base.limits;
  auto waiting = std::make_unique<WaitingModel>(*base.model);
  WaitingModel& model = *waiting;
  fixture.model = std::move(waiting);
  KvSpaceOptions kv;
  kv.max_slots = 3;
  kv.max_context = 128;
  std::unique_ptr<EngineRig> rig = EngineRig::make(fixture, kv, {});
  ASSERT_NE(rig, nullptr);
  rig->submit(greedy_request({269, 293}, 2));
  ASSERT_TRUE(rig->run().ok());
  // The phases of the steps after this point only, as a benchmark takes them.
  const EngineStats before = rig->engine().stats();
  ASSERT_GT(before.phases.steps, 0u);
  for (int i = 0; i < 2; ++i) rig->submit(greedy_request({269, 293, 290, 288}, 5));
  ASSERT_TRUE(rig->run().ok());
  const EngineStats after = rig->engine().stats();
  const StepPhaseSeconds p = after.phases.since(before.phases);

  EXPECT_EQ(p.steps, after.steps - before.steps);
  EXPECT_EQ(p.steps, model.forward_waits().steps - before.phases.steps);
  ASSERT_GT(p.steps, 0u);
  const double steps = static_cast<double>(p.steps);
  EXPECT_NEAR(p.wait, steps * kWaitSeconds, 1e-9);
  // The forward slept 3 ms of which 1.5 were the wait: the rest, at least, was the launch.
  EXPECT_GE(p.launch, steps * (0.003 - kWaitSeconds));
  for (const double phase : {p.schedule, p.prepare, p.update, p.deliver}) EXPECT_GE(phase, 0.0);
  // The phases are parts of the run: none exceeds the whole of it by much.
  EXPECT_LT(p.launch, steps * 0.003 + 5.0);
  rig->end_engine();
  expect_clean(rig->kv(), "after the runs");
}

}  // namespace
}  // namespace kvvm::engine
