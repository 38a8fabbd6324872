// The OpenAI response bodies and errors: their JSON shapes, the SSE framing, and text with
// invalid UTF-8 replaced rather than thrown on.
#include <gtest/gtest.h>

#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "server/api_error.h"
#include "server/openai_response.h"

namespace kvvm::server {
namespace {

using nlohmann::json;

ResponseHead head(Endpoint endpoint) {
  ResponseHead h;
  h.endpoint = endpoint;
  h.id = endpoint == Endpoint::kChat ? "chatcmpl-abc" : "cmpl-abc";
  h.created = 1700000000;
  h.model = "kvvm-adder";
  return h;
}

const Usage kUsage{.prompt_tokens = 10, .completion_tokens = 3, .cached_tokens = 4};

void expect_usage(const json& usage) {
  EXPECT_EQ(usage, json::parse(R"({"prompt_tokens": 10, "completion_tokens": 3,
      "total_tokens": 13, "prompt_tokens_details": {"cached_tokens": 4}})"));
}

void expect_head(const json& body, const ResponseHead& h, const std::string& object) {
  EXPECT_EQ(body["id"], h.id);
  EXPECT_EQ(body["object"], object);
  EXPECT_EQ(body["created"], h.created);
  EXPECT_EQ(body["model"], h.model);
}

TEST(ServerResponse, CompletionBody) {
  const ResponseHead h = head(Endpoint::kCompletions);
  const json body = completion_body(h, "521", "stop", kUsage);
  expect_head(body, h, "text_completion");
  ASSERT_EQ(body["choices"].size(), 1u);
  EXPECT_EQ(body["choices"][0]["index"], 0);
  EXPECT_EQ(body["choices"][0]["text"], "521");
  EXPECT_EQ(body["choices"][0]["finish_reason"], "stop");
  EXPECT_FALSE(body["choices"][0].contains("message"));
  expect_usage(body["usage"]);
}

TEST(ServerResponse, ChatCompletionBody) {
  const ResponseHead h = head(Endpoint::kChat);
  const json body = completion_body(h, "521", "length", kUsage);
  expect_head(body, h, "chat.completion");
  ASSERT_EQ(body["choices"].size(), 1u);
  EXPECT_EQ(body["choices"][0]["message"], json::parse(R"({"role": "assistant",
      "content": "521", "refusal": null})"));
  EXPECT_EQ(body["choices"][0]["finish_reason"], "length");
  EXPECT_FALSE(body["choices"][0].contains("text"));
  expect_usage(body["usage"]);
}

TEST(ServerResponse, ChatChunksCarryTheRoleFirstAndTheFinishLast) {
  const ResponseHead h = head(Endpoint::kChat);
  const json first = stream_chunk(h, "5", true, std::nullopt);
  expect_head(first, h, "chat.completion.chunk");
  EXPECT_EQ(first["choices"][0]["delta"], json::parse(R"({"role": "assistant", "content": "5"})"));
  EXPECT_TRUE(first["choices"][0]["finish_reason"].is_null());
  EXPECT_FALSE(first.contains("usage"));

  const json middle = stream_chunk(h, "21", false, std::nullopt);
  EXPECT_EQ(middle["choices"][0]["delta"], json::parse(R"({"content": "21"})"));
  EXPECT_TRUE(middle["choices"][0]["finish_reason"].is_null());

  const json last = stream_chunk(h, "", false, "stop");
  EXPECT_EQ(last["choices"][0]["delta"], json::object());
  EXPECT_EQ(last["choices"][0]["finish_reason"], "stop");
  EXPECT_FALSE(last.contains("usage"));
}

// With stream_options.include_usage every chunk before the usage chunk says "usage": null.
TEST(ServerResponse, ChunksBeforeAUsageChunkCarryANullUsage) {
  for (const Endpoint endpoint : {Endpoint::kChat, Endpoint::kCompletions}) {
    const ResponseHead h = head(endpoint);
    for (const json& chunk : {stream_chunk(h, "5", true, std::nullopt, true),
                              stream_chunk(h, "", false, "stop", true)}) {
      ASSERT_TRUE(chunk.contains("usage")) << chunk.dump();
      EXPECT_TRUE(chunk["usage"].is_null()) << chunk.dump();
    }
  }
}

TEST(ServerResponse, CompletionChunks) {
  const ResponseHead h = head(Endpoint::kCompletions);
  const json chunk = stream_chunk(h, "52", true, std::nullopt);
  expect_head(chunk, h, "text_completion");
  EXPECT_EQ(chunk["choices"][0]["text"], "52");
  EXPECT_FALSE(chunk["choices"][0].contains("delta"));
  EXPECT_TRUE(chunk["choices"][0]["finish_reason"].is_null());
  EXPECT_EQ(stream_chunk(h, "1", false, "length")["choices"][0]["finish_reason"], "length");
}

TEST(ServerResponse, UsageChunkHasNoChoices) {
  for (Endpoint endpoint : {Endpoint::kChat, Endpoint::kCompletions}) {
    const ResponseHead h = head(endpoint);
    const json chunk = usage_chunk(h, kUsage);
    expect_head(chunk, h,
                endpoint == Endpoint::kChat ? "chat.completion.chunk" : "text_completion");
    EXPECT_EQ(chunk["choices"], json::array());
    expect_usage(chunk["usage"]);
  }
}

TEST(ServerResponse, UsageAndFinishReasonFromTheEngine) {
  engine::RequestStats stats;
  stats.prompt_tokens = 10;
  stats.generated_tokens = 3;
  stats.cached_tokens = 4;
  const Usage usage = usage_of(stats);
  EXPECT_EQ(usage.prompt_tokens, 10u);
  EXPECT_EQ(usage.completion_tokens, 3u);
  EXPECT_EQ(usage.cached_tokens, 4u);
  EXPECT_EQ(finish_reason(engine::RequestEnd::kStop), "stop");
  EXPECT_EQ(finish_reason(engine::RequestEnd::kLength), "length");
}

TEST(ServerResponse, ModelsBody) {
  EXPECT_EQ(models_body("kvvm-adder", 1700000000, 128, "none"), json::parse(R"({"object": "list",
      "data": [{"id": "kvvm-adder", "object": "model", "created": 1700000000,
      "owned_by": "kvvm", "max_model_len": 128, "quantization": "none"}]})"));
  EXPECT_EQ(model_body("qwen3-8b-fp8", 1, 4096, "fp8-block128")["quantization"], "fp8-block128");
}

TEST(ServerResponse, InvalidUtf8IsReplacedNotThrown) {
  const std::string bad = "ok \xff\xfe end";
  const json body = completion_body(head(Endpoint::kCompletions), bad, "stop", kUsage);
  // nlohmann's plain dump throws on these bytes: the reason dump_json exists.
  EXPECT_THROW((void)body.dump(), json::type_error);
  std::string text;
  ASSERT_NO_THROW(text = dump_json(body));
  EXPECT_NE(text.find("ok \xEF\xBF\xBD\xEF\xBF\xBD end"), std::string::npos) << text;
  EXPECT_EQ(json::parse(text)["choices"][0]["text"], "ok \xEF\xBF\xBD\xEF\xBF\xBD end");

  std::string event;
  ASSERT_NO_THROW(event = sse_event(stream_chunk(head(Endpoint::kChat), bad, false, {})));
  EXPECT_NE(event.find("\xEF\xBF\xBD"), std::string::npos);

  ApiError error;
  error.message = "prompt: \xc3 is odd";
  std::string error_text;
  ASSERT_NO_THROW(error_text = error_body(error));
  EXPECT_EQ(json::parse(error_text)["error"]["message"], "prompt: \xEF\xBF\xBD is odd");
}

TEST(ServerResponse, SseFraming) {
  const json value = {{"a", 1}};
  EXPECT_EQ(sse_event(value), "data: {\"a\":1}\n\n");
  EXPECT_EQ(kSseDone, "data: [DONE]\n\n");
}

TEST(ServerResponse, ResponseIdsHaveThePrefixAnd24HexDigits) {
  std::set<std::string> seen;
  for (Endpoint endpoint : {Endpoint::kCompletions, Endpoint::kChat}) {
    const std::string prefix = endpoint == Endpoint::kChat ? "chatcmpl-" : "cmpl-";
    for (int i = 0; i < 8; ++i) {
      const std::string id = response_id(endpoint);
      ASSERT_TRUE(id.starts_with(prefix)) << id;
      const std::string digits = id.substr(prefix.size());
      EXPECT_EQ(digits.size(), 24u) << id;
      EXPECT_EQ(digits.find_first_not_of("0123456789abcdef"), std::string::npos) << id;
      seen.insert(digits);
    }
  }
  EXPECT_EQ(seen.size(), 16u);  // 96 random bits: a repeat means a broken generator
}

TEST(ServerError, BodyShapeWithNullParamAndCode) {
  ApiError error;
  error.status = 503;
  error.type = "unavailable_error";
  error.message = "draining";
  EXPECT_EQ(json::parse(error_body(error)), json::parse(R"({"error": {"message": "draining",
      "type": "unavailable_error", "param": null, "code": null}})"));

