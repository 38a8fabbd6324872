// API keys name tenants, and the tenant salts the prefix cache: two tenants sending the same
// long prompt never share KV; one tenant sending it twice does.
#include <gtest/gtest.h>
#include <httplib.h>

#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "support/prometheus_text.h"
#include "support/server_rig.h"
#include "support/test_data.h"

namespace kvvm::server {
namespace {

using testing::post_json;
using testing::ServerRig;

class ServerTenantTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ServerOptions options;
    options.model_name = "llama-tiny";
    auto keys = ApiKeys::parse("key-alpha-0001 alpha\nkey-beta-00002 beta\n", "test keys");
    ASSERT_TRUE(keys.ok()) << keys.status().to_string();
    options.api_keys = *keys;
    rig_ = ServerRig::make(test::model_fixture_dir("llama-tiny"), options);
    ASSERT_NE(rig_, nullptr);
    for (int i = 0; i < 12; ++i) system_prompt_ += "You are a careful assistant. ";
  }

  // One completion of the shared prompt as `key`; returns its usage.
  nlohmann::json complete(const std::string& key, const std::string& question) {
    auto client = rig_->client();
    const nlohmann::json body = {
        {"model", "llama-tiny"}, {"prompt", system_prompt_ + question}, {"max_tokens", 2}};
    auto result =
        post_json(client, "/v1/completions", body.dump(), {{"Authorization", "Bearer " + key}});
    EXPECT_TRUE(result);
    if (!result) return nullptr;
    EXPECT_EQ(result->status, 200) << result->body;
    return nlohmann::json::parse(result->body, nullptr, false)["usage"];
  }

  double prefix_hits() {
    auto client = rig_->client();
    auto metrics = client.Get("/metrics");
    EXPECT_TRUE(metrics);
    if (!metrics) return -1;
    const test::PromParse parsed = test::parse_prometheus_text(metrics->body);
    EXPECT_TRUE(parsed.ok()) << parsed.error;
    const std::optional<double> hits = test::value(parsed.families, "vllm:prefix_cache_hits_total",
                                                   {{"model_name", "llama-tiny"}});
    EXPECT_TRUE(hits.has_value()) << metrics->body;
    return hits.value_or(-1);
  }

  std::unique_ptr<ServerRig> rig_;
  std::string system_prompt_;
};

TEST_F(ServerTenantTest, TwoTenantsNeverShareAPrefix) {
  const nlohmann::json alpha = complete("key-alpha-0001", "Q1");
  const nlohmann::json beta = complete("key-beta-00002", "Q1");
  EXPECT_GT(alpha["prompt_tokens"].get<int>(), 100);
  EXPECT_EQ(beta["prompt_tokens_details"]["cached_tokens"], 0) << beta.dump();
  EXPECT_EQ(prefix_hits(), 0);
  EXPECT_EQ(rig_->engine().stats().cached_tokens, 0u);
}

TEST_F(ServerTenantTest, OneTenantSharesItsPrefix) {
  complete("key-alpha-0001", "Q1");
  const nlohmann::json again = complete("key-alpha-0001", "Q2");
  EXPECT_GT(again["prompt_tokens_details"]["cached_tokens"].get<int>(), 100) << again.dump();
  EXPECT_GT(prefix_hits(), 100);
}

}  // namespace
}  // namespace kvvm::server
