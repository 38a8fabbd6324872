// ServerMetrics' exposition text, read back with the strict parser in
// support/prometheus_text.h; and the parser itself, which must reject what a scraper rejects.
#include <gtest/gtest.h>

#include <cmath>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "server/metrics.h"
#include "support/prometheus_text.h"

namespace kvvm::server {
namespace {

using test::find_family;
using test::parse_prometheus_text;
using test::PromFamily;
using test::PromLabels;
using test::value;

ServerMetrics::Inputs made_up_inputs() {
  ServerMetrics::Inputs in;
  in.model_name = "tiny";
  in.engine.running = 3;
  in.engine.waiting = 5;
  in.engine.kv_usage = 0.9;  // not what the gauge shows: it is computed from the bytes below
  in.engine.prefix.queries = 1000;
  in.engine.prefix.hits = 640;
  in.engine.prompt_tokens = 12345;
  in.engine.generated_tokens = 6789;
  in.engine.preemptions = 7;
  in.engine.spec_drafts = 31;
  in.engine.spec_draft_tokens = 120;
  in.engine.spec_accepted_tokens = 77;
  in.engine.refused_overloaded = 30;  // 4 for a full queue
  in.engine.refused_predicted_wait = 23;
  in.engine.refused_in_queue = 3;
  in.engine.wait_margin = 2.5;
  in.engine.arena.committed_bytes = 3ull << 30;
  in.engine.arena.physical_bytes = 2ull << 30;
  in.engine.arena.reclaimable_bytes = 1ull << 29;
  in.engine.arena.ensures_committing = 40;
  in.engine.arena.ahead_commits = 2;
  in.engine.arena.reclaimed_bytes = 9007199254740993ull;  // 2^53 + 1: not exact as a double
  in.tier.limit = 8ull << 30;
  in.weights.physical_bytes = 5ull << 30;
  in.weights.split.streamed_bytes_per_step = 7ull << 29;
  in.weights.split.streamed_layers = 11;
  for (std::size_t i = 0; i < kDriverOpCount; ++i) {
    in.driver.calls[i] = 100 + i;
    in.driver.nanoseconds[i] = 250'000'000 * (i + 1);  // a quarter second per op index
  }
  in.draining = true;
  in.cache.layout = "head-major";
  in.cache.cache_dtype = "bf16";
  in.cache.granule_bytes = 2ull << 20;
  in.cache.num_slots = 65;
  in.cache.max_context = 8192;
  in.cache.prefix_caching = true;
  in.cache.blocks = {16, 4096};
  return in;
}

std::vector<PromFamily> parsed(const std::string& text) {
  test::PromParse result = parse_prometheus_text(text);
  EXPECT_TRUE(result.ok()) << result.error << "\n" << text;
  return result.families;
}

const PromLabels kModel = {{"model_name", "tiny"}};

TEST(ServerMetrics, EveryVllmNameIsPresentWithItsTypeAndModelName) {
  ServerMetrics metrics;
  const auto families = parsed(metrics.render(made_up_inputs()));
  const std::vector<std::pair<std::string, std::string>> expected = {
      {"vllm:num_requests_running", "gauge"},
      {"vllm:num_requests_waiting", "gauge"},
      {"vllm:kv_cache_usage_perc", "gauge"},
      {"vllm:prefix_cache_queries_total", "counter"},
      {"vllm:prefix_cache_hits_total", "counter"},
      {"vllm:prompt_tokens_total", "counter"},
      {"vllm:generation_tokens_total", "counter"},
      {"vllm:num_preemptions_total", "counter"},
      {"vllm:spec_decode_num_drafts_total", "counter"},
      {"vllm:spec_decode_num_draft_tokens_total", "counter"},
      {"vllm:spec_decode_num_accepted_tokens_total", "counter"},
      {"vllm:request_success_total", "counter"},
      {"vllm:time_to_first_token_seconds", "histogram"},
      {"vllm:time_per_output_token_seconds", "histogram"},
      {"vllm:inter_token_latency_seconds", "histogram"},
      {"vllm:cache_config_info", "gauge"},
      {"vllm:e2e_request_latency_seconds", "histogram"},
      {"vllm:request_queue_time_seconds", "histogram"},
      {"vllm:request_prefill_time_seconds", "histogram"},
      {"vllm:request_decode_time_seconds", "histogram"},
      {"vllm:request_params_n", "histogram"},
      {"vllm:request_prompt_tokens", "histogram"},
      {"vllm:request_generation_tokens", "histogram"},
      {"vllm:iteration_tokens_total", "histogram"},
  };
  for (const auto& [name, type] : expected) {
    const PromFamily* family = find_family(families, name);
    ASSERT_NE(family, nullptr) << name;
    EXPECT_EQ(family->type, type) << name;
    EXPECT_FALSE(family->help.empty()) << name;
    ASSERT_FALSE(family->samples.empty()) << name;
    for (const auto& sample : family->samples) {
      EXPECT_EQ(sample.labels.count("model_name"), 1u) << sample.name;
      EXPECT_EQ(sample.labels.at("model_name"), "tiny") << sample.name;
    }
  }
  for (const PromFamily& family : families) {
    if (family.type == "counter") {
      EXPECT_TRUE(family.name.ends_with("_total")) << family.name;
    }
  }
}

TEST(ServerMetrics, CountersAndGaugesEqualTheInputs) {
  ServerMetrics metrics;
  const ServerMetrics::Inputs in = made_up_inputs();
  const std::string text = metrics.render(in);
  const auto families = parsed(text);
  EXPECT_EQ(value(families, "vllm:num_requests_running", kModel), 3);
  EXPECT_EQ(value(families, "vllm:num_requests_waiting", kModel), 5);
  // (physical - reclaimable) / budget = (2 GiB - 0.5 GiB) / 8 GiB, from the byte gauges.
  EXPECT_EQ(value(families, "vllm:kv_cache_usage_perc", kModel), 0.1875);
  EXPECT_EQ(value(families, "kvvm_kv_reclaimable_bytes", {}), double(1ull << 29));
  EXPECT_EQ(value(families, "vllm:prefix_cache_queries_total", kModel), 1000);
  EXPECT_EQ(value(families, "vllm:prefix_cache_hits_total", kModel), 640);
  EXPECT_EQ(value(families, "vllm:prompt_tokens_total", kModel), 12345);
  EXPECT_EQ(value(families, "vllm:generation_tokens_total", kModel), 6789);
  EXPECT_EQ(value(families, "vllm:num_preemptions_total", kModel), 7);
  EXPECT_EQ(value(families, "vllm:spec_decode_num_drafts_total", kModel), 31);
  EXPECT_EQ(value(families, "vllm:spec_decode_num_draft_tokens_total", kModel), 120);
  EXPECT_EQ(value(families, "vllm:spec_decode_num_accepted_tokens_total", kModel), 77);
  EXPECT_EQ(value(families, "kvvm_kv_committed_bytes", {}), double(3ull << 30));
  EXPECT_EQ(value(families, "kvvm_kv_physical_bytes", {}), double(2ull << 30));
  EXPECT_EQ(value(families, "kvvm_kv_budget_bytes", {}), double(8ull << 30));
  EXPECT_EQ(value(families, "kvvm_kv_commits_total", {}), 42);
  EXPECT_EQ(value(families, "kvvm_weights_resident_bytes", {}), double(5ull << 30));
  EXPECT_EQ(value(families, "kvvm_weights_streamed_bytes_per_step", {}), double(7ull << 29));
  EXPECT_EQ(value(families, "kvvm_weights_streamed_layers", {}), 11);
  EXPECT_EQ(value(families, "kvvm_draining", {}), 1);
  EXPECT_EQ(value(families, "kvvm_engine_overloaded_total", {{"when", "full_queue"}}), 4);
  EXPECT_EQ(value(families, "kvvm_engine_overloaded_total", {{"when", "predicted_wait"}}), 23);
  EXPECT_EQ(value(families, "kvvm_engine_overloaded_total", {{"when", "in_queue"}}), 3);
  EXPECT_EQ(value(families, "kvvm_queue_wait_margin", {}), 2.5);
  // Integers are printed exactly, not through a double.
  EXPECT_NE(text.find("\nkvvm_kv_reclaimed_bytes_total 9007199254740993\n"), std::string::npos)
      << text;
  for (std::size_t i = 0; i < kDriverOpCount; ++i) {
    const std::string op(to_string(static_cast<DriverOp>(i)));
    EXPECT_EQ(value(families, "kvvm_driver_calls_total", {{"op", op}}), double(100 + i)) << op;
  }
  EXPECT_EQ(find_family(families, "kvvm_driver_calls_total")->samples.size(), kDriverOpCount);
  for (std::size_t i = 0; i < kDriverOpCount; ++i) {
    const std::string op(to_string(static_cast<DriverOp>(i)));
    EXPECT_EQ(value(families, "kvvm_driver_seconds_total", {{"op", op}}), 0.25 * double(i + 1))
        << op;
  }
  // Nothing counted yet: the fixed label sets are there at 0.
  EXPECT_EQ(value(families, "vllm:request_success_total",
                  {{"model_name", "tiny"}, {"finished_reason", "stop"}}),
            0);
  EXPECT_EQ(value(families, "kvvm_requests_refused_total", {{"reason", "overloaded"}}), 0);
  EXPECT_EQ(value(families, "vllm:time_to_first_token_seconds_count", kModel), 0);
}

TEST(ServerMetrics, AnIdleCacheReadsZeroUsage) {
  ServerMetrics metrics;
  ServerMetrics::Inputs in = made_up_inputs();
  in.engine.arena = ArenaStats{};  // nothing mapped (pooled handles are not the arena's)
  const auto families = parsed(metrics.render(in));
  EXPECT_EQ(value(families, "vllm:kv_cache_usage_perc", kModel), 0);
  // Finished sequences' windows kept for reuse are not use either.
  in.engine.arena.physical_bytes = 1ull << 20;
  in.engine.arena.reclaimable_bytes = 1ull << 20;
  EXPECT_EQ(value(parsed(metrics.render(in)), "vllm:kv_cache_usage_perc", kModel), 0);
}

TEST(ServerMetrics, IgnoredFieldsAreCountedByNameWithABoundedLabelSet) {
  ServerMetrics metrics;
  // Each name reported once, for the caller's one log line.
  EXPECT_EQ(metrics.count_ignored_field("store_v2"), std::optional<std::string>("store_v2"));
  EXPECT_EQ(metrics.count_ignored_field("store_v2"), std::nullopt);
  EXPECT_EQ(metrics.count_ignored_field("messages.tool_calls"),
            std::optional<std::string>("messages.tool_calls"));
  // Names a client could use to break the exposition or grow it without end are "other".
  EXPECT_EQ(metrics.count_ignored_field("a\"b\nc"), std::optional<std::string>("other"));
  EXPECT_EQ(metrics.count_ignored_field(std::string(65, 'x')), std::nullopt);
  EXPECT_EQ(metrics.count_ignored_field(""), std::nullopt);
  for (std::size_t i = 0; i < 2 * ServerMetrics::kMaxIgnoredNames; ++i) {
    metrics.count_ignored_field("field_" + std::to_string(i));
  }
  const auto families = parsed(metrics.render(made_up_inputs()));
  const PromFamily* family = find_family(families, "kvvm_ignored_fields_total");
  ASSERT_NE(family, nullptr);
  EXPECT_EQ(family->type, "counter");
  EXPECT_EQ(family->samples.size(), ServerMetrics::kMaxIgnoredNames);
  EXPECT_EQ(value(families, "kvvm_ignored_fields_total", {{"field", "store_v2"}}), 2);
  // 3 odd names, then the 2 x 64 fields past the 61 that found room.
  EXPECT_EQ(value(families, "kvvm_ignored_fields_total", {{"field", "other"}}),
            3 + 2 * ServerMetrics::kMaxIgnoredNames - 61);
}

TEST(ServerMetrics, ResponsesAndRefusalsAreCounted) {
  ServerMetrics metrics;
  metrics.count_response("/v1/completions", 200);
  metrics.count_response("/v1/completions", 200);
  metrics.count_response("/v1/completions", 429);
  metrics.count_response("other", 404);
  metrics.count_refusal("overloaded");
  metrics.count_refusal("too_large");
  metrics.count_refusal("too_large");
  const auto families = parsed(metrics.render(made_up_inputs()));
  EXPECT_EQ(value(families, "kvvm_http_responses_total",
                  {{"endpoint", "/v1/completions"}, {"status", "200"}}),
            2);
  EXPECT_EQ(value(families, "kvvm_http_responses_total",
                  {{"endpoint", "/v1/completions"}, {"status", "429"}}),
            1);
  EXPECT_EQ(
      value(families, "kvvm_http_responses_total", {{"endpoint", "other"}, {"status", "404"}}), 1);
  EXPECT_EQ(value(families, "kvvm_requests_refused_total", {{"reason", "overloaded"}}), 1);
  EXPECT_EQ(value(families, "kvvm_requests_refused_total", {{"reason", "too_large"}}), 2);
  EXPECT_EQ(value(families, "kvvm_requests_refused_total", {{"reason", "draining"}}), 0);
}

TEST(ServerMetrics, ResponseSeriesAreBounded) {
  ServerMetrics metrics;
  for (int i = 0; i < 1000; ++i) metrics.count_response("/x" + std::to_string(i), 200);
  const auto families = parsed(metrics.render(made_up_inputs()));
  const PromFamily* responses = find_family(families, "kvvm_http_responses_total");
  ASSERT_NE(responses, nullptr);
  EXPECT_LE(responses->samples.size(), 257u);
  double total = 0;
  for (const auto& sample : responses->samples) total += sample.value;
  EXPECT_EQ(total, 1000);
}

TEST(ServerMetrics, ObserveFinishedMovesTheHistograms) {
  ServerMetrics metrics;
  engine::RequestStats stats;
  stats.prompt_tokens = 30;
  stats.generated_tokens = 4;
  stats.queue_seconds = 0.2;
  stats.time_to_first_token = 0.03;
  stats.time_per_output_token = 0.02;
  stats.total_seconds = 0.7;
  metrics.observe_finished(stats, engine::RequestEnd::kStop);
  engine::RequestStats one_token = stats;
  one_token.generated_tokens = 1;
  one_token.time_per_output_token = 0;
  metrics.observe_finished(one_token, engine::RequestEnd::kLength);
  // Not finished: counted nowhere.
  metrics.observe_finished(stats, engine::RequestEnd::kCancelled);
  metrics.observe_finished(stats, engine::RequestEnd::kError);

  const auto families = parsed(metrics.render(made_up_inputs()));
  const auto with = [](PromLabels labels, std::string key, std::string v) {
    labels[std::move(key)] = std::move(v);
    return labels;
  };
  EXPECT_EQ(value(families, "vllm:request_success_total", with(kModel, "finished_reason", "stop")),
            1);
  EXPECT_EQ(
      value(families, "vllm:request_success_total", with(kModel, "finished_reason", "length")), 1);
  EXPECT_EQ(value(families, "vllm:time_to_first_token_seconds_count", kModel), 2);
  EXPECT_EQ(value(families, "vllm:time_to_first_token_seconds_sum", kModel), 0.06);
  // 0.03 falls in (0.02, 0.04].
  EXPECT_EQ(value(families, "vllm:time_to_first_token_seconds_bucket", with(kModel, "le", "0.02")),
            0);
  EXPECT_EQ(value(families, "vllm:time_to_first_token_seconds_bucket", with(kModel, "le", "0.04")),
            2);
  // A one-token request has no time per output token.
  EXPECT_EQ(value(families, "vllm:time_per_output_token_seconds_count", kModel), 1);
  EXPECT_EQ(value(families, "vllm:time_per_output_token_seconds_sum", kModel), 0.02);
  EXPECT_EQ(value(families, "vllm:e2e_request_latency_seconds_count", kModel), 2);
  EXPECT_EQ(value(families, "vllm:e2e_request_latency_seconds_bucket", with(kModel, "le", "0.5")),
            0);
  EXPECT_EQ(value(families, "vllm:e2e_request_latency_seconds_bucket", with(kModel, "le", "0.8")),
            2);
  EXPECT_EQ(value(families, "vllm:request_queue_time_seconds_bucket", with(kModel, "le", "0.3")),
            2);
  EXPECT_EQ(value(families, "vllm:request_prompt_tokens_sum", kModel), 60);
  EXPECT_EQ(value(families, "vllm:request_generation_tokens_sum", kModel), 5);
  // A value on a bound is in that bucket ("less than or equal").
  EXPECT_EQ(value(families, "vllm:request_generation_tokens_bucket", with(kModel, "le", "1")), 1);
  EXPECT_EQ(value(families, "vllm:request_generation_tokens_bucket", with(kModel, "le", "5")), 2);
  EXPECT_EQ(value(families, "vllm:request_prompt_tokens_bucket", with(kModel, "le", "+Inf")), 2);
  // Decode: first token to finish, 0.7 - 0.03 s each. Prefill: admission to first token, here
  // a queue longer than the first token's time (made-up figures) is clamped to 0, not negative.
  EXPECT_EQ(value(families, "vllm:request_decode_time_seconds_count", kModel), 2);
  EXPECT_NEAR(value(families, "vllm:request_decode_time_seconds_sum", kModel).value_or(-1), 1.34,
              1e-12);
  EXPECT_EQ(value(families, "vllm:request_prefill_time_seconds_count", kModel), 2);
  EXPECT_EQ(value(families, "vllm:request_prefill_time_seconds_sum", kModel), 0);
  EXPECT_EQ(value(families, "vllm:request_params_n_sum", kModel), 2);
  EXPECT_EQ(value(families, "vllm:request_params_n_bucket", with(kModel, "le", "1")), 2);
}

TEST(ServerMetrics, CacheConfigInfoCarriesTheConfigurationInItsLabels) {
  ServerMetrics metrics;
  ServerMetrics::Inputs in = made_up_inputs();
  auto families = parsed(metrics.render(in));
  const PromLabels labels = {
      {"model_name", "tiny"},   {"layout", "head-major"},       {"cache_dtype", "bf16"},
      {"quantization", "none"}, {"granule_bytes", "2097152"},   {"num_slots", "65"},
      {"max_context", "8192"},  {"budget_bytes", "8589934592"}, {"enable_prefix_caching", "True"},
      {"block_size", "16"},     {"num_gpu_blocks", "4096"}};
  EXPECT_EQ(value(families, "vllm:cache_config_info", labels), 1);
  in.cache.prefix_caching = false;
  families = parsed(metrics.render(in));
  PromLabels off = labels;
  off["enable_prefix_caching"] = "False";
  EXPECT_EQ(value(families, "vllm:cache_config_info", off), 1);
  EXPECT_EQ(find_family(families, "vllm:cache_config_info")->samples.size(), 1u);
  in.cache.quantization = "fp8-channel";
  families = parsed(metrics.render(in));
  PromLabels fp8 = off;
  fp8["quantization"] = "fp8-channel";
  EXPECT_EQ(value(families, "vllm:cache_config_info", fp8), 1);
}

TEST(ServerMetrics, IterationTokensAreTheEnginesStepsByTheirTokens) {
  ServerMetrics metrics;
  ServerMetrics::Inputs in = made_up_inputs();
  // Three decode steps of one token, a prefill of 9, one of 20,000 (beyond vLLM's last bound).
  for (std::uint64_t tokens : {1, 1, 1, 9, 20000}) in.engine.step_tokens.add(tokens);
  const auto families = parsed(metrics.render(in));
  PromLabels le = kModel;
  EXPECT_EQ(value(families, "vllm:iteration_tokens_total_count", kModel), 5);
  EXPECT_EQ(value(families, "vllm:iteration_tokens_total_sum", kModel), 20012);
  le["le"] = "1";
  EXPECT_EQ(value(families, "vllm:iteration_tokens_total_bucket", le), 3);
  le["le"] = "8";
  EXPECT_EQ(value(families, "vllm:iteration_tokens_total_bucket", le), 3);
  le["le"] = "16";
  EXPECT_EQ(value(families, "vllm:iteration_tokens_total_bucket", le), 4);
  le["le"] = "16384";
  EXPECT_EQ(value(families, "vllm:iteration_tokens_total_bucket", le), 4);
  le["le"] = "+Inf";
  EXPECT_EQ(value(families, "vllm:iteration_tokens_total_bucket", le), 5);
  // vLLM's bounds, in order.
  const PromFamily* family = find_family(families, "vllm:iteration_tokens_total");
  ASSERT_NE(family, nullptr);
  std::vector<std::string> bounds;
  for (const auto& sample : family->samples) {
    if (sample.name.ends_with("_bucket")) bounds.push_back(sample.labels.at("le"));
  }
  EXPECT_EQ(bounds, (std::vector<std::string>{"1", "8", "16", "32", "64", "128", "256", "512",
                                              "1024", "2048", "4096", "8192", "16384", "+Inf"}));
}

TEST(ServerMetrics, InterTokenLatencyObservesEveryGapOfFinishedRequests) {
  ServerMetrics metrics;
  engine::RequestStats stats;
  stats.generated_tokens = 4;
  const std::vector<double> gaps = {0.02, 0.03, 0.2};
  metrics.observe_finished(stats, engine::RequestEnd::kStop, gaps);
  // Not finished: its gaps are counted nowhere, as its other figures.
  metrics.observe_finished(stats, engine::RequestEnd::kCancelled, gaps);
  const auto families = parsed(metrics.render(made_up_inputs()));
  PromLabels le = kModel;
  EXPECT_EQ(value(families, "vllm:inter_token_latency_seconds_count", kModel), 3);
  EXPECT_NEAR(value(families, "vllm:inter_token_latency_seconds_sum", kModel).value_or(-1), 0.25,
              1e-12);
  // vLLM's time-per-output-token bounds: 0.02 and 0.03 in (0.01, 0.025] and (0.025, 0.05].
  le["le"] = "0.025";
  EXPECT_EQ(value(families, "vllm:inter_token_latency_seconds_bucket", le), 1);
  le["le"] = "0.05";
  EXPECT_EQ(value(families, "vllm:inter_token_latency_seconds_bucket", le), 2);
  le["le"] = "0.2";
  EXPECT_EQ(value(families, "vllm:inter_token_latency_seconds_bucket", le), 3);
}

TEST(ServerMetrics, PrefillIsFromAdmissionToTheFirstToken) {
  ServerMetrics metrics;
  engine::RequestStats stats;
  stats.generated_tokens = 3;
  stats.queue_seconds = 0.25;
  stats.time_to_first_token = 1.0;
  stats.total_seconds = 2.0;
  metrics.observe_finished(stats, engine::RequestEnd::kStop);
  const auto families = parsed(metrics.render(made_up_inputs()));
  EXPECT_EQ(value(families, "vllm:request_prefill_time_seconds_sum", kModel), 0.75);
  EXPECT_EQ(value(families, "vllm:request_decode_time_seconds_sum", kModel), 1.0);
}

TEST(ServerMetrics, ParamsNCountsEachRequestsChoices) {
  ServerMetrics metrics;
  engine::RequestStats stats;
  stats.generated_tokens = 2;
  metrics.observe_finished(stats, engine::RequestEnd::kStop, {}, 3);
  metrics.observe_finished(stats, engine::RequestEnd::kLength);
  const auto families = parsed(metrics.render(made_up_inputs()));
  EXPECT_EQ(value(families, "vllm:request_params_n_sum", kModel), 4.0);
  EXPECT_EQ(value(families, "vllm:request_params_n_count", kModel), 2.0);
}

TEST(ServerMetrics, HistogramBucketsAreVllms) {
  ServerMetrics metrics;
  const auto families = parsed(metrics.render(made_up_inputs()));
  const auto bounds = [&](const std::string& name) {
    std::vector<std::string> les;
    for (const auto& sample : find_family(families, name)->samples) {
      if (sample.name == name + "_bucket") les.push_back(sample.labels.at("le"));
    }
    return les;
  };
  EXPECT_EQ(
      bounds("vllm:time_to_first_token_seconds"),
      (std::vector<std::string>{"0.001", "0.005", "0.01", "0.02", "0.04", "0.06", "0.08", "0.1",
                                "0.25",  "0.5",   "0.75", "1",    "2.5",  "5",    "7.5",  "10",
                                "20",    "40",    "80",   "160",  "640",  "2560", "+Inf"}));
  EXPECT_EQ(bounds("vllm:time_per_output_token_seconds").size(), 20u);
  EXPECT_EQ(bounds("vllm:e2e_request_latency_seconds").back(), "+Inf");
  EXPECT_EQ(bounds("vllm:e2e_request_latency_seconds").size(), 22u);
  EXPECT_EQ(bounds("vllm:request_queue_time_seconds").size(), 22u);
  EXPECT_EQ(bounds("vllm:request_prompt_tokens").size(), 17u);
  EXPECT_EQ(bounds("vllm:request_prompt_tokens")[15], "100000");
}

TEST(ServerMetrics, ModelNameIsEscaped) {
  ServerMetrics metrics;
  ServerMetrics::Inputs in = made_up_inputs();
  in.model_name = "a \"quoted\"\\ name\nsecond line";
  const std::string text = metrics.render(in);
  EXPECT_NE(text.find(R"(model_name="a \"quoted\"\\ name\nsecond line")"), std::string::npos)
      << text;
  const auto families = parsed(text);
  EXPECT_EQ(value(families, "vllm:num_requests_running", {{"model_name", in.model_name}}), 3);
}

TEST(ServerMetrics, ConcurrentCountsAddUp) {
  ServerMetrics metrics;
  constexpr int kThreads = 4;
  constexpr int kEach = 500;
  engine::RequestStats stats;
  stats.prompt_tokens = 3;
  stats.generated_tokens = 2;
  stats.time_to_first_token = 0.01;
  stats.time_per_output_token = 0.01;
  stats.total_seconds = 0.5;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kEach; ++i) {
        metrics.observe_finished(
            stats, t % 2 == 0 ? engine::RequestEnd::kStop : engine::RequestEnd::kLength);
        metrics.count_response("/v1/completions", 200);
        metrics.count_refusal("overloaded");
        if (i % 100 == 0) (void)metrics.render(made_up_inputs());  // readers race writers
      }
    });
  }
  for (auto& thread : threads) thread.join();
  const auto families = parsed(metrics.render(made_up_inputs()));
  const double total = kThreads * kEach;
  EXPECT_EQ(value(families, "vllm:e2e_request_latency_seconds_count", kModel), total);
  EXPECT_EQ(value(families, "vllm:request_prompt_tokens_sum", kModel), 3 * total);
  EXPECT_EQ(value(families, "vllm:request_success_total",
                  {{"model_name", "tiny"}, {"finished_reason", "stop"}}),
            total / 2);
  EXPECT_EQ(value(families, "kvvm_http_responses_total",
                  {{"endpoint", "/v1/completions"}, {"status", "200"}}),
            total);
  EXPECT_EQ(value(families, "kvvm_requests_refused_total", {{"reason", "overloaded"}}), total);
}

