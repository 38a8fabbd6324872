// The gauges an endpoint picker reads (the Gateway API Inference Extension's model-server
// protocol, llm-d's scorers): their names, types, labels and ranges as the picker parses them,
// and that a scrape reads the engine's state as it is, busy or idle, with no timer between.
// A picker reads block_size and num_gpu_blocks with strconv.Atoi and the LoRA lists by
// splitting on commas, so a label renamed, a number written as a float or a usage above 1
// fails here.
#include <gtest/gtest.h>
#include <httplib.h>

#include <atomic>
#include <charconv>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <system_error>
#include <thread>

#include "kvvm/model/model.h"
#include "server/metrics.h"
#include "support/prometheus_text.h"
#include "support/server_rig.h"
#include "support/test_data.h"

namespace kvvm::server::picker_metrics_test {
namespace {

using test::find_family;
using test::parse_prometheus_text;
using test::PromFamily;
using test::PromLabels;
using test::value;

std::vector<PromFamily> parsed(const std::string& text) {
  test::PromParse result = parse_prometheus_text(text);
  EXPECT_TRUE(result.ok()) << result.error << "\n" << text;
  return result.families;
}

// As Go's strconv.Atoi reads a label: decimal digits only.
std::optional<std::uint64_t> atoi_label(const std::string& text) {
  std::uint64_t number = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), number);
  if (ec != std::errc() || end != text.data() + text.size() || text.empty()) return std::nullopt;
  return number;
}

// The one sample of a one-sample family; fails the test when absent or not alone.
const test::PromSample* only_sample(const std::vector<PromFamily>& families, std::string_view name,
                                    std::string_view type) {
  const PromFamily* family = find_family(families, name);
  EXPECT_NE(family, nullptr) << name;
  if (family == nullptr) return nullptr;
  EXPECT_EQ(family->type, type) << name;
  EXPECT_EQ(family->samples.size(), 1u) << name;
  return family->samples.empty() ? nullptr : &family->samples.front();
}

ServerMetrics::Inputs busy_inputs() {
  ServerMetrics::Inputs in;
  in.model_name = "m";
  in.engine.running = 7;
  in.engine.waiting = 11;
  in.engine.arena.physical_bytes = 3ull << 30;
  in.engine.arena.reclaimable_bytes = 1ull << 30;
  in.tier.limit = 8ull << 30;
  in.cache.blocks = {32, 1234};
  in.unix_time = 1796081233.25;
  return in;
}

TEST(PickerMetrics, QueueRunningAndUsageAreGaugesWithTheModelName) {
  ServerMetrics metrics;
  const auto families = parsed(metrics.render(busy_inputs()));
  const PromLabels model = {{"model_name", "m"}};
  for (const char* name :
       {"vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:kv_cache_usage_perc"}) {
    const test::PromSample* sample = only_sample(families, name, "gauge");
    ASSERT_NE(sample, nullptr);
    EXPECT_EQ(sample->labels, model) << name;
  }
  EXPECT_EQ(value(families, "vllm:num_requests_waiting", model), 11);
  EXPECT_EQ(value(families, "vllm:num_requests_running", model), 7);
  // (3 GiB mapped - 1 GiB kept for reuse) / 8 GiB: a fraction, not a percentage.
  EXPECT_EQ(value(families, "vllm:kv_cache_usage_perc", model), 0.25);
}

TEST(PickerMetrics, KvUsageStaysWithinZeroAndOne) {
  ServerMetrics metrics;
  const PromLabels model = {{"model_name", "m"}};
  ServerMetrics::Inputs in = busy_inputs();
  in.engine.arena.physical_bytes = 9ull << 30;  // more mapped than the budget
  in.engine.arena.reclaimable_bytes = 0;
  EXPECT_EQ(value(parsed(metrics.render(in)), "vllm:kv_cache_usage_perc", model), 1);
  in.tier.limit = 0;  // no budget: nothing in use of it
  EXPECT_EQ(value(parsed(metrics.render(in)), "vllm:kv_cache_usage_perc", model), 0);
  in = busy_inputs();
  in.engine.arena.reclaimable_bytes = 5ull << 30;  // more kept than mapped
  EXPECT_EQ(value(parsed(metrics.render(in)), "vllm:kv_cache_usage_perc", model), 0);
}

