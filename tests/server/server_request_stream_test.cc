// The channel from the engine's callbacks to an HTTP handler: it copies what an event holds
// (views valid during the callback only), merges what arrives between takes, and every wait
// on it is bounded.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "server/request_stream.h"

namespace kvvm::server {
namespace {

using Clock = std::chrono::steady_clock;

TEST(ServerRequestStream, CopiesAndMergesEventsUntilTheFinish) {
  auto stream = RequestStream::make();
  engine::RequestCallback callback = stream->callback();
  {
    std::string text = "Hel";
    std::vector<std::int32_t> tokens = {1, 2};
    engine::RequestEvent event;
    event.text = text;
    event.tokens = tokens;
    callback(event);
    text = "XXX";  // the event's view is gone after the callback
  }
  {
    std::string text = "lo";
    engine::RequestEvent event;
    event.text = text;
    std::vector<std::int32_t> tokens = {3};
    event.tokens = tokens;
    callback(event);
  }
  StreamUpdate first = stream->take(std::chrono::milliseconds(0));
  ASSERT_EQ(first.choices.size(), 1u);
  EXPECT_EQ(first.choices[0].text, "Hello");
  EXPECT_EQ(first.choices[0].ids, (std::vector<std::int32_t>{1, 2, 3}));
  EXPECT_FALSE(first.finished);

  engine::RequestStats stats;
  stats.prompt_tokens = 7;
  stats.generated_tokens = 3;
  engine::RequestEvent last;
  last.finished = true;
  last.end = engine::RequestEnd::kError;
  last.error = Status::ResourceExhausted("overloaded", {});
  last.retry_after_seconds = 2.5;
  last.stats = &stats;
  callback(last);
  callback(engine::RequestEvent{});  // nothing follows a finish

  StreamUpdate end = stream->take(std::chrono::milliseconds(0));
  EXPECT_TRUE(end.finished);
  EXPECT_TRUE(end.choices[0].finished);
  EXPECT_EQ(end.choices[0].end, engine::RequestEnd::kError);
  EXPECT_EQ(end.choices[0].error.code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(end.choices[0].retry_after_seconds, 2.5);
  EXPECT_EQ(end.choices[0].stats.prompt_tokens, 7u);
  EXPECT_TRUE(stream->finished());
  // Taken once: later takes return at once, empty.
  const auto start = Clock::now();
  EXPECT_TRUE(stream->take(std::chrono::seconds(5)).empty());
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(1));
}

TEST(ServerRequestStream, GapsAreTimedBetweenEventsThatBringTokens) {
  auto stream = RequestStream::make();
  engine::RequestCallback callback = stream->callback();
  const std::vector<std::int32_t> token = {7};
  engine::RequestEvent with_token;
  with_token.tokens = token;
  callback(with_token);  // the first token: no gap before it
  EXPECT_TRUE(stream->inter_token_seconds().empty());
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  callback(engine::RequestEvent{});  // nothing new (held-back text): no gap
  callback(with_token);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  callback(with_token);
  engine::RequestEvent finish;
  finish.finished = true;
  finish.end = engine::RequestEnd::kStop;
  callback(finish);      // the finish brings no token: no gap
  callback(with_token);  // nothing follows a finish
  const std::vector<double> gaps = stream->inter_token_seconds();
  ASSERT_EQ(gaps.size(), 2u);
  EXPECT_GE(gaps[0], 0.02);
  EXPECT_GE(gaps[1], 0.02);
}

TEST(ServerRequestStream, WaitsAreBoundedAndWokenByAnEvent) {
  auto stream = RequestStream::make();
  auto start = Clock::now();
  EXPECT_TRUE(stream->take(std::chrono::milliseconds(30)).empty());
  EXPECT_GE(Clock::now() - start, std::chrono::milliseconds(30));

  engine::RequestCallback callback = stream->callback();
  std::thread engine_thread([callback] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    engine::RequestEvent event;
    event.text = "x";
    callback(event);
  });
  start = Clock::now();
  const StreamUpdate update = stream->take(std::chrono::seconds(10));
  engine_thread.join();
  EXPECT_EQ(update.choices[0].text, "x");
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(5));
}

TEST(ServerRequestStream, ChoicesOfSeveralRequestsEndTogether) {
  // Two engine requests of two choices each: the stream's choices 0-1 and 2-3.
  auto stream = RequestStream::make(4);
  engine::RequestCallback first = stream->callback(0);
  engine::RequestCallback second = stream->callback(2);
  const auto event = [](std::uint32_t index, const char* text, bool finished) {
    engine::RequestEvent e;
    e.index = index;
    e.text = text;
    e.finished = finished;
    e.end = engine::RequestEnd::kStop;
    return e;
  };
  second(event(1, "d", false));
  first(event(0, "a", true));
  first(event(0, "late", false));  // nothing follows a choice's finish
  StreamUpdate update = stream->take(std::chrono::milliseconds(0));
  ASSERT_EQ(update.choices.size(), 4u);
  EXPECT_EQ(update.choices[0].text, "a");
  EXPECT_TRUE(update.choices[0].finished);
  EXPECT_EQ(update.choices[3].text, "d");
  EXPECT_FALSE(update.finished);
  first(event(1, "b", true));
  second(event(0, "c", true));
  EXPECT_FALSE(stream->finished());
  second(event(1, "", true));
  EXPECT_TRUE(stream->finished());
  update = stream->take(std::chrono::milliseconds(0));
  EXPECT_TRUE(update.finished);
  EXPECT_EQ(update.choices[1].text, "b");
  EXPECT_EQ(update.choices[2].text, "c");
  EXPECT_TRUE(update.choices[3].finished);
  EXPECT_FALSE(update.choices[0].finished);  // taken before
  // An index past the stream's choices is dropped, never a crash.
  auto small = RequestStream::make(1);
  small->callback(0)(event(3, "x", true));
  EXPECT_FALSE(small->finished());
}

TEST(ServerRequestStream, PromptLogprobsSurviveTheEventsAfterThem) {
  auto stream = RequestStream::make();
  engine::RequestCallback callback = stream->callback();
  std::vector<model::RowLogprobs> prompt(3);
  prompt[1].target = 42;
  const std::vector<std::int32_t> token = {7};
  std::vector<model::RowLogprobs> row(1);
  engine::RequestEvent first;
  first.tokens = token;
  first.logprobs = row;
  first.prompt_logprobs = prompt;
  callback(first);
  engine::RequestEvent next;
  next.tokens = token;
  next.logprobs = row;
  callback(next);  // taken together with the first: the prompt's rows must stay
  const StreamUpdate update = stream->take(std::chrono::milliseconds(0));
  ASSERT_EQ(update.choices[0].prompt_logprobs.size(), 3u);
  EXPECT_EQ(update.choices[0].prompt_logprobs[1].target, 42);
  EXPECT_EQ(update.choices[0].ids.size(), 2u);
  EXPECT_EQ(update.choices[0].logprobs.size(), 2u);
}

TEST(ServerRequestStream, TheCallbackKeepsTheStreamAlive) {
  engine::RequestCallback callback;
  {
    auto stream = RequestStream::make();
    callback = stream->callback();
  }
  // The handler has gone (its client left); the engine's late events land safely.
  engine::RequestEvent event;
  event.finished = true;
  callback(event);
  SUCCEED();
}

}  // namespace
}  // namespace kvvm::server
