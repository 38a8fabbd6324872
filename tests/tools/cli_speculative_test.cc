// --speculative-config from the command line: `kvvm generate` gives plain decoding's tokens in
// fewer steps, `kvvm serve` answers as `kvvm generate` does and counts the proposals in
// /metrics, and a bad config is refused naming the key before a model is loaded.
#include <gtest/gtest.h>
#include <httplib.h>

#include <chrono>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "commands/serve_command.h"
#include "kit/cli_common.h"
#include "support/cli_run.h"
#include "support/test_data.h"

namespace kvvm::cli {
namespace {

using Json = nlohmann::json;
using test::contains;
using test::run;

// Repeats itself, so prompt lookup proposes from the first steps; llama-tiny's answer to it
// repeats too, so proposals are kept.
const std::string kPrompt =
    "269,293,290,288,297,268,259,287,269,293,290,288,297,268,259,287,269,293";
const std::string kLookup =
    R"({"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1, "prompt_lookup_max": 3})";

// A draft model's --speculative-config: the fixture `name` proposing 3 tokens a step.
std::string draft_config(const std::string& name) {
  return R"({"model": ")" + test::model_fixture_dir(name) + R"(", "num_speculative_tokens": 3})";
}

Json generate(const std::vector<std::string>& extra) {
  std::vector<std::string> args = {
      "generate",     "--model",      test::model_fixture_dir("llama-tiny"),
      "--prompt-ids", kPrompt,        "--max-tokens",
      "60",           "--ignore-eos", "--backend",
      "cpu",          "--json"};
  args.insert(args.end(), extra.begin(), extra.end());
  const test::CliRun r = run(args);
  EXPECT_EQ(r.code, kExitOk) << r.err;
  return r.code == kExitOk ? Json::parse(r.out) : Json();
}

TEST(CliSpeculative, GenerateGivesPlainDecodingsTokensInFewerSteps) {
  const Json plain = generate({});
  const Json spec = generate({"--speculative-config", kLookup});
  ASSERT_FALSE(plain.is_null());
  ASSERT_FALSE(spec.is_null());
  EXPECT_EQ(spec["token_ids"], plain["token_ids"]);
  EXPECT_FALSE(plain.contains("speculative"));
  ASSERT_TRUE(spec.contains("speculative"));
  EXPECT_GT(spec["speculative"]["accepted_tokens"].get<int>(), 0);
  EXPECT_EQ(spec["timings"]["decode_tokens"], 59);
  EXPECT_EQ(plain["timings"]["decode_steps"], 59);
  EXPECT_LT(spec["timings"]["decode_steps"].get<int>(), 59);
}

TEST(CliSpeculative, ABadConfigIsRefusedNamingTheKey) {
  const std::string model = test::model_fixture_dir("llama-tiny");
  for (const char* command : {"generate", "serve"}) {
    for (const auto& [config, named] : std::vector<std::pair<std::string, std::string>>{
             {R"({"method": "eagle", "num_speculative_tokens": 3})", "eagle"},
             {R"({"method": "ngram", "num_speculative_tokens": 3, "k": 1})", "\"k\""},
             {"ngram", "--speculative-config"}}) {
      const test::CliRun r =
          run({command, "--model", model, "--prompt-ids", "1,2", "--speculative-config", config});
      if (std::string(command) == "serve" && r.code == 2 && contains(r.err, "--prompt-ids")) {
        // serve has no --prompt-ids: ask again without it.
        const test::CliRun s = run({command, "--model", model, "--speculative-config", config});
        EXPECT_EQ(s.code, 2) << config << ": " << s.err;
        EXPECT_TRUE(contains(s.err, named)) << s.err;
        continue;
      }
      EXPECT_EQ(r.code, 2) << command << " " << config << ": " << r.err;
      EXPECT_TRUE(contains(r.err, named)) << r.err;
    }
  }
}

// One completion from `kvvm serve` speculating as `config` says, then its /metrics.
struct Served {
  int code = -1;
  std::string err, completion, metrics;
  bool ready = false;
};

