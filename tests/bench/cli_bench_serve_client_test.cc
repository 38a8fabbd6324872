// The pieces of `kvvm bench serve` without a server: the SSE framing across reads, Retry-After
// as delay-seconds, the --url forms, and the prompt ids (seeded, a tenant's system prompt
// shared).
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <string_view>
#include <vector>

#include "bench/drivers/serve/serve_client.h"
#include "bench/drivers/serve/serve_request.h"
#include "sim/trace.h"
#include "support/cli_run.h"

namespace kvvm::cli {
namespace {

using test::contains;

TEST(BenchServeClient, PromptIdsComeFromTheSeedWithTheTenantsPrefixShared) {
  TraceGeneratorOptions generator;
  generator.requests = 3;
  generator.tenants = 1;
  generator.system_prompt_tokens = 6;
  const Trace trace = *generate_trace(generator);
  const std::vector<TokenId> a = prompt_ids(trace, 0, 1, 100);
  const std::vector<TokenId> b = prompt_ids(trace, 1, 1, 100);
  ASSERT_EQ(a.size(), trace.requests[0].prompt_tokens);
  EXPECT_EQ(a, prompt_ids(trace, 0, 1, 100));  // deterministic
  EXPECT_NE(a, prompt_ids(trace, 0, 2, 100));  // the seed changes them
  ASSERT_GT(b.size(), 6u);
  EXPECT_TRUE(std::equal(a.begin(), a.begin() + 6, b.begin()));  // the tenant's system prompt
  EXPECT_NE(std::vector<TokenId>(a.begin() + 6, a.end()),
            std::vector<TokenId>(b.begin() + 6, b.end()));  // each request's own ids
  for (TokenId id : a) EXPECT_LT(id, 100u);
}

TEST(BenchServeClient, SseParserFramesEventsAcrossChunks) {
  std::vector<std::string> events;
  SseParser parser([&](const std::string& data) {
    events.push_back(data);
    return true;
  });
  for (std::string_view piece : {"data: {\"a\"", ":1}\r\n\r\n: keep-alive\n\nevent: x\nda",
                                 "ta: one\ndata: two\n\ndata: [DONE]\n"}) {
    ASSERT_TRUE(parser.feed(piece));
  }
  ASSERT_TRUE(parser.finish());  // the last event had no blank line
  EXPECT_EQ(events, (std::vector<std::string>{"{\"a\":1}", "one\ntwo", "[DONE]"}));

  SseParser bounded([](const std::string&) { return true; });
  EXPECT_FALSE(bounded.feed(std::string(kMaxSseLineBytes + 1, 'x')));
  EXPECT_FALSE(bounded.feed("\n\n"));  // stays failed
}

TEST(BenchServeClient, RetryAfterIsDelaySeconds) {
  EXPECT_EQ(parse_retry_after("2"), 2.0);
  EXPECT_EQ(parse_retry_after(" 1.5 "), 1.5);
  EXPECT_EQ(parse_retry_after("0"), 0.0);
  EXPECT_FALSE(parse_retry_after(""));
  EXPECT_FALSE(parse_retry_after("-1"));
  EXPECT_FALSE(parse_retry_after("1e3"));
  EXPECT_FALSE(parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT"));
  EXPECT_FALSE(parse_retry_after("100000"));  // past a day
}

TEST(BenchServeClient, UrlParsing) {
  Result<ServeUrl> url = parse_serve_url("http://localhost:8000/v1/");
  ASSERT_TRUE(url.ok());
  EXPECT_EQ(url->host, "localhost");
  EXPECT_EQ(url->port, 8000);
  EXPECT_EQ(url->prefix, "");
  url = parse_serve_url("http://10.0.0.1/proxy");
  ASSERT_TRUE(url.ok());
  EXPECT_EQ(url->port, 80);
  EXPECT_EQ(url->prefix, "/proxy");
  url = parse_serve_url("https://example.com");
  ASSERT_TRUE(url.ok());
  EXPECT_EQ(url->scheme, "https");
  EXPECT_EQ(url->port, 443);
  EXPECT_FALSE(parse_serve_url("ftp://example.com").ok());
  EXPECT_FALSE(parse_serve_url("http://host:0").ok());
  EXPECT_FALSE(parse_serve_url("http://host:99999").ok());
  EXPECT_FALSE(parse_serve_url("http://:80").ok());
  EXPECT_TRUE(contains(parse_serve_url("http://h:x1").status().message(), "'x1'"));
}

}  // namespace
}  // namespace kvvm::cli