TEST(PickerMetrics, LoraRequestsInfoHasVllmsLabelsWithNoAdapters) {
  ServerMetrics metrics;
  const auto families = parsed(metrics.render(busy_inputs()));
  const test::PromSample* sample = only_sample(families, "vllm:lora_requests_info", "gauge");
  ASSERT_NE(sample, nullptr);
  // Exactly vLLM's three labels (no model_name, as vLLM writes it).
  const PromLabels expected = {
      {"max_lora", "0"}, {"running_lora_adapters", ""}, {"waiting_lora_adapters", ""}};
  EXPECT_EQ(sample->labels, expected);
  EXPECT_EQ(atoi_label(sample->labels.at("max_lora")), 0u);
  // The picker keeps the sample with the latest value: when the inputs were read.
  EXPECT_EQ(sample->value, 1796081233.25);
}

TEST(PickerMetrics, CacheConfigInfoCarriesBlockSizeAndNumGpuBlocksAsIntegers) {
  ServerMetrics metrics;
  const auto families = parsed(metrics.render(busy_inputs()));
  const test::PromSample* sample = only_sample(families, "vllm:cache_config_info", "gauge");
  ASSERT_NE(sample, nullptr);
  EXPECT_EQ(sample->value, 1);
  ASSERT_EQ(sample->labels.count("block_size"), 1u);
  ASSERT_EQ(sample->labels.count("num_gpu_blocks"), 1u);
  EXPECT_EQ(atoi_label(sample->labels.at("block_size")), 32u);
  EXPECT_EQ(atoi_label(sample->labels.at("num_gpu_blocks")), 1234u);
}

LayoutPlan plan_of(std::uint64_t granule, std::uint64_t contiguous, std::uint64_t fragments) {
  LayoutPlan plan;
  plan.granule = granule;
  plan.contiguous_bytes_per_token = contiguous;
  plan.fragments = fragments;
  plan.bytes_per_token = contiguous * fragments;
  return plan;
}

TEST(PickerMetrics, CacheBlocksAreThePrefixCachesUnit) {
  // A 2 MiB granule of 128 KiB per token (llama-3-8b token-major): vLLM's 16-token block.
  CacheBlocks blocks = cache_blocks(plan_of(2 << 20, 128 << 10, 1), 40ull << 30);
  EXPECT_EQ(blocks.block_size, 16u);
  EXPECT_EQ(blocks.num_gpu_blocks, (40ull << 30) / (16ull * (128 << 10)));
  // 384 bytes a token in 4 KiB granules: a match ends on a token boundary every 3 granules,
  // 32 tokens; a block is 32 tokens in each of 64 fragments.
  blocks = cache_blocks(plan_of(4096, 384, 64), 1ull << 30);
  EXPECT_EQ(blocks.block_size, 32u);
  EXPECT_EQ(blocks.block_size * 384 % 4096, 0u);
  EXPECT_EQ(blocks.num_gpu_blocks, (1ull << 30) / (32ull * 384 * 64));
  // A hit at every token (a granule per token) or every 5: the smallest multiple of at least
  // 16, vLLM's block.
  EXPECT_EQ(cache_blocks(plan_of(4096, 4096, 1), 1ull << 30).block_size, 16u);
  EXPECT_EQ(cache_blocks(plan_of(5 * 4096, 4096 * 4, 1), 1ull << 30).block_size, 20u);
  EXPECT_EQ(cache_blocks(plan_of(4096, 4096, 1), 1ull << 30).num_gpu_blocks,
            (1ull << 30) / (16ull * 4096));
  // No plan: nothing to say.
  blocks = cache_blocks(LayoutPlan{}, 1ull << 30);
  EXPECT_EQ(blocks.block_size, 0u);
  EXPECT_EQ(blocks.num_gpu_blocks, 0u);
}

