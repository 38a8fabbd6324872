// The trace generator (seeded, ShareGPT-like log-normal lengths, Poisson arrivals, tenants,
// clamping to the max context) and the JSONL reader (every malformed line reported with its
// line number, the rest kept).
#include "sim/trace.h"

#include <gtest/gtest.h>

#include <cmath>
#include <sstream>
#include <string>

#include "support/text_match.h"

namespace kvvm::cli {
namespace {

using test::contains;

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

TEST(TraceJsonl, ReadsEveryFormInArrivalOrder) {
  std::istringstream in(
      "{\"arrival\": 0, \"prompt_tokens\": 8, \"output_tokens\": 1, \"prefix_group\": \"b\", "
      "\"prefix_tokens\": 8}\n"
      "\n"
      "{\"arrival\": 1, \"prompt\": [1, 2, 3], \"output_tokens\": 2, \"prefix_group\": \"a\", "
      "\"prefix_tokens\": 2}\r\n"
      "{\"arrival\": 1, \"prompt_tokens\": 4, \"output_tokens\": 1, \"prefix_group\": \"a\", "
      "\"prefix_tokens\": 2}\n"
      "{\"arrival\": 2.5, \"prompt_tokens\": 10, \"output_tokens\": 5}\n");
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
  EXPECT_NE(trace.requests[0].prefix_group, trace.requests[1].prefix_group);
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

TEST(TraceJsonl, ArrivalsThatDecreaseOrPassTheBoundAreRefusedWithTheirLine) {
  std::istringstream in(
      "{\"arrival\": 0, \"prompt_tokens\": 4, \"output_tokens\": 1}\n"
      "{\"arrival\": 5, \"prompt_tokens\": 4, \"output_tokens\": 1}\n"
      "{\"arrival\": 2, \"prompt_tokens\": 4, \"output_tokens\": 1}\n"
      "{\"arrival\": 1e308, \"prompt_tokens\": 4, \"output_tokens\": 1}\n"
      "{\"arrival\": 1e400, \"prompt_tokens\": 4, \"output_tokens\": 1}\n"
      "{\"arrival\": 10000000, \"prompt_tokens\": 4, \"output_tokens\": 1}\n");
  const Trace trace = *read_jsonl_trace(in, "t.jsonl", 100);
  ASSERT_EQ(trace.requests.size(), 3u);
  EXPECT_EQ(trace.requests.back().arrival_s, 1e7);  // the bound itself is kept
  ASSERT_EQ(trace.errors.size(), 3u);
  EXPECT_EQ(trace.errors[0],
            "t.jsonl:3: \"arrival\" 2 is earlier than 5 on line 2: arrivals must not decrease");
  EXPECT_EQ(trace.errors[1],
            "t.jsonl:4: \"arrival\" 1e+308 is past the bound of 10000000 seconds (about 116 days)");
  EXPECT_TRUE(contains(trace.errors[2], "t.jsonl:5: not valid JSON")) << trace.errors[2];
  EXPECT_TRUE(contains(trace.errors[2], "1e400")) << trace.errors[2];
}

TEST(TraceJsonl, HostileLinesAreRefusedNotCrashedOn) {
  const std::string ok = "{\"arrival\": 0, \"prompt_tokens\": 4, \"output_tokens\": 1}\n";
  std::string text = ok;
  // 100,000 nested arrays in a whole document: once built, dump() for the error message
  // recursed through them and overflowed the stack.
  text += "{\"arrival\": " + std::string(100000, '[') + std::string(100000, ']') +
          ", \"prompt_tokens\": 4, \"output_tokens\": 1}\n";
  text += "{\"arrival\": 0, \"prompt_tokens\": 4, \"output_tokens\": \"\xff\"}\n";
  text += "{\"arrival\": 0, \"prompt_tokens\": 4, \"output_tokens\": 18446744073709551616}\n";
  text += "{\"arrival\": 0, \"prompt_tokens\": 4, \"output_tokens\": 1, \"prefix_group\": \"" +
          std::string(300, 'g') + "\", \"prefix_tokens\": 1}\n";
  text += "{\"arrival\": 0, \"prompt_tokens\": 4, \"output_tokens\": 1" +
          std::string(kMaxTraceLineBytes, ' ') + "}\n";
  text += ok;
  std::istringstream in(text);
  const Trace trace = *read_jsonl_trace(in, "h.jsonl", 100);
  EXPECT_EQ(trace.requests.size(), 2u);
  EXPECT_EQ(trace.lines_read, 7u);
  const std::vector<std::string> expected = {
      "h.jsonl:2: nested deeper than the limit of 64 levels at byte 75 (column 76)",
      "h.jsonl:3: invalid UTF-8 at byte 53 (column 54): byte 0xFF",
      "h.jsonl:4: \"output_tokens\" must be a whole number of tokens, got a number out of range",
      "h.jsonl:5: \"prefix_group\" is 300 bytes long, over the bound of 256",
      "h.jsonl:6: line longer than the bound of 16777216 bytes",
  };
  ASSERT_EQ(trace.errors.size(), expected.size());
  for (std::size_t i = 0; i < expected.size(); ++i) {
    EXPECT_TRUE(contains(trace.errors[i], expected[i])) << trace.errors[i];
  }
}

TEST(TraceJsonl, PrefixGroupsAndMaxContextAreBounded) {
  std::string text;
  for (std::uint64_t g = 0; g <= kMaxPrefixGroups; ++g) {
    text += "{\"arrival\": 0, \"prompt_tokens\": 4, \"output_tokens\": 1, \"prefix_group\": \"g" +
            std::to_string(g) + "\", \"prefix_tokens\": 1}\n";
  }
  std::istringstream in(text);
  const Trace trace = *read_jsonl_trace(in, "g.jsonl", 100);
  EXPECT_EQ(trace.groups.size(), kMaxPrefixGroups);
  ASSERT_EQ(trace.errors.size(), 1u);
  EXPECT_TRUE(contains(trace.errors[0], "g.jsonl:65537: \"prefix_group\" \"g65536\""))
      << trace.errors[0];
  EXPECT_TRUE(contains(trace.errors[0], "over the bound of 65536")) << trace.errors[0];

  std::istringstream empty("");
  const Status status = read_jsonl_trace(empty, "x", kMaxContextTokens + 1).status();
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(contains(status.message(), "1073741825")) << status.message();
  EXPECT_TRUE(contains(status.message(), "1073741824")) << status.message();
}

TEST(TraceGenerator, RefusesOptionsPastTheBounds) {
  const auto refused = [](const TraceGeneratorOptions& options, const std::string& part) {
    const Status status = generate_trace(options).status();
    EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << part;
    EXPECT_TRUE(contains(status.message(), part)) << status.message();
  };
  TraceGeneratorOptions options;
  options.rate = 1e-9;  // the first arrival lands near 1e9 s
  options.requests = 10;
  refused(options, "--rate 1e-09 puts request 1 at");
  refused(options, "past the bound of 10000000 s");
  options = {};
  options.duration_s = 1e8;
  options.rate = 1e-6;
  refused(options, "--duration 100000000 s is over the bound of 10000000 s");
  options = {};
  options.duration_s = 1e6;
  options.rate = 1e3;
  refused(options, "over the bound of 50000000");
  options = {};
  options.tenants = 1'000'000;
  refused(options, "--tenants 1000000 is over the bound of 65536");
  options = {};
  options.max_context = kMaxContextTokens * 2;
  refused(options, "--max-context 2147483648 is over the bound of 1073741824");

  ChatGeneratorOptions chat;
  chat.conversations = 10;
  const auto chat_refused = [](const TraceGeneratorOptions& generator,
                               const ChatGeneratorOptions& c, const std::string& part) {
    const Status status = generate_chat_trace(generator, c).status();
    EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << part;
    EXPECT_TRUE(contains(status.message(), part)) << status.message();
  };
  options = {};
  options.rate = 1e-9;
  chat_refused(options, chat, "puts conversation 1 at");
  options = {};
  chat.turns = 20000;
  chat_refused(options, chat, "--turns 20000 is over the bound of 10000");
  chat.turns = 8;
  chat.think_s = 1e9;
  chat_refused(options, chat, "--think-s 1000000000 is over the bound");
  // Each think time is under the bound, their sum over 1000 turns is not.
  chat.conversations = 1;
  chat.turns = 1000;
  chat.think_s = 1e5;
  options.max_context = kMaxContextTokens;
  chat_refused(options, chat, "--think-s 100000 puts turn");
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
