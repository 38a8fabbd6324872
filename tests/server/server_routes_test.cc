// The route table is the server's whole surface: each test walks Routes::table(), so a route
// added to it is checked for its method, its 405, the 404's listing, its metrics label and its
// drain without a test of its own.
#include <gtest/gtest.h>
#include <httplib.h>

#include <cstdlib>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <string_view>

#include "server/routes.h"
#include "support/server_rig.h"
#include "support/test_data.h"

namespace kvvm::server::routes_test {
namespace {

using testing::ServerRig;

constexpr const char* kMethods[] = {"GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"};

// `method` on `path` with an empty JSON object as the body: enough to reach a handler, which
// answers it (a generation route with a 400 naming a field).
httplib::Result send(httplib::Client& client, std::string_view method, std::string_view path) {
  httplib::Request request;
  request.method = std::string(method);
  request.path = std::string(path);
  request.set_header("Content-Type", "application/json");
  request.body = "{}";
  return client.send(request);
}

nlohmann::json body_of(const httplib::Result& result) {
  if (!result) return nullptr;
  return nlohmann::json::parse(result->body, nullptr, /*allow_exceptions=*/false);
}

std::string error_code(const httplib::Result& result) {
  const nlohmann::json body = body_of(result);
  if (!body.is_object() || !body.contains("error") || !body["error"]["code"].is_string()) return "";
  return body["error"]["code"].get<std::string>();
}

using ServerRoutesTest = testing::LlamaTinyServerTest;

// A path that reaches the route's handler with a parameter it serves: the served model's name
// for "{model}".
std::string example_path(const Route& route) {
  std::string path(route.path);
  const std::size_t at = path.find("{model}");
  if (at != std::string::npos) path.replace(at, 7, "llama-tiny");
  return path;
}

TEST(ServerRoutesTable, EachPathIsRoutedOnce) {
  std::set<std::string_view> paths;
  for (const Route& route : Routes::table()) {
    EXPECT_TRUE(paths.insert(route.path).second) << route.path;
    EXPECT_EQ(Routes::find(route.path), &route);
  }
  EXPECT_FALSE(paths.empty());
  EXPECT_EQ(Routes::find("/v1/nothing"), nullptr);
}

TEST_F(ServerRoutesTest, EveryRouteAnswersItsMethod) {
  auto client = rig_->client();
  for (const Route& route : Routes::table()) {
    const auto result = send(client, method_name(route.method), example_path(route));
    ASSERT_TRUE(result) << route.path;
    EXPECT_NE(result->status, 404) << route.path << ": " << result->body;
    EXPECT_NE(result->status, 405) << route.path << ": " << result->body;
    EXPECT_NE(error_code(result), "not_found") << route.path;
    EXPECT_NE(error_code(result), "method_not_allowed") << route.path;
  }
}

TEST_F(ServerRoutesTest, EveryOtherMethodIs405NamingTheRoutesMethod) {
  auto client = rig_->client();
  for (const Route& route : Routes::table()) {
    const std::string allowed(method_name(route.method));
    for (const char* method : kMethods) {
      if (method == allowed) continue;
      const auto result = send(client, method, route.path);
      ASSERT_TRUE(result) << method << " " << route.path;
      EXPECT_EQ(result->status, 405) << method << " " << route.path << ": " << result->body;
      EXPECT_EQ(result->get_header_value("Allow"), allowed) << method << " " << route.path;
      EXPECT_EQ(error_code(result), "method_not_allowed") << result->body;
      EXPECT_EQ(body_of(result)["error"]["message"],
                "method " + std::string(method) + " is not allowed on " + std::string(route.path) +
                    " (use " + allowed + ")");
    }
  }
}

TEST_F(ServerRoutesTest, The404NamesEveryRoute) {
  auto client = rig_->client();
  for (const char* method : kMethods) {
    const auto result = send(client, method, "/v1/no-such-route");
    ASSERT_TRUE(result) << method;
    EXPECT_EQ(result->status, 404) << method << ": " << result->body;
    EXPECT_EQ(result->get_header_value("Content-Type"), "application/json");
    const nlohmann::json body = body_of(result);
    EXPECT_EQ(body["error"]["type"], "not_found_error") << result->body;
    EXPECT_EQ(body["error"]["code"], "not_found") << result->body;
    const std::string message = body["error"]["message"].is_string()
                                    ? body["error"]["message"].get<std::string>()
                                    : std::string();
    EXPECT_EQ(message.rfind("no such path: /v1/no-such-route (kvvm serves ", 0), 0u) << message;
    for (const Route& route : Routes::table()) {
      EXPECT_NE(message.find(std::string(route.path)), std::string::npos)
          << route.path << " is not named in: " << message;
    }
  }
}

TEST_F(ServerRoutesTest, EveryRouteIsCountedUnderItsOwnPath) {
  auto client = rig_->client();
  for (const Route& route : Routes::table()) {
    ASSERT_TRUE(send(client, method_name(route.method), example_path(route))) << route.path;
  }
  ASSERT_TRUE(send(client, "GET", "/v1/no-such-route"));
  const auto metrics = client.Get("/metrics");
  ASSERT_TRUE(metrics);
  ASSERT_EQ(metrics->status, 200);
  for (const Route& route : Routes::table()) {
    EXPECT_NE(metrics->body.find(R"(endpoint=")" + std::string(route.path) + R"(")"),
              std::string::npos)
        << route.path << " is not counted in:\n"
        << metrics->body;
  }
  EXPECT_NE(metrics->body.find(R"(kvvm_http_responses_total{endpoint="other",status="404"} 1)"),
            std::string::npos)
      << metrics->body;
}

TEST_F(ServerRoutesTest, WhileDrainingEveryGenerationRouteAnswers503) {
  rig_->server().begin_drain();
  auto client = rig_->client();
  int generation_routes = 0;
  for (const Route& route : Routes::table()) {
    const auto result = send(client, method_name(route.method), example_path(route));
    ASSERT_TRUE(result) << route.path;
    if (route.generation) {
      ++generation_routes;
      EXPECT_EQ(result->status, 503) << route.path << ": " << result->body;
      // When to look again, as a 429 says it.
      const std::string retry = result->get_header_value("Retry-After");
      EXPECT_FALSE(retry.empty()) << route.path;
      EXPECT_GE(std::atoi(retry.c_str()), 1) << retry;
      EXPECT_EQ(body_of(result)["error"]["type"], "unavailable_error") << result->body;
      EXPECT_EQ(error_code(result), "draining") << result->body;
    } else {
      EXPECT_NE(error_code(result), "draining") << route.path << ": " << result->body;
    }
  }
  EXPECT_GT(generation_routes, 0);
  // Only the generation routes' 503s are refusals (the /health probe's 503 is an answer).
  const auto metrics = client.Get("/metrics");
  ASSERT_TRUE(metrics);
  EXPECT_NE(metrics->body.find(R"(kvvm_requests_refused_total{reason="draining"} )" +
                               std::to_string(generation_routes) + "\n"),
            std::string::npos)
      << metrics->body;
}

}  // namespace
}  // namespace kvvm::server::routes_test