using PickerMetricsServerTest = testing::LlamaTinyServerTest;

std::vector<PromFamily> scrape(httplib::Client& client) {
  auto metrics = client.Get("/metrics");
  EXPECT_TRUE(metrics);
  if (!metrics) return {};
  EXPECT_EQ(metrics->status, 200);
  return parsed(metrics->body);
}

double now_unix() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

TEST_F(PickerMetricsServerTest, TheServerExposesThePickersGaugesFromItsOwnCache) {
  auto client = rig_->client();
  const double before = now_unix();
  const auto families = scrape(client);
  const double after = now_unix();
  const PromLabels model = {{"model_name", "llama-tiny"}};
  EXPECT_EQ(value(families, "vllm:num_requests_waiting", model), 0);
  EXPECT_EQ(value(families, "vllm:num_requests_running", model), 0);
  const std::optional<double> usage = value(families, "vllm:kv_cache_usage_perc", model);
  ASSERT_TRUE(usage);
  EXPECT_GE(*usage, 0);
  EXPECT_LE(*usage, 1);
  // Stamped by this scrape, not by a timer or the engine's last step.
  const test::PromSample* lora = only_sample(families, "vllm:lora_requests_info", "gauge");
  ASSERT_NE(lora, nullptr);
  EXPECT_GE(lora->value, before - 0.001);
  EXPECT_LE(lora->value, after + 0.001);
  // The blocks of the rig's own plan and budget, a block no longer than a slot's windows.
  const LayoutPlan& plan = rig_->kv().arena().plan();
  const TierStats tier = rig_->kv().governor().stats(rig_->kv().arena().tier());
  const CacheBlocks blocks = cache_blocks(plan, tier.limit);
  ASSERT_GT(blocks.block_size, 0u);
  EXPECT_EQ(blocks.block_size * plan.contiguous_bytes_per_token % plan.granule, 0u);
  const test::PromSample* info = only_sample(families, "vllm:cache_config_info", "gauge");
  ASSERT_NE(info, nullptr);
  EXPECT_EQ(atoi_label(info->labels.at("block_size")), blocks.block_size);
  EXPECT_EQ(atoi_label(info->labels.at("num_gpu_blocks")), blocks.num_gpu_blocks);
}

// A model that answers as the one it wraps, but whose forward calls after the first `pass`
// wait until open(): a step as long as the test wants.
class GatedModel final : public model::Model {
 public:
  GatedModel(model::Model& inner, int pass)
      : Model(inner.config(), inner.limits()), inner_(inner), pass_(pass) {}
  model::Backend backend() const override { return inner_.backend(); }
  Status forward(const model::StepBatch& batch, const model::StepOutput& out) override {
    if (++calls_ > pass_) {
      std::unique_lock<std::mutex> lock(mutex_);
      opened_.wait(lock, [&] { return open_; });
    }
    return inner_.forward(batch, out);
  }
  void open() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      open_ = true;
    }
    opened_.notify_all();
  }

 private:
  model::Model& inner_;
  const int pass_;
  std::atomic<int> calls_{0};
  std::mutex mutex_;
  std::condition_variable opened_;
  bool open_ = false;
};

