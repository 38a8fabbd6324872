// Structured output through the server, over loopback HTTP on llama-tiny (CPU): a constraint is
// compiled on the HTTP thread through the server's grammar cache (compile errors and schema
// bombs a 400 naming the field, a schema sent twice compiled once, both in /metrics), and the
// answers match their constraint, streamed or not, on both generation endpoints.
//
// The answers' tests need the grammar front ends (kvvm/grammar/constraint.h) and the engine's
// masks: they skip while the front ends only refuse (a tree without them).
#include <gtest/gtest.h>
#include <httplib.h>

#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "kvvm/grammar/constraint.h"
#include "support/prometheus_text.h"
#include "support/server_rig.h"
#include "support/test_data.h"
#include "support/text_match.h"

namespace kvvm::server {
namespace {

using testing::post_json;
using testing::ServerRig;
using testing::sse_events;

// Whether the front ends are in this tree (they refuse with Unavailable while they are not).

nlohmann::json body_of(const httplib::Result& result) {
  if (!result) return nullptr;
  return nlohmann::json::parse(result->body, nullptr, /*allow_exceptions=*/false);
}

std::vector<test::PromFamily> scrape(httplib::Client& client) {
  auto metrics = client.Get("/metrics");
  EXPECT_TRUE(metrics);
  if (!metrics) return {};
  test::PromParse parsed = test::parse_prometheus_text(metrics->body);
  EXPECT_TRUE(parsed.ok()) << parsed.error;
  return parsed.families;
}

double scraped(httplib::Client& client, const std::string& name) {
  return test::value(scrape(client), name, {}).value_or(-1);
}

class ServerStructuredOutput : public ::testing::Test {
 protected:
  void SetUp() override {
    ServerOptions options;
    options.model_name = "llama-tiny";
    options.chat_renderer = tokenizer::ChatRenderer::builtin(tokenizer::ChatTemplate::kChatML);
    rig_ = ServerRig::make(test::model_fixture_dir("llama-tiny"), options);
    ASSERT_NE(rig_, nullptr);
  }

  // POSTs `fields` after a prompt (completions) or a user message (chat).
  httplib::Result post(const std::string& path, const std::string& fields) {
    client_ = std::make_unique<httplib::Client>(rig_->client());
    const std::string head =
        path == "/v1/chat/completions"
            ? R"({"model": "llama-tiny", "messages": [{"role": "user", "content": "Answer."}], )"
            : R"({"model": "llama-tiny", "prompt": "Answer:", )";
    return post_json(*client_, path, head + fields + "}");
  }

  // The answer's text and finish_reason (streamed or not, either endpoint), asserting a 200.
  std::pair<std::string, std::string> answer(const std::string& path, const std::string& fields,
                                             bool stream = false) {
    auto result = post(path, fields + (stream ? R"(, "stream": true)" : ""));
    EXPECT_TRUE(result);
    if (!result) return {};
    EXPECT_EQ(result->status, 200) << result->body;
    const bool chat = path == "/v1/chat/completions";
    std::string text, finish;
    if (!stream) {
      const nlohmann::json body = body_of(result);
      const nlohmann::json& choice = body["choices"][0];
      text = chat ? choice["message"]["content"].get<std::string>()
                  : choice["text"].get<std::string>();
      finish = choice["finish_reason"].get<std::string>();
      return {text, finish};
    }
    bool done = false;
    for (const nlohmann::json& event : sse_events(result->body, &done)) {
      if (!event.contains("choices") || event["choices"].empty()) continue;
      const nlohmann::json& choice = event["choices"][0];
      const nlohmann::json& piece = chat ? choice["delta"]["content"] : choice["text"];
      if (piece.is_string()) text += piece.get<std::string>();
      if (choice["finish_reason"].is_string()) finish = choice["finish_reason"].get<std::string>();
    }
    EXPECT_TRUE(done);
    return {text, finish};
  }