TEST(ServerMetrics, HistogramDropsNaN) {
  Histogram histogram({1.0, 2.0});
  histogram.observe(std::nan(""));
  histogram.observe(2.0);
  histogram.observe(5.0);
  const Histogram::Snapshot snapshot = histogram.snapshot();
  EXPECT_EQ(snapshot.count, 2u);
  EXPECT_EQ(snapshot.sum, 7.0);
  EXPECT_EQ(snapshot.counts, (std::vector<std::uint64_t>{0, 1, 1}));
}

// The parser must fail where the format does, or the tests above prove nothing.
TEST(PrometheusText, AcceptsAValidText) {
  const std::string text =
      "# HELP a_total Things \\\\ done.\\nSecond.\n"
      "# TYPE a_total counter\n"
      "a_total{x=\"q\\\"\\\\\\n\"} 3\n"
      "# a plain comment\n"
      "\n"
      "# TYPE g gauge\n"
      "g -Inf\n"
      "g{k=\"v\"} NaN 1700000000000\n"
      "# TYPE h histogram\n"
      "h_bucket{le=\"1\"} 1\n"
      "h_bucket{le=\"+Inf\"} 2\n"
      "h_sum 3.5e0\n"
      "h_count 2\n";
  const test::PromParse result = parse_prometheus_text(text);
  ASSERT_TRUE(result.ok()) << result.error;
  ASSERT_EQ(result.families.size(), 3u);
  EXPECT_EQ(result.families[0].help, "Things \\ done.\nSecond.");
  EXPECT_EQ(value(result.families, "a_total", {{"x", "q\"\\\n"}}), 3);
  EXPECT_EQ(value(result.families, "g", {}), -INFINITY);
  EXPECT_TRUE(std::isnan(*value(result.families, "g", {{"k", "v"}})));
  EXPECT_EQ(value(result.families, "h_sum", {}), 3.5);
  EXPECT_EQ(value(result.families, "h_sum", {{"x", "y"}}), std::nullopt);
}

