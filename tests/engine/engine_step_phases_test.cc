// The engine step's phases read alone: the scheduler's StepPlan, the model runner's
// StepOutputs and the scheduler's update, over the tiny llama on the CPU; and admission
// control's room at arrival (the running places still free count as room).
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "engine/admission_control.h"
#include "engine/engine_options.h"
#include "engine/model_runner.h"
#include "engine/scheduler.h"
#include "kvvm/base/log.h"
#include "kvvm/engine/engine.h"
#include "kvvm/engine/kv_manager.h"
#include "support/engine_harness.h"

namespace kvvm::engine {
namespace {

using testing::Collector;
using testing::expect_clean;
using testing::greedy_request;
using testing::llama;
using testing::make_kv;
using testing::no_cache;

const std::vector<std::int32_t> kPrompt = {269, 293, 290, 288, 297, 268, 259, 287};

// The phases wired as the engine wires them, without its thread or inbox.
struct Phases {
  std::unique_ptr<KvSpace> kv;
  EngineOptions options;
  std::unique_ptr<KvManager> manager;
  std::unique_ptr<AdmissionControl> admission;
  std::unique_ptr<Scheduler> scheduler;
  std::unique_ptr<ModelRunner> runner;

  static std::unique_ptr<Phases> make(EngineOptions options) {
    auto p = std::make_unique<Phases>();
    p->kv = make_kv(llama().config, 4);
    if (p->kv == nullptr) return nullptr;
    Status resolved = resolve_options(*llama().model, *p->kv, false, options);
    EXPECT_TRUE(resolved.ok()) << resolved.to_string();
    p->options = std::move(options);
    KvManagerOptions kv_options;
    kv_options.prefix_cache = false;
    auto manager = KvManager::create(*p->kv, kv_options);
    EXPECT_TRUE(manager.ok()) << manager.status().to_string();
    if (!manager.ok()) return nullptr;
    p->manager = std::move(manager).value();
    p->admission = std::make_unique<AdmissionControl>(p->options);
    p->scheduler =
        std::make_unique<Scheduler>(*llama().model, *p->manager, p->options, *p->admission);
    p->runner = std::make_unique<ModelRunner>(*llama().model, p->options.step_tokens);
    return p;
  }

