// Overload end to end: `kvvm bench serve` far above capacity against a server whose KV budget
// holds only a few sequences, with requests of known prompts sent at the same moment. Every
// refusal is a 429 with Retry-After, nothing is answered 5xx, every admitted request's answer
// equals the one it gets alone on the idle server (preempted or not), and once drained the KV
// space's ledger is back to zero.
#include <gtest/gtest.h>
#include <httplib.h>

#include <chrono>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "app.h"
#include "support/cli_run.h"
#include "support/engine_harness.h"
#include "support/prometheus_text.h"
#include "support/server_rig.h"
#include "support/test_data.h"

namespace kvvm::server {
namespace {

using nlohmann::json;
using testing::post_json;
using testing::RigOptions;
using testing::ServerRig;

struct Answer {
  int status = -1;  // -1: no response
  std::string retry_after;
  std::string text;
  std::string body;
};

// The text of a completion, whole or streamed.
std::string text_of(const std::string& body, bool streamed) {
  if (!streamed) {
    const json parsed = json::parse(body, nullptr, false);
    if (parsed.is_discarded() || !parsed.contains("choices")) return "<no choices>";
    return parsed["choices"][0]["text"].get<std::string>();
  }
  std::string text;
  for (const json& event : testing::sse_events(body)) {
    if (event.contains("choices") && !event["choices"].empty()) {
      text += event["choices"][0]["text"].get<std::string>();
    }
  }
  return text;
}

Answer ask(const ServerRig& rig, const std::string& prompt, int seed, bool streamed) {
  const json request = {{"model", "llama-tiny"}, {"prompt", prompt}, {"max_tokens", 24},
                        {"temperature", 0.8},    {"seed", seed},     {"stream", streamed}};
  auto client = rig.client(std::chrono::seconds(30));
  Answer answer;
  const auto result = post_json(client, "/v1/completions", request.dump());
  if (!result) return answer;
  answer.status = result->status;
  answer.retry_after = result->get_header_value("Retry-After");
  answer.body = result->body;
  if (answer.status == 200) answer.text = text_of(result->body, streamed);
  return answer;
}

TEST(ServerPressure, BenchFarAboveCapacityUnderASmallKvBudget) {
  RigOptions rig_options;
  rig_options.slots = 8;
  rig_options.context = 64;
  // llama-tiny's KV is 2 KiB per token in float32: 160 KiB holds 80 tokens, about three of
  // these sequences, while eight slots would admit eight. The longest (64 tokens) fits alone.
  rig_options.budget_bytes = std::uint64_t{160} << 10;
  rig_options.engine.max_queue = 3;
  rig_options.engine.max_queue_wait = std::chrono::seconds(5);
  ServerOptions options;
  options.model_name = "llama-tiny";
  auto rig = ServerRig::make(test::model_fixture_dir("llama-tiny"), options, rig_options);
  ASSERT_NE(rig, nullptr);
  const std::string url = "http://127.0.0.1:" + std::to_string(rig->port());

  const std::vector<std::string> prompts = {"The quick brown fox", "Once upon a time",
                                            "hello world",         "In the beginning",
                                            "A B C D E F",         "kvvm maps pages"};
  std::vector<Answer> answers(prompts.size());
  test::CliRun bench;
  {
    // 48 requests arriving at 400/s from the bench (two tenants' system prompts, token ids
    // of the whole vocabulary: many times what the budget runs at once and the queue holds)
    // and six of ours at its start.
    std::thread bench_thread([&] {
      const std::vector<std::string> args = {"bench",
                                             "serve",
                                             "--url",
                                             url,
                                             "--rate=400",
                                             "--requests=48",
                                             "--tenants=2",
                                             "--system-prompt-tokens=8",
                                             "--prompt-mean=6",
                                             "--output-mean=12",
                                             "--max-context=64",
                                             "--vocab=1024",
                                             "--timeout=30",
                                             "--json"};
      bench = test::run(args);
    });
    std::vector<std::thread> own;
    for (std::size_t i = 0; i < prompts.size(); ++i) {
      own.emplace_back([&, i] {
        answers[i] = ask(*rig, prompts[i], static_cast<int>(i), /*streamed=*/i % 2 == 1);
      });
    }
    for (std::thread& thread : own) thread.join();
    bench_thread.join();
  }

  ASSERT_EQ(bench.code, 0) << bench.err;
  const json report = json::parse(bench.out, nullptr, false);
  ASSERT_FALSE(report.is_discarded()) << bench.out;
  const json& run = report["runs"][0];
  EXPECT_EQ(run["sent"], 48) << run.dump();
  // The bench counts a 429 without Retry-After, any other status and a cut connection as
  // errors: none may occur.
  EXPECT_EQ(run["errors"]["total"], 0) << run.dump();
  EXPECT_GE(run["rejected_429"].get<int>(), 1) << run.dump();
  EXPECT_EQ(run["completed"].get<int>() + run["rejected_429"].get<int>(), 48) << run.dump();

  // Ours: a 200 or a 429 with Retry-After; a 200's answer equals its solo run.
  int admitted = 0;
  for (std::size_t i = 0; i < prompts.size(); ++i) {
    const Answer& answer = answers[i];
    SCOPED_TRACE(prompts[i]);
    ASSERT_TRUE(answer.status == 200 || answer.status == 429) << answer.status << answer.body;
    if (answer.status == 429) {
      ASSERT_FALSE(answer.retry_after.empty()) << answer.body;
      EXPECT_GE(std::stoi(answer.retry_after), 1);
      continue;
    }
    ++admitted;
    const Answer solo = ask(*rig, prompts[i], static_cast<int>(i), /*streamed=*/false);
    ASSERT_EQ(solo.status, 200) << solo.body;
    EXPECT_EQ(answer.text, solo.text);
  }
  // Someone was served: the first request to arrive found the queue empty.
  EXPECT_GE(admitted + run["completed"].get<int>(), 1) << run.dump();

  // The budget was what bound: the arena refused some admission or growth, and the answers
  // above were still whole.
  EXPECT_GT(rig->kv().arena().stats().refusals, 0u);
  // No response at or above 500 was sent to anyone.
  auto client = rig->client();
  const auto metrics = client.Get("/metrics");
  ASSERT_TRUE(metrics);
  const test::PromParse parsed = test::parse_prometheus_text(metrics->body);
  ASSERT_TRUE(parsed.ok()) << parsed.error;
  const test::PromFamily* responses =
      test::find_family(parsed.families, "kvvm_http_responses_total");
  ASSERT_NE(responses, nullptr);
  double answered_429 = 0;
  for (const auto& sample : responses->samples) {
    const int status = std::stoi(sample.labels.at("status"));
    EXPECT_LT(status, 500) << sample.labels.at("endpoint") << " " << sample.value;
    if (status == 429) answered_429 += sample.value;
  }
  EXPECT_GE(answered_429, run["rejected_429"].get<double>());

  EXPECT_TRUE(rig->shut_down());
  rig->end_engine();
  engine::testing::expect_clean(rig->kv(), "after the drain");
}

}  // namespace
}  // namespace kvvm::server
