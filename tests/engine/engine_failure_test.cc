// Failures inside the engine end only the requests they touch: a failed model step ends the
// step's requests with its error, a driver fault ends the request whose commit it broke, and
// the engine serves the next request as before. The KV space runs on a lent (fault-injecting)
// driver.
#include <gtest/gtest.h>

#include <atomic>
#include <vector>

#include "kvvm/engine/engine.h"
#include "kvvm/vmm/fault_driver.h"
#include "kvvm/vmm/host_driver.h"
#include "support/engine_harness.h"
#include "support/failing_model.h"

namespace kvvm::engine {
namespace {

using testing::Collector;
using testing::expect_clean;
using testing::greedy_request;
using testing::llama;
using testing::make_kv;
using testing::no_cache;

const std::vector<std::int32_t> kFailurePrompt = {39, 68, 280, 78, 11, 220, 333, 81, 462};

using kvvm::testing::FailingModel;

TEST(EngineFailure, AFailedStepEndsItsRequestsAndTheEngineGoesOn) {
  auto kv = make_kv(llama().config, 3);
  std::vector<std::int32_t> expected;
  {
    Collector alone;  // request ids start again in every engine
    auto engine = Engine::create(*llama().model, *kv, no_cache());
    ASSERT_TRUE(engine.ok());
    const RequestId id = *(*engine)->submit(greedy_request(kFailurePrompt, 8), alone.callback());
    ASSERT_TRUE((*engine)->run_until_idle().ok());
    expected = alone.get(id).tokens;
    ASSERT_EQ(expected.size(), 8u);
  }
  FailingModel failing(*llama().model, 3, Status::Internal("injected model failure"));
  Collector collector;
  {
    auto engine = Engine::create(failing, *kv, no_cache());
    ASSERT_TRUE(engine.ok());
    const RequestId a = *(*engine)->submit(greedy_request(kFailurePrompt, 8), collector.callback());
    const RequestId b = *(*engine)->submit(greedy_request(kFailurePrompt, 8), collector.callback());
    ASSERT_TRUE((*engine)->run_until_idle().ok());
    for (const RequestId id : {a, b}) {
      const testing::Outcome o = collector.get(id);
      EXPECT_EQ(o.finished_events, 1);
      EXPECT_EQ(o.end, RequestEnd::kError);
      EXPECT_NE(o.error.message().find("injected model failure"), std::string::npos)
          << o.error.to_string();
      EXPECT_EQ(o.tokens.size(), 2u);  // steps 1 and 2 each produced one
    }
    EXPECT_EQ(kv->arena().stats().active_slots, 0u);
    const RequestId c = *(*engine)->submit(greedy_request(kFailurePrompt, 8), collector.callback());
    ASSERT_TRUE((*engine)->run_until_idle().ok());
    EXPECT_EQ(collector.get(c).end, RequestEnd::kLength);
    EXPECT_EQ(collector.get(c).tokens, expected);
    EXPECT_EQ((*engine)->stats().failed, 2u);
    EXPECT_EQ((*engine)->stats().finished, 1u);
  }
  expect_clean(*kv);
}

TEST(EngineFailure, ADriverFaultEndsOneRequestAndTheOthersFinish) {
  auto host = make_host_driver();
  ASSERT_TRUE(host.ok());
  FaultDriver faults(**host);
  KvSpaceOptions options;
  options.max_slots = 3;
  options.max_context = 128;
  options.driver = &faults;
  auto kv = KvSpace::create(llama().config, options);
  ASSERT_TRUE(kv.ok()) << kv.status().to_string();
  EXPECT_EQ(&(*kv)->driver(), &faults);
  Collector collector;
  {
    auto engine = Engine::create(*llama().model, **kv, no_cache());
    ASSERT_TRUE(engine.ok());
    const RequestId clean =
        *(*engine)->submit(greedy_request(kFailurePrompt, 30), collector.callback());
    ASSERT_TRUE((*engine)->run_until_idle().ok());
    const std::vector<std::int32_t> expected = collector.get(clean).tokens;
    const std::uint64_t maps_before = faults.counts().of(DriverOp::kMap);
    EXPECT_GT(maps_before, 0u) << "the KV space did not use the lent driver";

    std::vector<RequestId> ids;
    for (int i = 0; i < 3; ++i) {
      ids.push_back(*(*engine)->submit(greedy_request(kFailurePrompt, 30), collector.callback()));
    }
    // Admission reuses the finished slot's windows; the growth of some sequence maps.
    faults.fail_nth(DriverOp::kMap, 2);
    ASSERT_TRUE((*engine)->run_until_idle().ok());
    EXPECT_EQ(faults.injected(), 1u);
    int failed = 0;
    for (const RequestId id : ids) {
      const testing::Outcome o = collector.get(id);
      EXPECT_EQ(o.finished_events, 1);
      if (o.end == RequestEnd::kError) {
        ++failed;
        EXPECT_EQ(o.error.code(), StatusCode::kDriverError) << o.error.to_string();
      } else {
        EXPECT_EQ(o.end, RequestEnd::kLength);
        EXPECT_EQ(o.tokens, expected);
      }
    }
    EXPECT_EQ(failed, 1);
    // The engine still serves.
    const RequestId after =
        *(*engine)->submit(greedy_request(kFailurePrompt, 30), collector.callback());
    ASSERT_TRUE((*engine)->run_until_idle().ok());
    EXPECT_EQ(collector.get(after).tokens, expected);
  }
  EXPECT_EQ((*kv)->arena().stats().active_slots, 0u);
}

TEST(EngineFailure, ALostContextEndsEveryRequestAndRefusesNewOnes) {
  auto kv = make_kv(llama().config, 3);
  // Lost at the third step: the requests running then and the one waiting all go with it.
  FailingModel lost(*llama().model, 3, kvvm::testing::illegal_address(), true);
  Collector collector;
  EngineOptions options = no_cache();
  options.max_running = 2;
  auto engine = Engine::create(lost, *kv, options);
  ASSERT_TRUE(engine.ok());
  EXPECT_TRUE((*engine)->health().ok());
  std::vector<RequestId> ids;
  for (int i = 0; i < 3; ++i) {
    ids.push_back(*(*engine)->submit(greedy_request(kFailurePrompt, 8), collector.callback()));
  }
  const Status ran = (*engine)->run_until_idle();
  EXPECT_FALSE(ran.ok()) << "a lost context is a broken engine";
  EXPECT_TRUE(context_lost(ran)) << ran.to_string();
  for (const RequestId id : ids) {
    const testing::Outcome o = collector.get(id);
    EXPECT_EQ(o.finished_events, 1);
    EXPECT_EQ(o.end, RequestEnd::kError);
    EXPECT_TRUE(context_lost(o.error)) << o.error.to_string();
    EXPECT_NE(o.error.message().find("the GPU context was lost"), std::string::npos)
        << o.error.to_string();
  }
  const Status health = (*engine)->health();
  EXPECT_FALSE(health.ok());
  EXPECT_NE(health.message().find("cudaErrorIllegalAddress"), std::string::npos)
      << health.to_string();
  EXPECT_TRUE((*engine)->stats().context_lost);
  EXPECT_EQ((*engine)->stats().failed, 3u);
  // No new request is taken, and the model is not called again.
  Result<RequestId> refused =
      (*engine)->submit(greedy_request(kFailurePrompt, 8), collector.callback());
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(refused.status().message().find("the GPU context was lost"), std::string::npos);
  EXPECT_EQ(lost.calls(), 3);
}

TEST(EngineFailure, AnErrorThatIsNotStickyLosesNothing) {
  EXPECT_FALSE(context_lost(Status::Internal("injected model failure")));
  EXPECT_FALSE(context_lost(Status::DriverError(
      "out of memory", DriverFailure{"cudaMalloc", "cudaErrorMemoryAllocation", 2})));
  EXPECT_FALSE(context_lost(
      Status::DriverError("injected", DriverFailure{"fence", "KVVM_INJECTED_FAULT", -1})));
  for (const char* name : {"CUDA_ERROR_ILLEGAL_ADDRESS", "cudaErrorLaunchFailure",
                           "CUDA_ERROR_ECC_UNCORRECTABLE", "cudaErrorIllegalAddress"}) {
    EXPECT_TRUE(
        context_lost(Status::DriverError("lost", DriverFailure{"cuStreamSynchronize", name, 700})
                         .with_context("a step")))
        << name;
  }
}

TEST(EngineFailure, ALentDriverOfAnotherBackendIsRefused) {
  auto host = make_host_driver();
  ASSERT_TRUE(host.ok());
  KvSpaceOptions options;
  options.backend = model::Backend::kCuda;
  options.driver = host->get();
  auto kv = KvSpace::create(llama().config, options);
  ASSERT_FALSE(kv.ok());
  EXPECT_EQ(kv.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(kv.status().message().find("driver"), std::string::npos) << kv.status().to_string();
}

}  // namespace
}  // namespace kvvm::engine