// Polls /metrics until `name` reads `expected` (true) or 10 s pass (false).
bool reads_within(httplib::Client& client, const std::string& name, double expected) {
  const PromLabels model = {{"model_name", "llama-tiny"}};
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (std::chrono::steady_clock::now() < deadline) {
    if (value(scrape(client), name, model) == expected) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return false;
}

// In the middle of a step as long as the test holds it, a scrape shows the running request and
// a request that arrived during the step; the moment the last answer's last byte is read, an
// idle engine reads zero: nothing waits for a later step or a refresh period.
TEST(PickerMetricsGated, AScrapeReadsTheEngineAsItIsMidStepAndIdle) {
  const std::string dir = test::model_fixture_dir("llama-tiny");
  // The first request's prompt runs (its first token streams), then the next step waits.
  GatedModel gated(*testing::loaded_model(dir).model, 1);
  testing::RigOptions rig_options;
  rig_options.model = &gated;
  ServerOptions options;
  options.model_name = "llama-tiny";
  auto rig = testing::ServerRig::make(dir, options, rig_options);
  ASSERT_NE(rig, nullptr);
  struct OpenOnExit {  // the rig's drain needs the steps to run, whatever the test asserted
    GatedModel& model;
    ~OpenOnExit() { model.open(); }
  } open_on_exit{gated};

  std::atomic<bool> streaming{false};
  int first_status = 0;
  std::thread first([&] {
    auto client = rig->client(std::chrono::seconds(30));
    httplib::Request request;
    request.method = "POST";
    request.path = "/v1/completions";
    request.set_header("Content-Type", "application/json");
    request.body = R"({"model": "llama-tiny", "prompt": "one two three", "max_tokens": 4,
                       "stream": true})";
    request.content_receiver = [&](const char*, std::size_t, std::uint64_t, std::uint64_t) {
      streaming = true;
      return true;
    };
    auto result = client.send(request);
    first_status = result ? result->status : -1;
  });
  int second_status = 0;
  std::thread second;
  auto client = rig->client();
  const PromLabels model = {{"model_name", "llama-tiny"}};
  // The first token streamed: the engine's first step ended and the second is held.
  EXPECT_TRUE(reads_within(client, "vllm:num_requests_running", 1));
  if (streaming) {
    second = std::thread([&] {
      auto waiting_client = rig->client(std::chrono::seconds(30));
      auto result =
          testing::post_json(waiting_client, "/v1/completions",
                             R"({"model": "llama-tiny", "prompt": "four five", "max_tokens": 2})");
      second_status = result ? result->status : -1;
    });
    // Counted at its arrival, while the step is still held.
    EXPECT_TRUE(reads_within(client, "vllm:num_requests_waiting", 1));
    const std::optional<double> usage = value(scrape(client), "vllm:kv_cache_usage_perc", model);
    EXPECT_GT(usage.value_or(0), 0);
    EXPECT_LE(usage.value_or(2), 1);
  } else {
    ADD_FAILURE() << "the first request never streamed";
  }
  gated.open();
  first.join();
  if (second.joinable()) second.join();
  EXPECT_EQ(first_status, 200);
  EXPECT_EQ(second_status, 200);
  // Both answers are whole: the engine published their end before their last bytes.
  const auto idle = scrape(client);
  EXPECT_EQ(value(idle, "vllm:num_requests_running", model), 0);
  EXPECT_EQ(value(idle, "vllm:num_requests_waiting", model), 0);
}

// Readiness from the probe's status alone (Kubernetes: 200-399 ready), liveness from a path
// that keeps answering while the running requests finish.
TEST_F(PickerMetricsServerTest, HealthTellsReadyFromDrainingAndTheRestStaysUp) {
  auto client = rig_->client();
  auto ready = client.Get("/health");
  ASSERT_TRUE(ready);
  EXPECT_EQ(ready->status, 200);
  rig_->server().begin_drain();
  auto draining = client.Get("/health");
  ASSERT_TRUE(draining);
  EXPECT_EQ(draining->status, 503);
  EXPECT_EQ(nlohmann::json::parse(draining->body)["status"], "draining");
  // A balancer retries a generation's 503 elsewhere; the probes and the model list answer.
  auto metrics = client.Get("/metrics");
  ASSERT_TRUE(metrics);
  EXPECT_EQ(metrics->status, 200);
  auto models = client.Get("/v1/models");
  ASSERT_TRUE(models);
  EXPECT_EQ(models->status, 200);
}

}  // namespace
}  // namespace kvvm::server::picker_metrics_test
