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

TEST(CliSpeculative, ServeAnswersAsGenerateAndCountsTheProposals) {
  const Json plain = generate({});
  ASSERT_FALSE(plain.is_null());
  ServeOptions options;
  options.model_dir = test::model_fixture_dir("llama-tiny");
  options.port = 0;
  options.backend = "cpu";
  options.max_running = 2;
  options.http_threads = 4;
  options.speculative_config = kLookup;
  ShutdownRequest shutdown;
  std::ostringstream out, err;
  int code = -1;
  std::thread serving([&] { code = run_serve(options, out, err, shutdown); });
  const std::optional<std::uint16_t> port = shutdown.wait_ready(std::chrono::seconds(20));
  std::string completion, metrics;
  if (port) {
    httplib::Client client("127.0.0.1", *port);
    client.set_read_timeout(std::chrono::seconds(20));
    const std::string body = R"({"model": "llama-tiny", "prompt": [)" + kPrompt +
                             R"(], "max_tokens": 60, "temperature": 0, "ignore_eos": true})";
    auto answered = client.Post("/v1/completions", body, "application/json");
    if (answered && answered->status == 200) completion = answered->body;
    auto scraped = client.Get("/metrics");
    if (scraped && scraped->status == 200) metrics = scraped->body;
  }
  shutdown.request("test");
  serving.join();
  ASSERT_TRUE(port.has_value()) << err.str();
  EXPECT_EQ(code, 0) << err.str();
  ASSERT_FALSE(completion.empty()) << err.str();
  const Json answer = Json::parse(completion);
  EXPECT_EQ(answer["choices"][0]["text"], plain["text"]);
  EXPECT_EQ(answer["usage"]["completion_tokens"], 60);
  // Accepted tokens were counted: a line of the counter with a value other than 0.
  const std::string name = "vllm:spec_decode_num_accepted_tokens_total{";
  const std::size_t at = metrics.find(name);
  ASSERT_NE(at, std::string::npos) << metrics;
  const std::size_t value = metrics.find("} ", at);
  ASSERT_NE(value, std::string::npos);
  EXPECT_GT(std::stod(metrics.substr(value + 2)), 0.0) << metrics.substr(at, 200);
}

}  // namespace
}  // namespace kvvm::cli