Served serve_once(const std::string& config) {
  ServeOptions options;
  options.model_dir = test::model_fixture_dir("llama-tiny");
  options.port = 0;
  options.backend = "cpu";
  options.max_running = 2;
  options.http_threads = 4;
  options.speculative_config = config;
  ShutdownRequest shutdown;
  std::ostringstream out, err;
  Served served;
  std::thread serving([&] { served.code = run_serve(options, out, err, shutdown); });
  const std::optional<std::uint16_t> port = shutdown.wait_ready(std::chrono::seconds(20));
  if (port) {
    served.ready = true;
    httplib::Client client("127.0.0.1", *port);
    client.set_read_timeout(std::chrono::seconds(20));
    const std::string body = R"({"model": "llama-tiny", "prompt": [)" + kPrompt +
                             R"(], "max_tokens": 60, "temperature": 0, "ignore_eos": true})";
    auto answered = client.Post("/v1/completions", body, "application/json");
    if (answered && answered->status == 200) served.completion = answered->body;
    auto scraped = client.Get("/metrics");
    if (scraped && scraped->status == 200) served.metrics = scraped->body;
  }
  shutdown.request("test");
  serving.join();
  served.err = err.str();
  return served;
}

// The value of the first line of counter `name` in a Prometheus text.
double counter_value(const std::string& metrics, const std::string& name) {
  const std::size_t at = metrics.find(name + "{");
  if (at == std::string::npos) return -1;
  const std::size_t value = metrics.find("} ", at);
  return value == std::string::npos ? -1 : std::stod(metrics.substr(value + 2));
}

TEST(CliSpeculative, ServeAnswersAsGenerateAndCountsTheProposals) {
  const Json plain = generate({});
  ASSERT_FALSE(plain.is_null());
  for (const std::string& config : {kLookup, draft_config("mixtral-tiny")}) {
    const Served served = serve_once(config);
    ASSERT_TRUE(served.ready) << served.err;
    EXPECT_EQ(served.code, 0) << served.err;
    ASSERT_FALSE(served.completion.empty()) << served.err;
    const Json answer = Json::parse(served.completion);
    EXPECT_EQ(answer["choices"][0]["text"], plain["text"]) << config;
    EXPECT_EQ(answer["usage"]["completion_tokens"], 60) << config;
    // Proposals were made and some kept: counters with values other than 0.
    EXPECT_GT(counter_value(served.metrics, "vllm:spec_decode_num_draft_tokens_total"), 0.0)
        << config << "\n"
        << served.metrics;
    EXPECT_GT(counter_value(served.metrics, "vllm:spec_decode_num_accepted_tokens_total"), 0.0)
        << config << "\n"
        << served.metrics;
  }
}

TEST(CliSpeculative, GenerateWithADraftModelGivesPlainDecodingsTokens) {
  const Json plain = generate({});
  ASSERT_FALSE(plain.is_null());
  for (const char* draft : {"mixtral-tiny", "llama-tiny"}) {
    const Json spec = generate({"--speculative-config", draft_config(draft)});
    ASSERT_FALSE(spec.is_null()) << draft;
    EXPECT_EQ(spec["token_ids"], plain["token_ids"]) << draft;
    ASSERT_TRUE(spec.contains("speculative")) << draft;
    EXPECT_GT(spec["speculative"]["draft_tokens"].get<int>(), 0) << draft;
    EXPECT_GT(spec["speculative"]["accepted_tokens"].get<int>(), 0) << draft;
    EXPECT_EQ(spec["timings"]["decode_tokens"], 59) << draft;
    if (std::string(draft) == "llama-tiny") {
      // Its own draft: three of every four tokens come from kept proposals.
      EXPECT_LE(spec["timings"]["decode_steps"].get<int>(), 59 / 4 + 3);
    }
  }
}

TEST(CliSpeculative, ADraftModelItCannotUseIsNamed) {
  const std::string missing = ::testing::TempDir() + "/no-such-draft";
  for (const auto& [config, named] : std::vector<std::pair<std::string, std::string>>{
           {R"({"model": ")" + missing + R"(", "num_speculative_tokens": 3})", missing},
           // qwen3-tiny's vocabulary is 676 tokens, llama-tiny's 1024.
           {draft_config("qwen3-tiny"), "vocab_size 676, the model's is 1024"}}) {
    const test::CliRun r =
        run({"generate", "--model", test::model_fixture_dir("llama-tiny"), "--prompt-ids", "1,2",
             "--backend", "cpu", "--speculative-config", config});
    EXPECT_EQ(r.code, 2) << config << ": " << r.err;
    EXPECT_TRUE(contains(r.err, named)) << r.err;
    EXPECT_TRUE(contains(r.err, "--speculative-config \"model\"")) << r.err;
  }
}

}  // namespace
}  // namespace kvvm::cli