void expect_rejected(const std::string& text, const std::string& line_and_reason) {
  const test::PromParse result = parse_prometheus_text(text);
  EXPECT_FALSE(result.ok()) << text;
  EXPECT_NE(result.error.find(line_and_reason), std::string::npos)
      << "error: " << result.error << "\ntext:\n"
      << text;
}

TEST(PrometheusText, RejectsBadTexts) {
  expect_rejected("a 1\n", "line 1: sample 'a' before any TYPE");
  expect_rejected("# HELP a x\na 1\n", "line 2: sample 'a' before any TYPE");
  expect_rejected("# TYPE a gauge\nb 1\n", "line 2: sample 'b' outside its family");
  expect_rejected("# TYPE a gauge\na 1\n# TYPE a gauge\n", "line 3: family 'a' declared a second");
  expect_rejected("# TYPE a gauge\na 1\n# TYPE b gauge\nb 1\na 2\n", "line 5:");
  expect_rejected("# TYPE a gauge\na 1\n# HELP a late\n",
                  "line 3: family 'a' declared a second time");
  expect_rejected("# TYPE a gauge\n# TYPE a counter\n", "line 2: a second TYPE");
  expect_rejected("# TYPE a gauge\na{x=\"\\t\"} 1\n", "line 2: bad escape");
  expect_rejected("# TYPE a gauge\na{x=\"open} 1\n", "line 2: label 'x' value is not closed");
  expect_rejected("# TYPE a gauge\na{x=y} 1\n", "line 2: label 'x' value is not quoted");
  expect_rejected("# TYPE a gauge\na{x=\"1\",} 1\n", "line 2: a trailing comma");
  expect_rejected("# TYPE a gauge\na{x=\"1\",x=\"2\"} 1\n", "line 2: label 'x' twice");
  expect_rejected("# TYPE a gauge\na{1x=\"1\"} 1\n", "line 2: bad label name");
  expect_rejected("# TYPE a gauge\na one\n", "line 2: bad value 'one'");
  expect_rejected("# TYPE a gauge\na inf\n", "line 2: bad value 'inf'");
  expect_rejected("# TYPE a gauge\na 1 2 3\n", "line 2: text after the timestamp");
  expect_rejected("# TYPE a gauge\na{x=\"1\"} 1\na{x=\"1\"} 2\n", "line 3: a duplicate sample");
  expect_rejected("# TYPE a counter\na -1\n", "line 2: a counter below 0");
  expect_rejected("# TYPE a widget\n", "line 1: unknown type 'widget'");
  expect_rejected("# TYPE a gauge\na 1", "does not end with a newline");
  expect_rejected("# TYPE h histogram\nh 1\n", "line 2: sample 'h' outside its family");
  expect_rejected("# TYPE h histogram\nh_bucket 1\n", "line 2: a bucket without an 'le'");
  expect_rejected(
      "# TYPE h histogram\nh_bucket{le=\"1\"} 2\nh_bucket{le=\"+Inf\"} 1\nh_sum 1\nh_count 1\n",
      "line 3: histogram 'h': buckets not cumulative");
  expect_rejected(
      "# TYPE h histogram\nh_bucket{le=\"2\"} 1\nh_bucket{le=\"1\"} 1\nh_bucket{le=\"+Inf\"} "
      "1\nh_sum 1\nh_count 1\n",
      "line 3: histogram 'h': le not ascending");
  expect_rejected("# TYPE h histogram\nh_bucket{le=\"1\"} 1\nh_sum 1\nh_count 1\n",
                  "line 2: histogram 'h': no le=\"+Inf\" bucket");
  expect_rejected("# TYPE h histogram\nh_bucket{le=\"+Inf\"} 2\nh_sum 1\nh_count 1\n",
                  "line 4: histogram 'h': _count differs");
  expect_rejected("# TYPE h histogram\nh_bucket{le=\"+Inf\"} 1\nh_sum 1\n",
                  "histogram 'h': a series without _count");
}