  RequestState* enqueue(RequestId id, std::uint32_t max_tokens) {
    auto r = std::make_unique<RequestState>();
    r->id = id;
    r->request = greedy_request(kPrompt, max_tokens);
    r->tokens = kPrompt;
    r->prompt_size = static_cast<std::uint32_t>(kPrompt.size());
    RequestState* raw = r.get();
    scheduler->enqueue(std::move(r));
    return raw;
  }
};

TEST(EngineStepPhases, ThePlanIsAValueEachPhaseReadsAlone) {
  auto p = Phases::make(no_cache());
  ASSERT_NE(p, nullptr);
  const Clock::time_point now = Clock::now();
  RequestState* a = p->enqueue(1, 3);
  RequestState* b = p->enqueue(2, 3);

  // First step: both admitted, each with its whole prompt as one chunk.
  StepPlan plan = p->scheduler->schedule(now);
  ASSERT_EQ(plan.chunks.size(), 2u);
  EXPECT_EQ(plan.admitted.size(), 2u);
  EXPECT_TRUE(plan.preempted.empty());
  EXPECT_TRUE(plan.refused.empty());
  EXPECT_EQ(plan.chunks[0].request, a);
  EXPECT_EQ(plan.chunks[1].request, b);
  EXPECT_EQ(plan.chunks[0].start, 0u);
  EXPECT_EQ(plan.chunks[0].tokens, kPrompt.size());
  EXPECT_EQ(plan.tokens, 2 * kPrompt.size());
  EXPECT_FALSE(plan.decode_only);
  EXPECT_EQ(plan.graph_bucket, 0u);
  // Planning computed nothing: the tokens are the update's to count.
  EXPECT_EQ(a->computed, 0u);

  const StepOutputs& out = p->runner->execute(plan, p->kv->view());
  ASSERT_TRUE(out.status.ok()) << out.status.to_string();
  ASSERT_EQ(out.chunks.size(), 2u);
  for (const ChunkOutput& c : out.chunks) {
    EXPECT_GE(c.sampled, 0);
    EXPECT_LT(c.sampled, static_cast<std::int32_t>(llama().config.vocab_size));
    EXPECT_TRUE(c.logprobs.empty());  // none asked
    EXPECT_TRUE(c.logits.empty());
  }
  const std::int32_t drawn = out.chunks[0].sampled;
  EXPECT_EQ(a->generated, 0u);  // the runner changed no request
  p->scheduler->update(plan, out, now);
  EXPECT_EQ(a->computed, kPrompt.size());
  EXPECT_EQ(a->generated, 1u);
  EXPECT_EQ(a->tokens.back(), drawn);
  EXPECT_EQ(p->scheduler->events().size(), 2u);
  p->scheduler->finish_step(now);
  p->scheduler->delivered();

  // Second step: two decode tokens, replayed by the smallest captured bucket that holds them.
  p->scheduler->set_graph_buckets({1, 4, 8});
  plan = p->scheduler->schedule(now);
  ASSERT_EQ(plan.chunks.size(), 2u);
  EXPECT_TRUE(plan.decode_only);
  EXPECT_TRUE(plan.admitted.empty());
  EXPECT_EQ(plan.tokens, 2u);
  EXPECT_EQ(plan.graph_bucket, 4u);

  // A failed step's outputs end the plan's requests with the error, and only them.
  RequestState* c = p->enqueue(3, 3);
  StepOutputs failed;
  failed.status = Status::Internal("injected: the forward failed");
  p->scheduler->update(plan, failed, now);
  EXPECT_TRUE(a->finished);
  EXPECT_TRUE(b->finished);
  EXPECT_EQ(a->end, RequestEnd::kError);
  EXPECT_NE(a->error.message().find("injected"), std::string::npos) << a->error.to_string();
  EXPECT_FALSE(c->finished);
  p->scheduler->finish_step(now);
  p->scheduler->delivered();
  EXPECT_TRUE(p->scheduler->running().empty());
  ASSERT_EQ(p->scheduler->waiting().size(), 1u);
  p->scheduler->cancel_all();
  p->scheduler->finish_step(now);
  p->scheduler->delivered();
  p->manager.reset();
  expect_clean(*p->kv);
}

// With max_queue 2 and four running places free, a burst on an engine that has not stepped yet
// is room for six: the places take requests at the next step, so only the seventh is refused.
TEST(EngineAdmission, ABurstOnAnIdleEngineCountsTheFreeRunningPlacesAsRoom) {
  auto kv = make_kv(llama().config, 6);
  Collector collector;
  {
    EngineOptions options = no_cache();
    options.max_running = 4;
    options.max_queue = 2;
    auto engine = Engine::create(*llama().model, *kv, options);
    ASSERT_TRUE(engine.ok()) << engine.status().to_string();
    for (int i = 0; i < 6; ++i) {
      auto id = (*engine)->submit(greedy_request(kPrompt, 2), collector.callback());
      EXPECT_TRUE(id.ok()) << "request " << i << ": " << id.status().to_string();
    }
    auto seventh = (*engine)->submit(greedy_request(kPrompt, 2), collector.callback());
    ASSERT_FALSE(seventh.ok());
    EXPECT_EQ(seventh.status().code(), StatusCode::kResourceExhausted);
    EXPECT_NE(seventh.status().message().find("max_queue 2"), std::string::npos)
        << seventh.status().to_string();
    ASSERT_TRUE((*engine)->run_until_idle().ok());
    EXPECT_EQ((*engine)->stats().finished, 6u);
    EXPECT_EQ((*engine)->stats().refused_overloaded, 1u);
  }
  expect_clean(*kv);
}

class Recorder : public Logger {
 public:
  void log(LogLevel level, std::string_view message) override {
    if (level >= LogLevel::kWarning) warnings.emplace_back(message);
  }
  std::vector<std::string> warnings;
};

// A one-token prompt has nothing before its last token to fork: each choice computes it
// itself, with no warning of a failed fork.
TEST(EngineChoices, AOneTokenPromptWithSeveralChoicesWarnsOfNothing) {
  auto kv = make_kv(llama().config, 4);
  Collector collector;
  Recorder recorder;
  {
    ScopedLogger scoped(&recorder);
    auto engine = Engine::create(*llama().model, *kv, no_cache());
    ASSERT_TRUE(engine.ok()) << engine.status().to_string();
    EngineRequest request = greedy_request({269}, 3);
    request.n = 3;
    auto id = (*engine)->submit(std::move(request), collector.callback());
    ASSERT_TRUE(id.ok()) << id.status().to_string();
    ASSERT_TRUE((*engine)->run_until_idle().ok());
    EXPECT_EQ(collector.finished_count(), 3u);
  }
  for (const std::string& w : recorder.warnings) ADD_FAILURE() << "warning: " << w;
  expect_clean(*kv);
}

// An engine whose thread found nothing to do for idle_release gives back what its finished
// sequences kept mapped for reuse and the pool's spare handles: the budget then holds nothing
// but the prefix cache's windows.
TEST(EngineIdle, AnIdleEngineGivesBackWhatItsFinishedSequencesKept) {
  for (const bool cache : {false, true}) {
    const std::string where = cache ? "prefix cache on" : "prefix cache off";
    auto kv = make_kv(llama().config, 4);
    Collector collector;
    {
      EngineOptions options = cache ? EngineOptions{} : no_cache();
      options.idle_release = std::chrono::milliseconds(20);
      auto engine = Engine::create(*llama().model, *kv, options);
      ASSERT_TRUE(engine.ok()) << engine.status().to_string();
      ASSERT_TRUE((*engine)->start().ok());
      ASSERT_TRUE((*engine)->submit(greedy_request(kPrompt, 4), collector.callback()).ok());
      const auto deadline = Clock::now() + std::chrono::seconds(20);
      const auto used = [&] { return kv->governor().stats(kv->arena().tier()).used; };
      std::uint64_t cached = 0;
      while (Clock::now() < deadline) {
        const EngineStats stats = (*engine)->stats();
        cached = stats.prefix.cached_bytes;
        if (collector.finished_count() == 1 && stats.arena.reclaimable_bytes == 0 &&
            used() == cached) {
          break;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
      }
      ASSERT_EQ(collector.finished_count(), 1u) << where;
      const EngineStats stats = (*engine)->stats();
      EXPECT_EQ(stats.arena.reclaimable_bytes, 0u) << where;
      EXPECT_EQ(used(), cached) << where << ": the budget holds more than the prefix cache";
      if (cache) {
        EXPECT_GT(cached, 0u) << where;
      } else {
        EXPECT_EQ(stats.arena.physical_bytes, 0u) << where;
      }
    }
    expect_clean(*kv, where);
  }
}

}  // namespace
}  // namespace kvvm::engine
