// A request of n choices on the CPU model: one prefill, the other choices forking its KV.
// Choice i is what n = 1 with seed + i gives (greedy: all alike), the prompt's KV is held once,
// each choice ends by its own rules, and a cancel or a fallback to admission loses nothing.
// Log-probabilities ride with the tokens: generated ones and the prompt's (echo), the same
// whatever the prefill's chunking.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "kvvm/engine/engine.h"
#include "kvvm/tokenizer/tokenizer.h"
#include "support/engine_harness.h"
#include "support/test_data.h"

namespace kvvm::engine::choices_test {
namespace {

using testing::expect_clean;
using testing::llama;
using testing::make_kv;
using testing::no_cache;
using testing::Outcome;
using testing::rig_prompt;

// Every choice's outcome, by (request, index), and the log-probabilities that came with them.
struct Choices {
  std::map<std::pair<RequestId, std::uint32_t>, Outcome> outcomes;
  std::map<std::pair<RequestId, std::uint32_t>, std::vector<model::RowLogprobs>> logprobs;
  std::map<std::pair<RequestId, std::uint32_t>, std::vector<model::RowLogprobs>> prompt_logprobs;
  std::map<std::pair<RequestId, std::uint32_t>, int> prompt_logprob_events;

  RequestCallback callback() {
    return [this](const RequestEvent& event) {
      const auto key = std::make_pair(event.id, event.index);
      testing::record(outcomes[key], event);
      auto& rows = logprobs[key];
      rows.insert(rows.end(), event.logprobs.begin(), event.logprobs.end());
      if (!event.prompt_logprobs.empty()) {
        prompt_logprobs[key].assign(event.prompt_logprobs.begin(), event.prompt_logprobs.end());
        ++prompt_logprob_events[key];
      }
    };
  }
  const Outcome& at(RequestId id, std::uint32_t index) { return outcomes[{id, index}]; }
};

EngineRequest request_of(std::vector<std::int32_t> prompt, std::uint32_t n,
                         std::uint32_t max_tokens, float temperature = 0, std::uint64_t seed = 0) {
  EngineRequest request;
  request.prompt = std::move(prompt);
  request.n = n;
  request.max_tokens = max_tokens;
  request.use_model_eos = false;
  request.sampling.temperature = temperature;
  request.sampling.seed = seed;
  return request;
}

// Runs `requests` on a fresh engine over `kv`; returns their ids.
std::vector<RequestId> run(KvSpace& kv, const EngineOptions& options,
                           const std::vector<EngineRequest>& requests, Choices& choices,
                           EngineStats* stats = nullptr) {
  std::vector<RequestId> ids;
  auto engine = Engine::create(*llama().model, kv, options);
  EXPECT_TRUE(engine.ok()) << engine.status().to_string();
  if (!engine.ok()) return ids;
  for (const EngineRequest& request : requests) {
    auto id = (*engine)->submit(request, choices.callback());
    EXPECT_TRUE(id.ok()) << id.status().to_string();
    if (id.ok()) ids.push_back(*id);
  }
  EXPECT_TRUE((*engine)->run_until_idle().ok());
  if (stats != nullptr) *stats = (*engine)->stats();
  return ids;
}

// The tokens of choice 0 of a request of n = 1 with `seed`.
std::vector<std::int32_t> alone(const std::vector<std::int32_t>& prompt, std::uint32_t max_tokens,
                                float temperature, std::uint64_t seed,
                                EngineOptions options = no_cache()) {
  auto kv = make_kv(llama().config, 4);
  Choices choices;
  const auto ids =
      run(*kv, options, {request_of(prompt, 1, max_tokens, temperature, seed)}, choices);
  expect_clean(*kv);
  return ids.empty() ? std::vector<std::int32_t>{} : choices.at(ids[0], 0).tokens;
}

TEST(EngineChoices, GreedyChoicesAreAlikeAndEqualOneChoice) {
  const std::vector<std::int32_t> prompt = rig_prompt(21, 1);
  const std::vector<std::int32_t> one = alone(prompt, 12, 0, 0);
  ASSERT_EQ(one.size(), 12u);
  auto kv = make_kv(llama().config, 8);
  Choices choices;
  EngineStats stats;
  const auto ids = run(*kv, no_cache(), {request_of(prompt, 4, 12)}, choices, &stats);
  ASSERT_EQ(ids.size(), 1u);
  for (std::uint32_t i = 0; i < 4; ++i) {
    const Outcome& o = choices.at(ids[0], i);
    EXPECT_EQ(o.finished_events, 1) << "choice " << i;
    EXPECT_EQ(o.end, RequestEnd::kLength) << "choice " << i << ": " << o.error.to_string();
    EXPECT_EQ(o.tokens, one) << "choice " << i;
  }
  // One request, counted once; its prompt counted once; every choice's tokens.
  EXPECT_EQ(stats.finished, 1u);
  EXPECT_EQ(stats.prompt_tokens, prompt.size());
  EXPECT_EQ(stats.generated_tokens, 4u * 12u);
  EXPECT_EQ(stats.arena.forks, 3u);
  expect_clean(*kv);
}

// The fork is a byte-level copy-on-write of the parent's windows, whatever the element type:
// on an fp8 cache too, every greedy choice is the request of one choice on the same cache.
TEST(EngineChoices, OnAnFp8CacheGreedyChoicesEqualOneChoice) {
  const std::vector<std::int32_t> prompt = rig_prompt(21, 1);
  KvSpaceOptions options;
  options.kv_dtype = DType::kFp8;
  options.max_slots = 8;
  options.max_context = 128;
  options.host_granule = 0;  // the page: a window holds few tokens, so the fork shares windows
  std::vector<std::int32_t> one;
  {
    auto kv = make_kv(llama().config, options);
    ASSERT_NE(kv, nullptr);
    Choices choices;
    const auto ids = run(*kv, no_cache(), {request_of(prompt, 1, 12)}, choices);
    ASSERT_EQ(ids.size(), 1u);
    one = choices.at(ids[0], 0).tokens;
    expect_clean(*kv);
  }
  ASSERT_EQ(one.size(), 12u);
  auto kv = make_kv(llama().config, options);
  ASSERT_NE(kv, nullptr);
  Choices choices;
  EngineStats stats;
  const auto ids = run(*kv, no_cache(), {request_of(prompt, 3, 12)}, choices, &stats);
  ASSERT_EQ(ids.size(), 1u);
  for (std::uint32_t i = 0; i < 3; ++i) {
    EXPECT_EQ(choices.at(ids[0], i).tokens, one) << "choice " << i;
  }
  EXPECT_EQ(stats.arena.forks, 2u);
  expect_clean(*kv);
}

TEST(EngineChoices, SeededChoiceIDrawsAsOneChoiceWithSeedPlusI) {
  const std::vector<std::int32_t> prompt = rig_prompt(17, 2);
  constexpr std::uint64_t kSeed = 1234;
  auto kv = make_kv(llama().config, 8);
  Choices choices;
  const auto ids = run(*kv, no_cache(), {request_of(prompt, 3, 16, 1.0f, kSeed)}, choices);
  ASSERT_EQ(ids.size(), 1u);
  std::vector<std::vector<std::int32_t>> got;
  for (std::uint32_t i = 0; i < 3; ++i) {
    got.push_back(choices.at(ids[0], i).tokens);
    EXPECT_EQ(got.back(), alone(prompt, 16, 1.0f, kSeed + i)) << "choice " << i;
  }
  EXPECT_NE(got[0], got[1]);
  EXPECT_NE(got[1], got[2]);
  expect_clean(*kv);
}

TEST(EngineChoices, ThePromptsKvIsHeldOnce) {
  // A prompt of many windows: four separate requests hold it four times, four choices once
  // (plus each fork's copied boundary window and what each generates).
  const std::vector<std::int32_t> prompt = rig_prompt(96, 3);
  const auto peak_bytes = [&](bool as_choices) {
    auto kv = make_kv(llama().config, 8);
    auto engine = Engine::create(*llama().model, *kv, no_cache());
    EXPECT_TRUE(engine.ok());
    Choices choices;
    if (as_choices) {
      EXPECT_TRUE((*engine)->submit(request_of(prompt, 4, 4), choices.callback()).ok());
    } else {
      for (int i = 0; i < 4; ++i) {
        EXPECT_TRUE((*engine)->submit(request_of(prompt, 1, 4), choices.callback()).ok());
      }
    }
    std::uint64_t peak = 0;
    for (int s = 0; s < 200; ++s) {
      Result<bool> more = (*engine)->step();
      EXPECT_TRUE(more.ok());
      peak = std::max(peak, (*engine)->stats().arena.physical_bytes);
      if (!more.ok() || !*more) break;
    }
    engine->reset();
    expect_clean(*kv);
    return peak;
  };
  const std::uint64_t forked = peak_bytes(true);
  const std::uint64_t separate = peak_bytes(false);
  ASSERT_GT(separate, 0u);
  EXPECT_LT(static_cast<double>(forked), 0.5 * static_cast<double>(separate))
      << forked << " bytes as 4 choices, " << separate << " as 4 requests";
}

TEST(EngineChoices, OneChoiceStoppingLeavesTheOthersRunning) {
  auto tokenizer =
      tokenizer::Tokenizer::load(test::model_fixture_dir("llama-tiny") + "/tokenizer.json");
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status().to_string();
  EngineOptions options = no_cache();
  options.tokenizer = tokenizer->get();
  const std::vector<std::int32_t> prompt = rig_prompt(13, 4);
  constexpr std::uint64_t kSeed = 99;
  auto kv = make_kv(llama().config, 8);
  Choices plain;
  const auto first = run(*kv, options, {request_of(prompt, 3, 24, 1.0f, kSeed)}, plain);
  ASSERT_EQ(first.size(), 1u);
  const std::string text0 = plain.at(first[0], 0).text;
  const std::string text1 = plain.at(first[0], 1).text;
  // A piece of choice 0's text that choice 1's never holds.
  std::string stop;
  for (std::size_t at = text0.size() / 3; at + 3 <= text0.size() && stop.empty(); ++at) {
    const std::string piece = text0.substr(at, 3);
    if (text1.find(piece) == std::string::npos) stop = piece;
  }
  ASSERT_FALSE(stop.empty()) << "choices 0 and 1 share every piece: '" << text0 << "' '" << text1
                             << "'";
  EngineRequest request = request_of(prompt, 3, 24, 1.0f, kSeed);
  request.stop_strings = {stop};
  Choices cut;
  const auto second = run(*kv, options, {request}, cut);
  ASSERT_EQ(second.size(), 1u);
  EXPECT_EQ(cut.at(second[0], 0).end, RequestEnd::kStop);
  EXPECT_EQ(cut.at(second[0], 0).text, text0.substr(0, text0.find(stop)));
  EXPECT_EQ(cut.at(second[0], 1).end, plain.at(first[0], 1).end);
  EXPECT_EQ(cut.at(second[0], 1).text, text1);
  EXPECT_EQ(cut.at(second[0], 1).tokens, plain.at(first[0], 1).tokens);
  expect_clean(*kv);
}

TEST(EngineChoices, CancelEndsEveryChoiceAndFreesTheirKv) {
  auto kv = make_kv(llama().config, 8);
  Choices choices;
  {
    auto engine = Engine::create(*llama().model, *kv, no_cache());
    ASSERT_TRUE(engine.ok());
    auto id = (*engine)->submit(request_of(rig_prompt(30, 5), 4, 60), choices.callback());
    ASSERT_TRUE(id.ok());
    // Until every choice has a token: the forks are running.
    for (int s = 0; s < 100; ++s) {
      ASSERT_TRUE((*engine)->step().ok());
      bool all = true;
      for (std::uint32_t i = 0; i < 4; ++i) all = all && !choices.at(*id, i).tokens.empty();
      if (all) break;
    }
    EXPECT_EQ((*engine)->stats().arena.active_slots, 4u);
    (*engine)->cancel(*id);
    ASSERT_TRUE((*engine)->step().ok());
    for (std::uint32_t i = 0; i < 4; ++i) {
      EXPECT_EQ(choices.at(*id, i).end, RequestEnd::kCancelled) << "choice " << i;
      EXPECT_EQ(choices.at(*id, i).finished_events, 1) << "choice " << i;
    }
    EXPECT_EQ((*engine)->stats().arena.active_slots, 0u);
  }
  expect_clean(*kv);
}

TEST(EngineChoices, CancelBeforeTheForkEndsTheWaitingChoices) {
  auto kv = make_kv(llama().config, 8);
  Choices choices;
  {
    auto engine = Engine::create(*llama().model, *kv, no_cache());
    ASSERT_TRUE(engine.ok());
    auto id = (*engine)->submit(request_of(rig_prompt(30, 6), 3, 8), choices.callback());
    ASSERT_TRUE(id.ok());
    (*engine)->cancel(*id);
    ASSERT_TRUE((*engine)->run_until_idle().ok());
    for (std::uint32_t i = 0; i < 3; ++i) {
      EXPECT_EQ(choices.at(*id, i).end, RequestEnd::kCancelled) << "choice " << i;
      EXPECT_EQ(choices.at(*id, i).finished_events, 1) << "choice " << i;
    }
  }
  expect_clean(*kv);
}

TEST(EngineChoices, ChoicesPastTheRunningLimitAdmitOnTheirOwnWithTheSameTokens) {
  const std::vector<std::int32_t> prompt = rig_prompt(19, 7);
  constexpr std::uint64_t kSeed = 5;
  for (const bool cache : {false, true}) {
    auto kv = make_kv(llama().config, 8);
    EngineOptions options;
    options.prefix_cache = cache;
    options.max_running = 2;  // two choices fork, the other two wait for a place
    Choices choices;
    EngineStats stats;
    const auto ids = run(*kv, options, {request_of(prompt, 4, 10, 0.8f, kSeed)}, choices, &stats);
    ASSERT_EQ(ids.size(), 1u);
    EXPECT_EQ(stats.arena.forks, 1u) << "cache " << cache;
    for (std::uint32_t i = 0; i < 4; ++i) {
      EXPECT_EQ(choices.at(ids[0], i).tokens, alone(prompt, 10, 0.8f, kSeed + i))
          << "choice " << i << ", cache " << cache;
    }
    expect_clean(*kv);
  }
}

TEST(EngineChoices, ZeroChoicesAndManyWithNoTokensAreRefused) {
  auto kv = make_kv(llama().config, 4);
  auto engine = Engine::create(*llama().model, *kv, no_cache());
  ASSERT_TRUE(engine.ok());
  EngineRequest none = request_of(rig_prompt(4, 8), 0, 4);
  Result<RequestId> refused = (*engine)->submit(none, nullptr);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(refused.status().message().starts_with("n: 0")) << refused.status().message();
  EngineRequest prefill = request_of(rig_prompt(4, 8), 2, 0);
  prefill.prompt_logprobs = true;
  refused = (*engine)->submit(prefill, nullptr);
  ASSERT_FALSE(refused.ok());
  EXPECT_TRUE(refused.status().message().starts_with("n: 2")) << refused.status().message();
  EngineRequest wide = request_of(rig_prompt(4, 8), 1, 4);
  wide.logprobs = model::kMaxTopLogprobs + 1;
  refused = (*engine)->submit(wide, nullptr);
  ASSERT_FALSE(refused.ok());
  EXPECT_TRUE(refused.status().message().starts_with("logprobs: 21")) << refused.status().message();
}

// The log-softmax of the logits at the prompt's last position, in double.
std::vector<double> log_softmax_after(const std::vector<std::int32_t>& prompt) {
  auto kv = make_kv(llama().config, 4);
  auto engine = Engine::create(*llama().model, *kv, no_cache());
  EXPECT_TRUE(engine.ok());
  std::vector<float> logits;
  EngineRequest request = request_of(prompt, 1, 0);
  request.keep_prompt_logits = true;
  EXPECT_TRUE((*engine)
                  ->submit(request,
                           [&](const RequestEvent& event) {
                             if (event.finished) {
                               logits.assign(event.prompt_logits.begin(),
                                             event.prompt_logits.end());
                             }
                           })
                  .ok());
  EXPECT_TRUE((*engine)->run_until_idle().ok());
  double max = -INFINITY;
  for (const float v : logits) max = std::max(max, static_cast<double>(v));
  double sum = 0;
  for (const float v : logits) sum += std::exp(static_cast<double>(v) - max);
  std::vector<double> out(logits.size());
  for (std::size_t i = 0; i < logits.size(); ++i) {
    out[i] = static_cast<double>(logits[i]) - max - std::log(sum);
  }
  return out;
}

TEST(EngineLogprobs, EveryTokenCarriesItsLogprobAndAlternatives) {
  const std::vector<std::int32_t> prompt = rig_prompt(11, 9);
  auto kv = make_kv(llama().config, 4);
  Choices choices;
  EngineRequest request = request_of(prompt, 1, 6);
  request.logprobs = 5;
  const auto ids = run(*kv, no_cache(), {request}, choices);
  ASSERT_EQ(ids.size(), 1u);
  const std::vector<std::int32_t>& tokens = choices.at(ids[0], 0).tokens;
  const std::vector<model::RowLogprobs>& rows = choices.logprobs[{ids[0], 0}];
  ASSERT_EQ(tokens.size(), 6u);
  ASSERT_EQ(rows.size(), tokens.size());
  std::vector<std::int32_t> context = prompt;
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    // Greedy: the token is the most likely one, its log-probability the top one's.
    EXPECT_EQ(rows[i].target, tokens[i]) << "token " << i;
    ASSERT_EQ(rows[i].top, 5u);
    EXPECT_EQ(rows[i].top_ids[0], tokens[i]) << "token " << i;
    EXPECT_EQ(rows[i].top_logprobs[0], rows[i].logprob) << "token " << i;
    // Against a float64 log-softmax of the same logits.
    const std::vector<double> reference = log_softmax_after(context);
    EXPECT_NEAR(rows[i].logprob, reference[tokens[i]], 1e-5) << "token " << i;
    for (std::uint32_t k = 0; k < 5; ++k) {
      EXPECT_NEAR(rows[i].top_logprobs[k], reference[rows[i].top_ids[k]], 1e-5);
      if (k > 0) {
        EXPECT_GE(rows[i].top_logprobs[k - 1], rows[i].top_logprobs[k]);
      }
    }
    context.push_back(tokens[i]);
  }
  expect_clean(*kv);
}

TEST(EngineLogprobs, PromptLogprobsAreTheSameWhateverTheChunking) {
  const std::vector<std::int32_t> prompt = rig_prompt(40, 10);
  const auto prompt_rows = [&](std::uint32_t chunk, bool cache) {
    auto kv = make_kv(llama().config, 4);
    EngineOptions options;
    options.prefix_cache = cache;
    options.prefill_chunk = chunk;
    Choices choices;
    EngineRequest request = request_of(prompt, 1, 0);
    request.prompt_logprobs = true;
    request.logprobs = 2;
    RequestId id = 0;
    {
      auto engine = Engine::create(*llama().model, *kv, options);
      EXPECT_TRUE(engine.ok());
      // With the cache on, the prompt is cached first: scoring it must still compute every
      // token (cached ones have no logits).
      if (cache) {
        EXPECT_TRUE((*engine)->submit(request_of(prompt, 1, 2), choices.callback()).ok());
        EXPECT_TRUE((*engine)->run_until_idle().ok());
      }
      auto submitted = (*engine)->submit(request, choices.callback());
      EXPECT_TRUE(submitted.ok());
      id = submitted.ok() ? *submitted : 0;
      EXPECT_TRUE((*engine)->run_until_idle().ok());
      if (cache) {
        EXPECT_GT((*engine)->stats().prefix.published_windows, 0u);
      }
    }
    expect_clean(*kv);
    EXPECT_EQ(choices.prompt_logprob_events[std::make_pair(id, 0u)], 1);
    EXPECT_EQ(choices.at(id, 0).stats.cached_tokens, 0u);
    return choices.prompt_logprobs[std::make_pair(id, 0u)];
  };
  const std::vector<model::RowLogprobs> whole = prompt_rows(0, false);
  ASSERT_EQ(whole.size(), prompt.size() - 1);
  for (std::size_t j = 0; j < whole.size(); ++j) {
    EXPECT_EQ(whole[j].target, prompt[j + 1]) << "row " << j;
    EXPECT_EQ(whole[j].top, 2u);
    EXPECT_LE(whole[j].logprob, whole[j].top_logprobs[0] + 1e-6f);
  }
  // Row j against the log-softmax after the prompt's first j + 1 tokens.
  for (const std::size_t j : {std::size_t{0}, std::size_t{17}, whole.size() - 1}) {
    const std::vector<double> reference =
        log_softmax_after(std::vector<std::int32_t>(prompt.begin(), prompt.begin() + j + 1));
    EXPECT_NEAR(whole[j].logprob, reference[prompt[j + 1]], 1e-4) << "row " << j;
  }
  for (const auto& [chunk, cache] : {std::pair{7u, false}, std::pair{16u, true}}) {
    const std::vector<model::RowLogprobs> chunked = prompt_rows(chunk, cache);
    ASSERT_EQ(chunked.size(), whole.size()) << "chunk " << chunk;
    for (std::size_t j = 0; j < whole.size(); ++j) {
      EXPECT_EQ(chunked[j].target, whole[j].target) << "chunk " << chunk << ", row " << j;
      EXPECT_NEAR(chunked[j].logprob, whole[j].logprob, 1e-4) << "chunk " << chunk << ", row " << j;
    }
  }
}

}  // namespace
}  // namespace kvvm::engine::choices_test
