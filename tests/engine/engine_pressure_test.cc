// The engine under budget pressure: more requests than the KV budget holds and than the queue
// takes. Every request either completes with exactly the tokens it gets alone (greedy and
// seeded sampling alike, preempted or not) or is refused as overloaded with a retry estimate;
// nothing is cut short or corrupted, and every byte goes back to the tier afterwards.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "support/engine_harness.h"

namespace kvvm::engine {
namespace {

using testing::EngineRig;
using testing::FixtureModel;
using testing::load_fixture;
using testing::Outcome;
using testing::record;
using testing::rig_prompt;
using testing::solo_tokens;

// llama-tiny's token-major token is 2 KiB (2 layers, K and V, 2 heads of 64 fp32): a 16 KiB
// granule holds 8 tokens, so a request of 10 + 22 tokens needs 4 windows at its end.
constexpr std::uint64_t kPressureGranule = 16 << 10;
constexpr std::uint32_t kPromptTokens = 10;
constexpr std::uint32_t kMaxTokens = 22;

// An fp8 cache's token is a quarter of fp32's: its granule is a quarter too, so a window
// holds the same 8 tokens and the same pressure arises.
KvSpaceOptions tight_space(std::uint64_t windows, DType kv = DType::kFp32) {
  KvSpaceOptions options;
  options.kv_dtype = kv;
  const std::uint64_t granule = kPressureGranule / 4 * element_bytes(kv);
  options.host_granule = granule;
  options.max_slots = 8;
  options.max_context = 64;
  options.budget_bytes = windows * granule;
  return options;
}

EngineRequest pressure_request(std::uint64_t i) {
  EngineRequest request;
  request.prompt = rig_prompt(kPromptTokens, 100 + i);
  request.max_tokens = kMaxTokens;
  request.use_model_eos = false;  // every completed request runs its full length
  if (i % 2 == 1) {
    request.sampling.temperature = 0.9f;
    request.sampling.top_k = 40;
    request.sampling.seed = 7000 + i;
  }
  return request;
}

std::unique_ptr<FixtureModel> small_step_llama() {
  return load_fixture("llama-tiny", testing::kSmallStepLimits);
}

bool mentions_overloaded(const Status& status) {
  return status.message().find("overloaded") != std::string::npos;
}

// Eight requests at once against a queue of five and a budget of six windows: three refused
// at submit, the rest run four at a time where only one and a half fit to the end, so growth
// is refused and the newest sequences are preempted and recomputed. With an fp32 cache and an
// fp8 one (each request then compared with itself alone on fp8).
TEST(EnginePressure, EveryRequestCompletesAsAloneOrIsRefusedAsOverloaded) {
  auto model = small_step_llama();
  ASSERT_NE(model, nullptr);
  for (const auto& [prefix_cache, kv] :
       {std::pair{true, DType::kFp32}, std::pair{false, DType::kFp32}, std::pair{true, DType::kFp8},
        std::pair{false, DType::kFp8}}) {
    const std::string where = std::string(prefix_cache ? "prefix cache on" : "prefix cache off") +
                              ", " + std::string(to_string(kv)) + " cache";
    EngineOptions options;
    options.max_running = 4;
    options.max_queue = 2;
    options.prefix_cache = prefix_cache;
    const KvSpaceOptions space = tight_space(6, kv);
    auto rig = EngineRig::make(*model, space, options);
    ASSERT_NE(rig, nullptr);
    constexpr std::uint64_t kRequests = 8;
    for (std::uint64_t i = 0; i < kRequests; ++i) rig->submit(pressure_request(i));
    const Status run = rig->run();
    ASSERT_TRUE(run.ok()) << where << ": " << run.to_string();

    std::uint64_t completed = 0, refused_at_submit = 0, refused_in_queue = 0, preempted = 0;
    std::uint64_t preempted_seeded = 0;  // recomputed, so drawing the same numbers again
    for (std::uint64_t i = 0; i < kRequests; ++i) {
      const Outcome& outcome = rig->outcome(i);
      const std::string which = where + ", request " + std::to_string(i);
      if (outcome.refused_at_submit()) {
        ++refused_at_submit;
        EXPECT_EQ(outcome.submit_status.code(), StatusCode::kResourceExhausted) << which;
        EXPECT_TRUE(mentions_overloaded(outcome.submit_status))
            << which << ": " << outcome.submit_status.to_string();
        EXPECT_GE(outcome.submit_retry_after, 1.0) << which;
        EXPECT_EQ(outcome.finished_events, 0) << which << ": a refused submit ran its callback";
        continue;
      }
      ASSERT_EQ(outcome.finished_events, 1) << which << ": every request ends exactly once";
      if (outcome.overloaded_in_queue()) {
        ++refused_in_queue;
        EXPECT_TRUE(outcome.tokens.empty()) << which << ": refused after producing tokens";
        continue;
      }
      ASSERT_TRUE(outcome.completed())
          << which << " ended " << to_string(outcome.end) << ": " << outcome.error.to_string();
      ++completed;
      EXPECT_EQ(outcome.end, RequestEnd::kLength) << which;
      EXPECT_EQ(outcome.tokens, solo_tokens(*model, space, options, pressure_request(i)))
          << which << " (preempted " << outcome.stats.preemptions << " times)";
      EXPECT_EQ(outcome.stats.prompt_tokens, kPromptTokens) << which;
      EXPECT_EQ(outcome.stats.generated_tokens, kMaxTokens) << which;
      if (outcome.stats.preemptions > 0) ++preempted;
      if (outcome.stats.preemptions > 0 && outcome.request.sampling.temperature > 0) {
        ++preempted_seeded;
      }
    }
    // The four running places free and the queue's two hold six: the last two submits found
    // it full (nothing stepped yet).
    EXPECT_EQ(refused_at_submit, kRequests - options.max_queue - options.max_running) << where;
    EXPECT_GE(completed, 1u) << where;
    EXPECT_EQ(completed + refused_at_submit + refused_in_queue, kRequests) << where;
    EXPECT_GE(preempted, 1u) << where << ": four sequences in six windows never preempted";
    EXPECT_GE(preempted_seeded, 1u) << where << ": no sampled request was preempted";

    const EngineStats stats = rig->engine().stats();
    EXPECT_GT(stats.preemptions, 0u) << where;
    EXPECT_GE(stats.preemptions, preempted) << where;
    EXPECT_EQ(stats.refused_overloaded, refused_at_submit + refused_in_queue) << where;
    EXPECT_EQ(stats.running, 0u) << where;
    EXPECT_EQ(stats.waiting, 0u) << where;
    EXPECT_EQ(rig->kv().arena().stats().active_slots, 0u) << where;
    rig->expect_ledger_returns(where);
  }
}

// A queue that may wait 50 ms, one running seat taken for many steps and the requests behind
// it left waiting longer: they are refused as overloaded with a retry estimate, the running
// one is untouched, and the engine takes new work afterwards.
TEST(EnginePressure, QueueWaitBoundRefusesAsOverloaded) {
  auto model = small_step_llama();
  ASSERT_NE(model, nullptr);
  EngineOptions options;
  options.max_running = 1;
  options.max_queue_wait = std::chrono::milliseconds(50);
  const KvSpaceOptions space = tight_space(64);
  auto rig = EngineRig::make(*model, space, options);
  ASSERT_NE(rig, nullptr);

  const std::size_t first = rig->submit(pressure_request(0));
  ASSERT_TRUE(rig->outcome(first).submit_status.ok());
  auto stepped = rig->engine().step();  // the first request takes the only running seat
  ASSERT_TRUE(stepped.ok()) << stepped.status().to_string();
  std::vector<std::size_t> late;
  for (std::uint64_t i = 1; i <= 3; ++i) late.push_back(rig->submit(pressure_request(i)));
  std::this_thread::sleep_for(std::chrono::milliseconds(120));  // past the wait bound
  const Status run = rig->run();
  ASSERT_TRUE(run.ok()) << run.to_string();

  const Outcome& running = rig->outcome(first);
  ASSERT_TRUE(running.completed()) << running.error.to_string();
  EXPECT_EQ(running.tokens, solo_tokens(*model, space, options, pressure_request(0)));
  for (const std::size_t i : late) {
    const Outcome& outcome = rig->outcome(i);
    const std::string which = "late request " + std::to_string(i);
    ASSERT_TRUE(outcome.submit_status.ok()) << which << ": " << outcome.submit_status.to_string();
    ASSERT_EQ(outcome.finished_events, 1) << which;
    EXPECT_EQ(outcome.end, RequestEnd::kError) << which;
    EXPECT_FALSE(outcome.error.ok()) << which;
    EXPECT_TRUE(mentions_overloaded(outcome.error)) << which << ": " << outcome.error.to_string();
    EXPECT_GT(outcome.retry_after_seconds, 0.0) << which;
    EXPECT_TRUE(outcome.tokens.empty()) << which;
  }
  EngineStats stats = rig->engine().stats();
  EXPECT_EQ(stats.refused_overloaded, late.size());
  EXPECT_EQ(stats.waiting, 0u);
  EXPECT_EQ(stats.running, 0u);
  EXPECT_EQ(rig->kv().arena().stats().active_slots, 0u);

  // Nothing is stuck: a request submitted now is admitted at once and completes.
  const std::size_t after = rig->submit(pressure_request(4));
  ASSERT_TRUE(rig->run().ok());
  ASSERT_TRUE(rig->outcome(after).completed()) << rig->outcome(after).error.to_string();
  EXPECT_EQ(rig->outcome(after).tokens, solo_tokens(*model, space, options, pressure_request(4)));
  rig->expect_ledger_returns("after the queue-wait refusals");
}

// Preempted requests wait in the queue again, here longer than max_queue_wait (every event
// takes 2 ms, so a step with four takes longer than the bound): the wait bound never refuses
// one whose answer has started; only requests never admitted may be refused.
TEST(EnginePressure, APreemptedRequestIsNeverRefusedForItsWait) {
  auto model = small_step_llama();
  ASSERT_NE(model, nullptr);
  EngineOptions options;
  options.max_running = 4;
  options.max_queue_wait = std::chrono::milliseconds(10);
  const KvSpaceOptions space = tight_space(6);
  auto rig = EngineRig::make(*model, space, options);
  ASSERT_NE(rig, nullptr);
  constexpr std::uint64_t kRequests = 4;
  std::vector<Outcome> seen(kRequests);
  for (std::uint64_t i = 0; i < kRequests; ++i) {
    auto id = rig->engine().submit(pressure_request(i), [&seen, i](const RequestEvent& event) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
      record(seen[i], event);
    });
    ASSERT_TRUE(id.ok()) << id.status().to_string();
  }
  ASSERT_TRUE(rig->run().ok());
  std::uint32_t preempted = 0;
  for (std::uint64_t i = 0; i < kRequests; ++i) {
    const Outcome& o = seen[i];
    ASSERT_EQ(o.finished_events, 1) << i;
    if (o.end == RequestEnd::kError) {
      EXPECT_TRUE(o.tokens.empty()) << i << ": refused after its answer started";
      EXPECT_EQ(o.stats.preemptions, 0u) << i << ": refused after it was preempted";
      EXPECT_TRUE(mentions_overloaded(o.error)) << i << ": " << o.error.to_string();
      continue;
    }
    EXPECT_EQ(o.end, RequestEnd::kLength) << i;
    EXPECT_EQ(o.tokens, solo_tokens(*model, space, options, pressure_request(i))) << i;
    if (o.stats.preemptions > 0) ++preempted;
  }
  EXPECT_GE(preempted, 1u) << "nothing was preempted: the test proves nothing";
  EXPECT_EQ(rig->kv().arena().stats().active_slots, 0u);
}

// Cancelling everything once preemption started: running, preempted and never-admitted
// requests alike end exactly once (cancelled, unless already finished) and every slot and
// byte goes back.
TEST(EnginePressure, CancellingDuringPreemptionFreesEverything) {
  auto model = small_step_llama();
  ASSERT_NE(model, nullptr);
  EngineOptions options;
  options.max_running = 4;
  auto rig = EngineRig::make(*model, tight_space(6), options);
  ASSERT_NE(rig, nullptr);
  constexpr std::uint64_t kRequests = 6;
  for (std::uint64_t i = 0; i < kRequests; ++i) rig->submit(pressure_request(i));
  for (int steps = 0; rig->engine().stats().preemptions == 0; ++steps) {
    ASSERT_LT(steps, 200) << "no preemption to cancel during";
    auto stepped = rig->engine().step();
    ASSERT_TRUE(stepped.ok()) << stepped.status().to_string();
  }
  for (const Outcome& outcome : rig->outcomes()) rig->engine().cancel(outcome.id);
  ASSERT_TRUE(rig->run().ok());
  std::uint64_t cancelled = 0;
  for (std::uint64_t i = 0; i < kRequests; ++i) {
    const Outcome& outcome = rig->outcome(i);
    ASSERT_EQ(outcome.finished_events, 1) << i;
    if (outcome.end == RequestEnd::kCancelled) {
      ++cancelled;
    } else {
      EXPECT_TRUE(outcome.completed()) << i << ": " << outcome.error.to_string();
    }
  }
  EXPECT_GE(cancelled, 2u);
  EXPECT_EQ(rig->engine().stats().cancelled, cancelled);
  EXPECT_EQ(rig->kv().arena().stats().active_slots, 0u);
  rig->expect_ledger_returns("after cancelling during preemption");
}

// A request that cannot fit even alone (40 tokens, five windows, in a budget of three) among
// small ones: it ends with an error after the others were preempted for it in vain, with the
// tokens it produced a prefix of its answer alone; the small ones complete as alone, and the
// engine neither hangs nor leaks.
TEST(EnginePressure, ARequestThatCannotFitAloneEndsWithAnErrorAndTheOthersFinish) {
  auto model = small_step_llama();
  ASSERT_NE(model, nullptr);
  EngineOptions options;
  options.max_running = 3;
  const KvSpaceOptions space = tight_space(3);
  auto rig = EngineRig::make(*model, space, options);
  ASSERT_NE(rig, nullptr);
  EngineRequest big = pressure_request(0);
  big.max_tokens = 30;
  std::vector<EngineRequest> small;
  for (std::uint64_t i = 1; i <= 2; ++i) {
    EngineRequest r = pressure_request(i);
    r.prompt.resize(6);
    r.max_tokens = 8;
    small.push_back(r);
  }
  const std::size_t big_index = rig->submit(big);
  for (const EngineRequest& r : small) rig->submit(r);
  int steps = 0;
  for (bool more = true; more; ++steps) {
    ASSERT_LT(steps, 1000) << "the engine does not come to rest";
    auto stepped = rig->engine().step();
    ASSERT_TRUE(stepped.ok()) << stepped.status().to_string();
    more = *stepped;
  }

  const Outcome& failed = rig->outcome(big_index);
  ASSERT_EQ(failed.finished_events, 1);
  EXPECT_EQ(failed.end, RequestEnd::kError);
  EXPECT_EQ(failed.error.code(), StatusCode::kResourceExhausted) << failed.error.to_string();
  const std::vector<std::int32_t> whole = solo_tokens(*model, space, options, big);
  ASSERT_LE(failed.tokens.size(), whole.size());
  EXPECT_TRUE(std::equal(failed.tokens.begin(), failed.tokens.end(), whole.begin()))
      << "the tokens it produced before failing are not its answer's";
  for (std::size_t i = 0; i < small.size(); ++i) {
    const Outcome& outcome = rig->outcome(big_index + 1 + i);
    ASSERT_TRUE(outcome.completed()) << "small request " << i << ": " << outcome.error.to_string();
    EXPECT_EQ(outcome.tokens, solo_tokens(*model, space, options, small[i])) << i;
  }
  EXPECT_EQ(rig->engine().stats().failed, 1u);
  rig->expect_ledger_returns("after the oversized request");
}

// The engine's own thread under the same pressure, fed by two threads at once: the answers
// are those of each request alone, whatever the interleaving (and TSan sees every access).
TEST(EnginePressure, TwoSubmittingThreadsUnderPressureGetTheAnswersAlone) {
  auto model = small_step_llama();
  ASSERT_NE(model, nullptr);
  EngineOptions options;
  options.max_running = 4;
  const KvSpaceOptions space = tight_space(6);
  auto rig = EngineRig::make(*model, space, options);
  ASSERT_NE(rig, nullptr);
  ASSERT_TRUE(rig->engine().start().ok());

  constexpr std::uint64_t kPerThread = 3;
  std::mutex mutex;  // the callbacks run on the engine's thread, the checks on this one
  std::vector<Outcome> seen(2 * kPerThread);
  auto feed = [&](std::uint64_t first) {
    for (std::uint64_t i = first; i < first + kPerThread; ++i) {
      auto id = rig->engine().submit(pressure_request(i), [&, i](const RequestEvent& event) {
        std::lock_guard lock(mutex);
        record(seen[i], event);
      });
      std::lock_guard lock(mutex);
      seen[i].submit_status = id.status();
    }
  };
  std::thread a(feed, 0), b(feed, kPerThread);
  a.join();
  b.join();
  EXPECT_TRUE(rig->engine().drain(std::chrono::seconds(60))) << "not drained in a minute";
  const EngineStats stats = rig->engine().stats();
  rig->end_engine();

  std::lock_guard lock(mutex);
  for (std::uint64_t i = 0; i < seen.size(); ++i) {
    ASSERT_TRUE(seen[i].submit_status.ok()) << i << ": " << seen[i].submit_status.to_string();
    ASSERT_EQ(seen[i].finished_events, 1) << i;
    EXPECT_EQ(seen[i].end, RequestEnd::kLength) << i;
    EXPECT_EQ(seen[i].tokens, solo_tokens(*model, space, options, pressure_request(i))) << i;
  }
  EXPECT_EQ(stats.finished, seen.size());
  EXPECT_GT(stats.preemptions, 0u) << "six requests in six windows never preempted";
  EXPECT_EQ(rig->kv().arena().stats().active_slots, 0u);
}

}  // namespace
}  // namespace kvvm::engine
