// Speculative decoding of constrained requests: a proposal is a row only while the request's
// grammar accepts it (n-gram lookup's and a draft model's alike), each row draws through the
// mask of the grammar as it stands after the proposals before it, and a grammar's forced run
// after a draw ends the step's rows. The answers are token for token plain decoding's, greedy
// and sampled, with the forced runs (jump-forward) on.
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "grammar/builder.h"
#include "kvvm/engine/engine.h"
#include "kvvm/grammar/compiled_grammar.h"
#include "kvvm/grammar/vocabulary.h"
#include "kvvm/tokenizer/tokenizer.h"
#include "support/engine_harness.h"
#include "support/speculative_rig.h"

namespace kvvm::engine {
namespace {

using grammar::Builder;
using grammar::ByteSet;
using grammar::Grammar;
using grammar::Sequence;
using testing::by_draft;
using testing::draft_of;
using testing::expect_same_answers;
using testing::llama_tokenizer;
using testing::lookup;
using testing::run_all;
using testing::SpecRun;

// A JSON list of up to 40 objects {"value":"<a or b letters>"}: the answers repeat themselves
// (so lookup proposes), with choices in every object (so proposals are refused too) and a forced
// run at each object's start.
std::shared_ptr<const grammar::CompiledGrammar> list_grammar() {
  Grammar g;
  Builder b(g);
  const Sequence item =
      Builder::cat({b.literal("{\"value\":\""),
                    b.plus("letters", b.bytes(ByteSet::range('a', 'b'))), b.literal("\"}")});
  const Sequence items = *b.separated("items", item, b.literal(","), 1, 40);
  g.set_root(g.add("root", {Builder::cat({b.literal("["), items, b.literal("]")})}));
  auto vocabulary =
      grammar::Vocabulary::from_tokenizer(llama_tokenizer(), testing::llama().config.eos_token_ids);
  EXPECT_TRUE(vocabulary.ok()) << vocabulary.status().to_string();
  auto compiled = grammar::CompiledGrammar::compile(std::move(g), *vocabulary);
  EXPECT_TRUE(compiled.ok()) << compiled.status().to_string();
  return *compiled;
}

std::vector<EngineRequest> constrained_requests(float temperature) {
  const auto g = list_grammar();
  std::vector<EngineRequest> requests;
  for (std::uint64_t i = 0; i < 6; ++i) {
    EngineRequest r = testing::request_of(testing::repeating_prompt(50 + i, 5), 48);
    r.sampling.temperature = temperature;
    r.sampling.seed = 3 + i;
    r.grammar = g;
    requests.push_back(std::move(r));
  }
  return requests;
}

TEST(SpeculativeGrammar, ConstrainedAnswersArePlainDecodingsWithEitherProposer) {
  auto draft = testing::load_fixture("llama-tiny");
  ASSERT_NE(draft, nullptr);
  const tokenizer::Tokenizer* tok = &llama_tokenizer();
  for (const float temperature : {0.0f, 1.0f}) {
    const std::vector<EngineRequest> requests = constrained_requests(temperature);
    const std::string at = "temperature " + std::to_string(temperature);
    const SpecRun plain = run_all(testing::llama(), requests, {}, {}, {}, tok);
    for (const auto& answer : plain.answers) ASSERT_FALSE(answer.tokens.empty()) << at;
    EXPECT_GT(plain.stats.grammar.forced_tokens, 0u) << at;
    const SpecRun ngram = run_all(testing::llama(), requests, lookup(4), {}, {}, tok);
    expect_same_answers(plain, ngram, "n-gram, " + at);
    EXPECT_GT(ngram.stats.spec_accepted_tokens, 0u) << at;
    // Greedy answers loop, and a loop's proposals are kept (sampled ones are kept less often
    // than a step's worth for every sequence).
    if (temperature == 0.0f) {
      EXPECT_LT(ngram.stats.steps, plain.stats.steps) << at;
    }
    const SpecRun drafted =
        run_all(testing::llama(), requests, by_draft(4), {}, draft_of(*draft->model), tok);
    expect_same_answers(plain, drafted, "draft model, " + at);
    EXPECT_GT(drafted.stats.spec_draft_tokens, 0u) << at;
    // Kept where the draft's unmasked choice is one the grammar allows and the draw agrees.
    EXPECT_LE(drafted.stats.spec_accepted_tokens, drafted.stats.spec_draft_tokens) << at;
    // Both ran the forced runs: the grammar's bytes between items came without draws.
    EXPECT_EQ(ngram.stats.grammar.forced_tokens, plain.stats.grammar.forced_tokens) << at;
  }
}

}  // namespace
}  // namespace kvvm::engine
