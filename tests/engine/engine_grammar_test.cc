// Structured output through the engine: every draw of a constrained request masked to what its
// grammar allows (CPU backend, the llama-tiny fixture at temperature 1, many seeds), an
// unconstrained request beside it untouched, each choice of n with its own matcher, the end
// where the grammar allows nothing more, and the mask statistics.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "grammar/builder.h"
#include "kvvm/engine/engine.h"
#include "kvvm/grammar/compiled_grammar.h"
#include "kvvm/grammar/vocabulary.h"
#include "kvvm/tokenizer/tokenizer.h"
#include "support/engine_harness.h"
#include "support/grammar_oracle.h"

namespace kvvm::engine {
namespace {

using grammar::Builder;
using grammar::ByteSet;
using grammar::Grammar;
using grammar::Sequence;
using testing::Collector;
using testing::expect_clean;
using testing::llama;
using testing::make_kv;
using testing::no_cache;

const tokenizer::Tokenizer& tiny_tokenizer() { return testing::llama_tokenizer(); }

std::shared_ptr<const grammar::Vocabulary> tiny_vocabulary() {
  auto v = grammar::Vocabulary::from_tokenizer(tiny_tokenizer(), llama().config.eos_token_ids);
  EXPECT_TRUE(v.ok()) << v.status().to_string();
  return *v;
}

std::shared_ptr<const grammar::CompiledGrammar> compile(Grammar g) {
  auto compiled = grammar::CompiledGrammar::compile(std::move(g), tiny_vocabulary());
  EXPECT_TRUE(compiled.ok()) << compiled.status().to_string();
  return *compiled;
}

// {"n":<digits>,"tags":[<word>,...]} with words of letters in quotes.
Grammar record_grammar() {
  Grammar g;
  Builder b(g);
  const Sequence digits = b.plus("digits", b.bytes(ByteSet::range('0', '9')));
  const Sequence word = Builder::cat(
      {b.literal("\""), b.plus("letters", b.bytes(ByteSet::range('a', 'z'))), b.literal("\"")});
  const Sequence tags = *b.separated("tags", word, b.literal(","), 0, 4);
  g.set_root(g.add("root", {Builder::cat({b.literal("{\"n\":"), digits, b.literal(",\"tags\":["),
                                          tags, b.literal("]}")})}));
  return g;
}

Grammar choice_grammar() {
  Grammar g;
  Builder b(g);
  g.set_root(g.add("root", {b.literal("yes"), b.literal("no"), b.literal("maybe not")}));
  return g;
}

EngineRequest sampled(std::uint64_t seed, std::uint32_t max_tokens,
                      std::shared_ptr<const grammar::CompiledGrammar> g) {
  EngineRequest r;
  r.prompt = {269, 293, 290, 288, 297, 268, 259, 287};
  r.max_tokens = max_tokens;
  r.sampling.temperature = 1.0f;
  r.sampling.seed = seed;
  r.grammar = std::move(g);
  return r;
}

std::string bytes_of(const std::vector<std::int32_t>& tokens) {
  std::string out;
  for (const std::int32_t t : tokens) out += tiny_tokenizer().token_bytes(t);
  return out;
}

TEST(EngineGrammarTest, EveryConstrainedOutputMatchesItsGrammar) {
  const auto g = compile(record_grammar());
  auto kv = make_kv(llama().config, 8, 128);
  Collector collector;
  std::vector<RequestId> ids;
  EngineOptions options = no_cache();
  options.tokenizer = &tiny_tokenizer();
  {
    auto engine = Engine::create(*llama().model, *kv, options);
    ASSERT_TRUE(engine.ok());
    for (std::uint64_t seed = 0; seed < 24; ++seed) {
      auto id = (*engine)->submit(sampled(seed, 60, g), collector.callback());
      ASSERT_TRUE(id.ok()) << id.status().to_string();
      ids.push_back(*id);
    }
    ASSERT_TRUE((*engine)->run_until_idle().ok());
    const EngineStats stats = (*engine)->stats();
    EXPECT_EQ(stats.grammar.constrained_requests, 24u);
    // Every generated token was drawn through a mask or forced (a draw of an end token is
    // masked too, and generates nothing).
    EXPECT_GE(stats.grammar.masks + stats.grammar.forced_tokens, stats.generated_tokens);
    EXPECT_GT(stats.grammar.forced_tokens, 0u);
    std::uint64_t bucketed = 0;
    for (const std::uint64_t n : stats.grammar.mask_buckets) bucketed += n;
    EXPECT_EQ(bucketed, stats.grammar.masks);
    EXPECT_GT(stats.grammar.mask_seconds, 0.0);
  }
  expect_clean(*kv);
  int stopped = 0;
  for (const RequestId id : ids) {
    const testing::Outcome o = collector.get(id);
    ASSERT_TRUE(o.completed()) << o.error.to_string();
    const std::string text = bytes_of(o.tokens);
    EXPECT_EQ(o.text, text);
    if (o.end == RequestEnd::kStop) {
      ++stopped;
      EXPECT_TRUE(grammar::testing::oracle_accepts(g->grammar(), text)) << text;
    } else {
      EXPECT_TRUE(grammar::testing::oracle_viable(g->grammar(), text)) << text;
    }
  }
  // The grammar ends by itself ("]}" then nothing): some answers close it inside 60 tokens (the
  // others are cut by max_tokens, still a prefix of the language).
  EXPECT_GT(stopped, 3);
}

TEST(EngineGrammarTest, AnUnconstrainedNeighbourDrawsWhatItDrawsAlone) {
  const auto g = compile(record_grammar());
  const auto run = [&](bool with_neighbour) {
    auto kv = make_kv(llama().config, 4, 128);
    Collector collector;
    RequestId free_id = 0;
    {
      auto engine = Engine::create(*llama().model, *kv, no_cache());
      EXPECT_TRUE(engine.ok());
      if (with_neighbour) (void)(*engine)->submit(sampled(7, 30, g), collector.callback());
      free_id = *(*engine)->submit(sampled(3, 30, nullptr), collector.callback());
      EXPECT_TRUE((*engine)->run_until_idle().ok());
    }
    expect_clean(*kv);
    return collector.get(free_id).tokens;
  };
  const std::vector<std::int32_t> alone = run(false);
  EXPECT_EQ(run(true), alone);
  EXPECT_EQ(alone.size(), 30u);
}

TEST(EngineGrammarTest, EachChoiceFollowsTheGrammarAndStopsWhereItEnds) {
  const auto g = compile(choice_grammar());
  auto kv = make_kv(llama().config, 8, 128);
  Collector collector;
  RequestId id = 0;
  {
    auto engine = Engine::create(*llama().model, *kv, no_cache());
    ASSERT_TRUE(engine.ok());
    EngineRequest r = sampled(5, 20, g);
    r.n = 4;
    r.use_model_eos = false;  // no end token: the grammar's end alone stops it
    id = *(*engine)->submit(std::move(r), collector.callback());
    ASSERT_TRUE((*engine)->run_until_idle().ok());
  }
  expect_clean(*kv);
  // The collector joins every choice's tokens; each choice ends with kStop once complete.
  const testing::Outcome o = collector.get(id);
  EXPECT_EQ(o.finished_events, 4);
  EXPECT_EQ(o.end, RequestEnd::kStop);
}

TEST(EngineGrammarTest, OneChoiceAtATimeIsExactlyAChoice) {
  const auto g = compile(choice_grammar());
  for (std::uint64_t seed = 0; seed < 12; ++seed) {
    auto kv = make_kv(llama().config, 2, 128);
    Collector collector;
    RequestId id = 0;
    {
      auto engine = Engine::create(*llama().model, *kv, no_cache());
      ASSERT_TRUE(engine.ok());
      EngineRequest r = sampled(seed, 20, g);
      r.use_model_eos = seed % 2 == 0;
      id = *(*engine)->submit(std::move(r), collector.callback());
      ASSERT_TRUE((*engine)->run_until_idle().ok());
    }
    const testing::Outcome o = collector.get(id);
    const std::string text = bytes_of(o.tokens);
    EXPECT_EQ(o.end, RequestEnd::kStop) << text;
    EXPECT_TRUE(text == "yes" || text == "no" || text == "maybe not") << "'" << text << "'";
  }
}

// {"name":"<letters>","kind":"cat"|"dog"}: long runs with one continuation only; names of at
// most `longest` letters when given (the random model rarely closes a name by itself).
Grammar pet_grammar(std::optional<std::uint64_t> longest = std::nullopt) {
  Grammar g;
  Builder b(g);
  if (longest) {
    const Sequence letters = *b.repeat("letters", b.bytes(ByteSet::range('a', 'z')), 1, *longest);
    g.set_root(g.add("root",
                     {Builder::cat({b.literal("{\"name\":\""), letters, b.literal("\",\"kind\":\""),
                                    b.any_of("kind", {b.literal("cat"), b.literal("dog")}),
                                    b.literal("\"}")})}));
    return g;
  }
  g.set_root(g.add(
      "root", {Builder::cat(
                  {b.literal("{\"name\":\""), b.plus("letters", b.bytes(ByteSet::range('a', 'z'))),
                   b.literal("\",\"kind\":\""),
                   b.any_of("kind", {b.literal("cat"), b.literal("dog")}), b.literal("\"}")})}));
  return g;
}

TEST(EngineGrammarTest, ForcedRunsAreTakenWithoutADrawAsTheTokenizerWrites) {
  const auto g = compile(pet_grammar());
  for (const bool jump : {true, false}) {
    auto kv = make_kv(llama().config, 8, 128);
    Collector collector;
    std::vector<RequestId> ids;
    EngineOptions options = no_cache();
    options.tokenizer = &tiny_tokenizer();
    options.jump_forward = jump;
    EngineStats stats;
    {
      auto engine = Engine::create(*llama().model, *kv, options);
      ASSERT_TRUE(engine.ok());
      for (std::uint64_t seed = 0; seed < 8; ++seed) {
        EngineRequest r = sampled(seed, 100, g);
        r.use_model_eos = false;
        ids.push_back(*(*engine)->submit(std::move(r), collector.callback()));
      }
      ASSERT_TRUE((*engine)->run_until_idle().ok());
      stats = (*engine)->stats();
    }
    expect_clean(*kv);
    std::uint64_t forced = 0;
    for (const RequestId id : ids) {
      const testing::Outcome o = collector.get(id);
      const std::string text = bytes_of(o.tokens);
      EXPECT_EQ(o.text, text);
      EXPECT_EQ(o.tokens.size(), o.stats.generated_tokens);
      if (o.end == RequestEnd::kStop) {
        EXPECT_TRUE(grammar::testing::oracle_accepts(g->grammar(), text)) << text;
      } else {
        EXPECT_TRUE(grammar::testing::oracle_viable(g->grammar(), text)) << text;
      }
      forced += o.stats.forced_tokens;
      // The run after the letters, as the tokenizer writes it: `","kind":"` but its last piece.
      const std::size_t after = text.find("\",\"kind\":\"");
      if (jump && after != std::string::npos && o.stats.forced_tokens > 0) {
        std::vector<std::int32_t> want = tiny_tokenizer().encode("\",\"kind\":\"");
        ASSERT_GT(want.size(), 1u);
        want.pop_back();
        const auto at = std::search(o.tokens.begin(), o.tokens.end(), want.begin(), want.end());
        EXPECT_NE(at, o.tokens.end()) << text;
      }
    }
    EXPECT_EQ(stats.grammar.forced_tokens, forced);
    if (jump) {
      EXPECT_GT(forced, 8u) << "every answer has runs to force";
    } else {
      EXPECT_EQ(forced, 0u);
    }
  }
}

// A stop string completed inside a forced run: the tokens before it are delivered, the one that
// completed it is not.
TEST(EngineGrammarTest, AStopStringInsideAForcedRunEndsItThere) {
  const auto g = compile(pet_grammar(4));
  auto kv = make_kv(llama().config, 8, 128);
  Collector collector;
  std::vector<RequestId> ids;
  EngineOptions options = no_cache();
  options.tokenizer = &tiny_tokenizer();
  {
    auto engine = Engine::create(*llama().model, *kv, options);
    ASSERT_TRUE(engine.ok());
    for (std::uint64_t seed = 0; seed < 8; ++seed) {
      EngineRequest r = sampled(seed, 100, g);
      r.use_model_eos = false;
      r.stop_strings = {"kind"};
      ids.push_back(*(*engine)->submit(std::move(r), collector.callback()));
    }
    ASSERT_TRUE((*engine)->run_until_idle().ok());
  }
  expect_clean(*kv);
  int stopped = 0;
  for (const RequestId id : ids) {
    const testing::Outcome o = collector.get(id);
    if (o.end != RequestEnd::kStop) continue;
    ++stopped;
    const std::string delivered = bytes_of(o.tokens);
    EXPECT_EQ(delivered.find("kind"), std::string::npos) << delivered;
    EXPECT_EQ(o.text.find("kind"), std::string::npos) << o.text;
    EXPECT_EQ(o.tokens.size() + 1, o.stats.generated_tokens) << delivered;
    // What was delivered is the answer up to the token that completed "kind".
    EXPECT_TRUE(grammar::testing::oracle_viable(g->grammar(), delivered)) << delivered;
  }
  EXPECT_EQ(stopped, 8);
}

TEST(EngineGrammarTest, AGrammarOfALargerVocabularyIsRefusedAtSubmit) {
  std::vector<std::string> bytes(llama().config.vocab_size + 1, "a");
  std::vector<bool> special(bytes.size(), false);
  auto vocabulary = grammar::Vocabulary::from_bytes(bytes, special, {});
  ASSERT_TRUE(vocabulary.ok());
  auto g = grammar::CompiledGrammar::compile(choice_grammar(), *vocabulary);
  ASSERT_TRUE(g.ok());
  auto kv = make_kv(llama().config, 2, 128);
  auto engine = Engine::create(*llama().model, *kv, no_cache());
  ASSERT_TRUE(engine.ok());
  auto id = (*engine)->submit(sampled(1, 4, *g), [](const RequestEvent&) {});
  ASSERT_FALSE(id.ok());
  EXPECT_NE(id.status().message().find("grammar: compiled over a vocabulary of 1025 tokens"),
            std::string::npos)
      << id.status().message();
}

// A grammar behind a trigger (tool_choice auto): the draws are free, exactly the unconstrained
// ones of the same seed, until the output holds the trigger; from there on the output matches
// the grammar and ends where it does.
TEST(EngineGrammarTest, AGrammarStartsOnlyOnceTheOutputHoldsItsTrigger) {
  const auto g = compile(choice_grammar());
  const auto run = [&](std::uint64_t seed, std::string trigger,
                       std::shared_ptr<const grammar::CompiledGrammar> with) {
    auto kv = make_kv(llama().config, 2, 128);
    Collector collector;
    EngineOptions options = no_cache();
    options.tokenizer = &tiny_tokenizer();
    RequestId id = 0;
    EngineStats stats;
    {
      auto engine = Engine::create(*llama().model, *kv, options);
      EXPECT_TRUE(engine.ok());
      EngineRequest r = sampled(seed, 40, std::move(with));
      r.use_model_eos = false;
      r.grammar_trigger = std::move(trigger);
      auto submitted = (*engine)->submit(std::move(r), collector.callback());
      EXPECT_TRUE(submitted.ok()) << submitted.status().to_string();
      id = *submitted;
      EXPECT_TRUE((*engine)->run_until_idle().ok());
      stats = (*engine)->stats();
    }
    expect_clean(*kv);
    return std::make_pair(collector.get(id), stats);
  };
  int started = 0;
  for (std::uint64_t seed = 0; seed < 6; ++seed) {
    const testing::Outcome free = run(seed, "", nullptr).first;
    ASSERT_EQ(free.tokens.size(), 40u);
    // The trigger: the bytes of output tokens 2..5, where they first occur.
    std::size_t begin = 0;
    for (int i = 0; i < 2; ++i) begin += tiny_tokenizer().token_bytes(free.tokens[i]).size();
    std::string trigger;
    for (int i = 2; i < 6; ++i) trigger += tiny_tokenizer().token_bytes(free.tokens[i]);
    const std::string free_text = bytes_of(free.tokens);
    if (trigger.empty() || free_text.find(trigger) != begin) continue;
    ++started;
    const auto [constrained, stats] = run(seed, trigger, g);
    ASSERT_TRUE(constrained.completed()) << constrained.error.to_string();
    ASSERT_GT(constrained.tokens.size(), 6u);
    EXPECT_TRUE(std::equal(constrained.tokens.begin(), constrained.tokens.begin() + 6,
                           free.tokens.begin()));
    const std::string after = bytes_of(
        std::vector<std::int32_t>(constrained.tokens.begin() + 6, constrained.tokens.end()));
    EXPECT_TRUE(after == "yes" || after == "no" || after == "maybe not") << after;
    EXPECT_EQ(constrained.end, RequestEnd::kStop);
    EXPECT_GT(stats.grammar.masks, 0u);
    // A trigger the output never holds leaves every draw free.
    const auto [never, never_stats] = run(seed, "\x01\x02 never written", g);
    EXPECT_EQ(never.tokens, free.tokens);
    EXPECT_EQ(never_stats.grammar.masks, 0u);
  }
  EXPECT_GE(started, 3);
}

TEST(EngineGrammarTest, ATriggerWithoutAGrammarOrATokenizerIsRefused) {
  auto kv = make_kv(llama().config, 2, 128);
  auto engine = Engine::create(*llama().model, *kv, no_cache());
  ASSERT_TRUE(engine.ok());
  EngineRequest r = sampled(1, 4, compile(choice_grammar()));
  r.grammar_trigger = "<tool_call>";
  auto id = (*engine)->submit(r, [](const RequestEvent&) {});
  ASSERT_FALSE(id.ok());
  EXPECT_NE(id.status().message().find("grammar_trigger: the engine has no tokenizer"),
            std::string::npos)
      << id.status().message();
  r.grammar = nullptr;
  id = (*engine)->submit(r, [](const RequestEvent&) {});
  ASSERT_FALSE(id.ok());
  EXPECT_NE(id.status().message().find("grammar_trigger: given without a grammar"),
            std::string::npos)
      << id.status().message();
}

}  // namespace
}  // namespace kvvm::engine