  std::unique_ptr<ServerRig> rig_;
  std::unique_ptr<httplib::Client> client_;
};

// A compile error is the client's: a 400 whose message is the compiler's after the field.
TEST_F(ServerStructuredOutput, CompileErrorsAreABadRequestNamingTheField) {
  struct Case {
    std::string path, fields, param, mention;  // mention: the front end's words
  };
  const std::vector<Case> cases = {
      {"/v1/completions", R"("guided_regex": "(?=a)b")", "guided_regex", ""},
      {"/v1/chat/completions", R"("guided_regex": "a(b")", "guided_regex", ""},
      {"/v1/chat/completions",
       R"("response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema":
          {"properties": {"a": {"if": {"type": "string"}}}}}})",
       "response_format.json_schema.schema", R"("if" is not supported)"},
      {"/v1/completions", R"("guided_json": "{not json")", "guided_json", ""},
      {"/v1/completions", R"("guided_grammar": "root ::= undefined_rule")", "guided_grammar",
       "undefined_rule"},
      {"/v1/completions", R"("structured_outputs": {"grammar": "root ::= ("})",
       "structured_outputs.grammar", ""},
  };
  auto client = rig_->client();
  for (const Case& c : cases) {
    SCOPED_TRACE(c.fields);
    auto result = post(c.path, c.fields);
    ASSERT_TRUE(result);
    EXPECT_EQ(result->status, 400) << result->body;
    const nlohmann::json error = body_of(result)["error"];
    EXPECT_EQ(error["param"], c.param);
    const std::string message = error["message"].get<std::string>();
    EXPECT_TRUE(message.starts_with(c.param + ": ")) << message;
    EXPECT_TRUE(test::contains(message, c.mention)) << message;
  }
  EXPECT_EQ(scraped(client, "kvvm_grammar_refused_total"), double(cases.size()));
  EXPECT_EQ(scraped(client, "kvvm_grammar_compiles_total"), 0);
}

// A schema bomb is the client's schema too: a 400 naming the bound it ran into, not a 500, not
// minutes of compiling.
TEST_F(ServerStructuredOutput, ASchemaBombIsABadRequestNamingTheBound) {
  // Nested fixed-size arrays: 1000^4 copies of a string's grammar.
  std::string schema = R"({"type": "string", "maxLength": 1000})";
  for (int i = 0; i < 4; ++i) {
    schema = R"({"type": "array", "minItems": 1000, "maxItems": 1000, "items": )" + schema + "}";
  }
  auto result = post("/v1/completions", R"("guided_json": )" + schema);
  ASSERT_TRUE(result);
  EXPECT_EQ(result->status, 400) << result->body;
  const std::string message = body_of(result)["error"]["message"].get<std::string>();
  EXPECT_TRUE(message.starts_with("guided_json: ")) << message;
  // GrammarLimits' bound, with its number.
  EXPECT_TRUE(test::contains(message, "passes the grammar's bound of")) << message;
}

// One compile for a constraint sent twice; the counts in /metrics.
TEST_F(ServerStructuredOutput, ASchemaSentTwiceIsCompiledOnce) {
  auto client = rig_->client();
  for (int i = 0; i < 3; ++i) {
    auto result =
        post("/v1/completions", R"("max_tokens": 2, "response_format": {"type": "json_object"})");
    ASSERT_TRUE(result);
    EXPECT_EQ(result->status, 200) << result->body;
  }
  const auto families = scrape(client);
  EXPECT_EQ(test::value(families, "kvvm_grammar_compiles_total", {}), 1);
  EXPECT_EQ(test::value(families, "kvvm_grammar_cache_hits_total", {}), 2);
  EXPECT_EQ(test::value(families, "kvvm_grammar_refused_total", {}), 0);
  EXPECT_EQ(test::value(families, "kvvm_grammar_cache_entries", {}), 1);
  EXPECT_GE(test::value(families, "kvvm_grammar_compile_seconds_total", {}).value_or(-1), 0);
  for (const char* name : {"kvvm_constrained_requests_total", "kvvm_grammar_cache_bytes"}) {
    EXPECT_NE(test::find_family(families, name), nullptr) << name;
  }
  const test::PromFamily* masks = test::find_family(families, "kvvm_grammar_mask_seconds");
  ASSERT_NE(masks, nullptr);
  EXPECT_EQ(masks->type, "histogram");
}

// --- The answers: these need the front ends and the engine's masks. ---

TEST_F(ServerStructuredOutput, AChoiceAnswersExactlyOneOfTheChoices) {
  auto client = rig_->client();
  const double before = scraped(client, "kvvm_constrained_requests_total");
  for (const char* path : {"/v1/completions", "/v1/chat/completions"}) {
    for (bool stream : {false, true}) {
      SCOPED_TRACE(std::string(path) + (stream ? " streamed" : ""));
      const auto [text, finish] =
          answer(path, R"("max_tokens": 16, "guided_choice": ["yes", "no"])", stream);
      EXPECT_TRUE(text == "yes" || text == "no") << text;
      EXPECT_EQ(finish, "stop");
    }
  }
  EXPECT_EQ(scraped(client, "kvvm_constrained_requests_total"), before + 4);
  const auto families = scrape(client);
  EXPECT_GT(test::value(families, "kvvm_grammar_mask_seconds_count", {}).value_or(0), 0);
}

TEST_F(ServerStructuredOutput, ARegexAnswersItsLanguage) {
  for (const char* fields :
       {R"("guided_regex": "[0-9]{3}")", R"("structured_outputs": {"regex": "[0-9]{3}"})"}) {
    for (bool stream : {false, true}) {
      SCOPED_TRACE(std::string(fields) + (stream ? " streamed" : ""));
      const auto [text, finish] =
          answer("/v1/completions", R"("max_tokens": 16, )" + std::string(fields), stream);
      ASSERT_EQ(text.size(), 3u) << text;
      for (char c : text) EXPECT_TRUE(c >= '0' && c <= '9') << text;
      EXPECT_EQ(finish, "stop");
    }
  }
}

TEST_F(ServerStructuredOutput, AJsonSchemaAnswersJsonWithItsRequiredKeys) {
  const std::string schema =
      R"({"type": "object", "properties": {"ok": {"type": "boolean"}, "size": {"enum":)"
      R"( ["small", "large"]}}, "required": ["ok", "size"], "additionalProperties": false})";
  for (const std::string& fields :
       {R"("response_format": {"type": "json_schema", "json_schema": {"name": "verdict",)"
        R"( "strict": true, "schema": )" +
            schema + "}}",
        R"("guided_json": )" + schema}) {
    for (const char* path : {"/v1/completions", "/v1/chat/completions"}) {
      SCOPED_TRACE(std::string(path) + " " + fields);
      const auto [text, finish] = answer(path, R"("max_tokens": 64, )" + fields);
      const nlohmann::json parsed = nlohmann::json::parse(text, nullptr, false);
      ASSERT_TRUE(parsed.is_object()) << text;
      EXPECT_TRUE(parsed["ok"].is_boolean()) << text;
      EXPECT_TRUE(parsed["size"] == "small" || parsed["size"] == "large") << text;
      EXPECT_EQ(parsed.size(), 2u) << text;
      EXPECT_EQ(text.find(' '), std::string::npos) << "compact whitespace: " << text;
      EXPECT_EQ(finish, "stop");
    }
  }
}

TEST_F(ServerStructuredOutput, AJsonObjectAnswersAnObject) {
  const auto [text, finish] = answer(
      "/v1/chat/completions", R"("max_tokens": 200, "response_format": {"type": "json_object"})");
  if (finish == "stop") {
    EXPECT_TRUE(nlohmann::json::parse(text, nullptr, false).is_object()) << text;
  } else {
    EXPECT_EQ(finish, "length");  // a random model may nest past the budget
    EXPECT_TRUE(text.starts_with("{")) << text;
  }
}

// max_tokens ending inside the grammar: finish_reason is the engine's, length.
TEST_F(ServerStructuredOutput, MaxTokensInsideTheGrammarIsLength) {
  const auto [text, finish] =
      answer("/v1/completions", R"("max_tokens": 3, "guided_regex": "[a-z]{40}")");
  EXPECT_EQ(finish, "length");
  for (char c : text) EXPECT_TRUE(c >= 'a' && c <= 'z') << text;
}

}  // namespace
}  // namespace kvvm::server