  ApiError missing;
  missing.status = 404;
  missing.message = "model: no";
  missing.param = "model";
  missing.code = "model_not_found";
  EXPECT_EQ(json::parse(error_body(missing)), json::parse(R"({"error": {"message": "model: no",
      "type": "invalid_request_error", "param": "model", "code": "model_not_found"}})"));
}

TEST(ServerError, BadFieldNamesTheField) {
  const ApiError error = bad_field("messages[1].content", "must be a string");
  EXPECT_EQ(error.status, 400);
  EXPECT_EQ(error.type, "invalid_request_error");
  EXPECT_EQ(error.param, "messages[1].content");
  EXPECT_EQ(error.message, "messages[1].content: must be a string");
  EXPECT_EQ(error.code, "");
}

TEST(ServerError, RetryAfterRoundsUpToWholeSeconds) {
  EXPECT_EQ(retry_after_header(0.2), "1");
  EXPECT_EQ(retry_after_header(0), "1");
  EXPECT_EQ(retry_after_header(-3), "1");
  EXPECT_EQ(retry_after_header(1), "1");
  EXPECT_EQ(retry_after_header(2), "2");
  EXPECT_EQ(retry_after_header(2.1), "3");
  EXPECT_EQ(retry_after_header(std::numeric_limits<double>::quiet_NaN()), "1");
  EXPECT_EQ(retry_after_header(1e300), "86400");
}

}  // namespace
}  // namespace kvvm::server
