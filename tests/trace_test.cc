// The trace generator (seeded, ShareGPT-like log-normal lengths, Poisson arrivals, tenants,
// clamping to the max context) and the JSONL reader (every malformed line reported with its
// line number, the rest kept).
#include "trace.h"

#include <gtest/gtest.h>

#include <cmath>
#include <sstream>
#include <string>

namespace kvvm::cli {
namespace {

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST(TraceGenerator, SameSeedSameTraceOtherSeedAnother) {
  TraceGeneratorOptions options;
  options.requests = 200;
  const Trace a = *generate_trace(options);
  const Trace b = *generate_trace(options);
  options.seed = 2;
  const Trace c = *generate_trace(options);
  ASSERT_EQ(a.requests.size(), 200u);
  bool differs = false;
  for (std::size_t i = 0; i < a.requests.size(); ++i) {
    EXPECT_EQ(a.requests[i].arrival_s, b.requests[i].arrival_s);
    EXPECT_EQ(a.requests[i].prompt_tokens, b.requests[i].prompt_tokens);
    EXPECT_EQ(a.requests[i].output_tokens, b.requests[i].output_tokens);
    EXPECT_EQ(a.requests[i].prefix_group, b.requests[i].prefix_group);
    differs = differs || a.requests[i].prompt_tokens != c.requests[i].prompt_tokens;
  }
  EXPECT_TRUE(differs);
}

TEST(TraceGenerator, MeansMatchTheShareGptParametersAndTheRate) {
  TraceGeneratorOptions options;
  options.requests = 40000;
  options.rate = 25;
  options.tenants = 0;             // no system prompt: the prompt is the user prompt
  options.max_context = 1u << 30;  // nothing clamped
  const Trace trace = *generate_trace(options);
  double prompt = 0, output = 0;
  for (const TraceRequest& r : trace.requests) {
    prompt += static_cast<double>(r.prompt_tokens);
    output += static_cast<double>(r.output_tokens);
    EXPECT_EQ(r.prefix_group, kNoPrefixGroup);
  }
  const double n = static_cast<double>(trace.requests.size());
  EXPECT_NEAR(prompt / n, kShareGptPromptMean, 0.05 * kShareGptPromptMean);
  EXPECT_NEAR(output / n, kShareGptOutputMean, 0.05 * kShareGptOutputMean);
  // Poisson arrivals: n requests at rate r take about n / r seconds.
  EXPECT_NEAR(trace.requests.back().arrival_s, n / options.rate, 0.03 * n / options.rate);
  for (std::size_t i = 1; i < trace.requests.size(); ++i) {
    ASSERT_GE(trace.requests[i].arrival_s, trace.requests[i - 1].arrival_s);
  }
}

TEST(TraceGenerator, LognormalMuIsLnMeanMinusHalfSigmaSquared) {
  EXPECT_DOUBLE_EQ(lognormal_mu(100, 0), std::log(100.0));
  EXPECT_NEAR(lognormal_mu(kShareGptPromptMean, 1.0), 4.5834, 1e-3);
  EXPECT_NEAR(lognormal_mu(kShareGptOutputMean, 0.8), 5.5030, 1e-3);
}

TEST(TraceGenerator, TenantsShareTheirSystemPromptAndLengthsAreClamped) {
  TraceGeneratorOptions options;
  options.requests = 2000;
  options.tenants = 3;
  options.system_prompt_tokens = 100;
  options.max_context = 300;
  options.prompt_sigma = 2.0;  // long tails, so clamping happens
  options.output_sigma = 2.0;
  const Trace trace = *generate_trace(options);
  ASSERT_EQ(trace.groups.size(), 3u);
  bool clamped = false;
  for (const TraceRequest& r : trace.requests) {
    ASSERT_GE(r.prefix_group, 0);
    ASSERT_LT(r.prefix_group, 3);
    EXPECT_EQ(r.prefix_tokens, 100u);
    EXPECT_GE(r.prompt_tokens, 101u);
    EXPECT_GE(r.output_tokens, 1u);
    EXPECT_LE(r.prompt_tokens + r.output_tokens, 300u);
    clamped = clamped || r.prompt_tokens + r.output_tokens == 300;
  }
  EXPECT_TRUE(clamped);
}

TEST(TraceGenerator, DurationBoundsTheArrivals) {
  TraceGeneratorOptions options;
  options.duration_s = 10.0;
  options.rate = 50;
  const Trace trace = *generate_trace(options);
  EXPECT_GT(trace.requests.size(), 400u);
  EXPECT_LT(trace.requests.size(), 600u);
  EXPECT_LT(trace.requests.back().arrival_s, 10.0);
}

TEST(TraceGenerator, RefusesOptionsThatMakeNoSense) {
  TraceGeneratorOptions options;
  options.rate = 0;
  EXPECT_TRUE(contains(generate_trace(options).status().message(), "--rate"));
  options = {};
  options.requests = 0;
  EXPECT_TRUE(contains(generate_trace(options).status().message(), "--requests"));
  options = {};
  options.system_prompt_tokens = 8191;
  const Status status = generate_trace(options).status();
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(contains(status.message(), "8191")) << status.message();
}

TEST(TraceJsonl, ReadsEveryFormAndSortsByArrival) {
  std::istringstream in(
      "{\"arrival\": 2.5, \"prompt_tokens\": 10, \"output_tokens\": 5}\n"
      "\n"
      "{\"arrival\": 1, \"prompt\": [1, 2, 3], \"output_tokens\": 2, \"prefix_group\": \"a\", "
      "\"prefix_tokens\": 2}\r\n"
      "{\"arrival\": 0, \"prompt_tokens\": 8, \"output_tokens\": 1, \"prefix_group\": \"b\", "
      "\"prefix_tokens\": 8}\n"
      "{\"arrival\": 1, \"prompt_tokens\": 4, \"output_tokens\": 1, \"prefix_group\": \"a\", "
      "\"prefix_tokens\": 2}\n");
  const Trace trace = *read_jsonl_trace(in, "t.jsonl", 100);
  EXPECT_TRUE(trace.errors.empty());
  EXPECT_EQ(trace.lines_read, 4u);
  ASSERT_EQ(trace.requests.size(), 4u);
  EXPECT_EQ(trace.requests[0].arrival_s, 0);
  EXPECT_EQ(trace.requests[1].prompt_tokens, 3u);  // the ids' length; ties keep file order
  EXPECT_EQ(trace.requests[2].prompt_tokens, 4u);
  EXPECT_EQ(trace.requests[3].output_tokens, 5u);
  EXPECT_EQ(trace.requests[3].prefix_group, kNoPrefixGroup);
  ASSERT_EQ(trace.groups.size(), 2u);
  EXPECT_EQ(trace.requests[1].prefix_group, trace.requests[2].prefix_group);
  EXPECT_EQ(trace.groups[static_cast<std::size_t>(trace.requests[1].prefix_group)], "a");
}

TEST(TraceJsonl, MalformedLinesAreReportedWithTheirNumbersAndTheRestKept) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"{\"arrival\": 0, \"prompt_tokens\": 4", "not valid JSON"},
      {"[1, 2]", "expected a JSON object"},
      {"{\"prompt_tokens\": 4, \"output_tokens\": 1}", "missing \"arrival\""},
      {"{\"arrival\": -1, \"prompt_tokens\": 4, \"output_tokens\": 1}", "\"arrival\" must be"},
      {"{\"arrival\": \"soon\", \"prompt_tokens\": 4, \"output_tokens\": 1}", "\"arrival\""},
      {"{\"arrival\": 0, \"output_tokens\": 1}", "missing \"prompt_tokens\""},
      {"{\"arrival\": 0, \"prompt_tokens\": 4, \"prompt\": [1], \"output_tokens\": 1}", "not both"},
      {"{\"arrival\": 0, \"prompt_tokens\": 1.5, \"output_tokens\": 1}", "fractional"},
      {"{\"arrival\": 0, \"prompt_tokens\": 0, \"output_tokens\": 1}", "at least 1"},
      {"{\"arrival\": 0, \"prompt\": [1, -2], \"output_tokens\": 1}", "\"prompt\"[1]"},
      {"{\"arrival\": 0, \"prompt\": [], \"output_tokens\": 1}", "empty"},
      {"{\"arrival\": 0, \"prompt_tokens\": 4}", "missing \"output_tokens\""},
      {"{\"arrival\": 0, \"prompt_tokens\": 90, \"output_tokens\": 20}", "max context of 100"},
      {"{\"arrival\": 0, \"prompt_tokens\": 4, \"output_tokens\": 1, \"prefix_group\": \"a\"}",
       "without \"prefix_tokens\""},
      {"{\"arrival\": 0, \"prompt_tokens\": 4, \"output_tokens\": 1, \"prefix_tokens\": 2}",
       "without \"prefix_group\""},
      {"{\"arrival\": 0, \"prompt_tokens\": 4, \"output_tokens\": 1, \"prefix_group\": \"a\", "
       "\"prefix_tokens\": 5}",
       "longer than the prompt"},
      {"{\"arrival\": 0, \"prompt_tokens\": 4, \"output_tokens\": 1, \"prefix_group\": 7, "
       "\"prefix_tokens\": 2}",
       "non-empty string"},
      {"{\"arrival\": 0, \"promt_tokens\": 4, \"output_tokens\": 1}",
       "unknown key \"promt_tokens\""},
  };
  std::string text = "{\"arrival\": 0, \"prompt_tokens\": 4, \"output_tokens\": 1}\n";
  for (const auto& [line, why] : cases) text += line + "\n";
  text += "{\"arrival\": 3, \"prompt_tokens\": 4, \"output_tokens\": 1}\n";
  std::istringstream in(text);
  const Trace trace = *read_jsonl_trace(in, "bad.jsonl", 100);
  EXPECT_EQ(trace.requests.size(), 2u);
  ASSERT_EQ(trace.errors.size(), cases.size());
  for (std::size_t i = 0; i < cases.size(); ++i) {
    const std::string prefix = "bad.jsonl:" + std::to_string(i + 2) + ": ";
    EXPECT_EQ(trace.errors[i].rfind(prefix, 0), 0u) << trace.errors[i];
    EXPECT_TRUE(contains(trace.errors[i], cases[i].second))
        << "line " << i + 2 << ": " << trace.errors[i] << "\nexpected: " << cases[i].second;
  }
}

TEST(TraceJsonl, WhatIsWrittenReadsBackTheSame) {
  TraceGeneratorOptions options;
  options.requests = 50;
  const Trace trace = *generate_trace(options);
  std::stringstream text;
  write_jsonl_trace(trace, text);
  const Trace back = *read_jsonl_trace(text, "back", options.max_context);
  ASSERT_TRUE(back.errors.empty()) << back.errors.front();
  ASSERT_EQ(back.requests.size(), trace.requests.size());
  for (std::size_t i = 0; i < trace.requests.size(); ++i) {
    EXPECT_DOUBLE_EQ(back.requests[i].arrival_s, trace.requests[i].arrival_s);
    EXPECT_EQ(back.requests[i].prompt_tokens, trace.requests[i].prompt_tokens);
    EXPECT_EQ(back.requests[i].output_tokens, trace.requests[i].output_tokens);
    EXPECT_EQ(back.requests[i].prefix_tokens, trace.requests[i].prefix_tokens);
    EXPECT_EQ(back.groups[static_cast<std::size_t>(back.requests[i].prefix_group)],
              trace.groups[static_cast<std::size_t>(trace.requests[i].prefix_group)]);
  }
}

}  // namespace
}  // namespace kvvm::cli