// Structured output's counters from the grammar cache, and the engine's mask times as a
// cumulative histogram over kMaskSecondsBounds.
TEST(ServerMetrics, GrammarCountersAndMaskHistogram) {
  ServerMetrics metrics;
  ServerMetrics::Inputs in = made_up_inputs();
  in.engine.grammar.constrained_requests = 7;
  in.engine.grammar.masks = 4;
  in.engine.grammar.mask_seconds = 0.5;
  in.engine.grammar.mask_buckets[0] = 2;      // <= 5 us
  in.engine.grammar.mask_buckets[3] = 1;      // <= 50 us
  in.engine.grammar.mask_buckets.back() = 1;  // past the last bound
  in.grammar_cache.hits = 11;
  in.grammar_cache.compiled = 3;
  in.grammar_cache.refused = 2;
  in.grammar_cache.compile_seconds = 0.25;
  in.grammar_cache.entries = 3;
  in.grammar_cache.bytes = 4096;
  const auto families = parsed(metrics.render(in));
  EXPECT_EQ(value(families, "kvvm_constrained_requests_total", {}), 7);
  EXPECT_EQ(value(families, "kvvm_grammar_compiles_total", {}), 3);
  EXPECT_EQ(value(families, "kvvm_grammar_compile_seconds_total", {}), 0.25);
  EXPECT_EQ(value(families, "kvvm_grammar_cache_hits_total", {}), 11);
  EXPECT_EQ(value(families, "kvvm_grammar_refused_total", {}), 2);
  EXPECT_EQ(value(families, "kvvm_grammar_cache_entries", {}), 3);
  EXPECT_EQ(value(families, "kvvm_grammar_cache_bytes", {}), 4096);
  for (const char* name : {"kvvm_constrained_requests_total", "kvvm_grammar_compiles_total",
                           "kvvm_grammar_compile_seconds_total", "kvvm_grammar_cache_hits_total",
                           "kvvm_grammar_refused_total"}) {
    ASSERT_NE(find_family(families, name), nullptr) << name;
    EXPECT_EQ(find_family(families, name)->type, "counter") << name;
  }

  const PromFamily* family = find_family(families, "kvvm_grammar_mask_seconds");
  ASSERT_NE(family, nullptr);
  EXPECT_EQ(family->type, "histogram");
  std::vector<double> bounds;
  std::vector<double> cumulative;
  for (const auto& sample : family->samples) {
    if (sample.name != "kvvm_grammar_mask_seconds_bucket") continue;
    const std::string& le = sample.labels.at("le");
    bounds.push_back(le == "+Inf" ? INFINITY : std::stod(le));
    cumulative.push_back(sample.value);
  }
  std::vector<double> expected_bounds(engine::kMaskSecondsBounds.begin(),
                                      engine::kMaskSecondsBounds.end());
  expected_bounds.push_back(INFINITY);
  EXPECT_EQ(bounds, expected_bounds);
  EXPECT_EQ(cumulative, (std::vector<double>{2, 2, 2, 3, 3, 3, 3, 3, 3, 4}));
  EXPECT_EQ(value(families, "kvvm_grammar_mask_seconds_sum", {}), 0.5);
  EXPECT_EQ(value(families, "kvvm_grammar_mask_seconds_count", {}), 4);
}

}  // namespace
}  // namespace kvvm::server
