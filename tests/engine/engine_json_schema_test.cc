// Structured output end to end, checked by an independent validator: for a ladder of JSON
// Schemas (flat objects, enums in nested objects, arrays of objects with bounded length,
// recursion through $ref and anyOf, string formats and patterns), every answer the engine
// finishes under its schema's grammar (kStop) is valid JSON that Python's jsonschema accepts
// against that schema (tests/grammar/validate_json.py), and every answer cut by max_tokens
// (kLength) is still a prefix of the grammar's language.
//
// The grammar tests check the compiler's grammars against the validator with the oracle's
// samples; this one checks what a client actually receives: the schema compiled over a real
// tokenizer's vocabulary, tokens drawn by a model at temperature 1 through the masks, the end
// token allowed only where the grammar matched, and the text the engine streams. The fixture
// models are tiny and random, so their draws wander over everything the masks allow: the
// schemas bound their strings and numbers so that most answers end well inside max_tokens.
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "kvvm/engine/engine.h"
#include "kvvm/grammar/compiled_grammar.h"
#include "kvvm/grammar/constraint.h"
#include "kvvm/grammar/vocabulary.h"
#include "kvvm/tokenizer/tokenizer.h"
#include "support/engine_harness.h"
#include "support/grammar_oracle.h"
#include "support/json_validator.h"
#include "support/test_data.h"

namespace kvvm::engine::engine_json_schema_test {

using testing::Collector;
using testing::expect_clean;
using testing::FixtureModel;
using testing::make_kv;
using testing::no_cache;

// The ladder: each rung adds what the grammar must keep across more tokens.
const char* const kSchemas[] = {
    // A flat object of the three scalar kinds, every property required.
    R"({"type":"object","properties":{"name":{"type":"string","maxLength":6},"count":{"type":"integer","minimum":-50,"maximum":999},"ok":{"type":"boolean"}},"required":["name","count","ok"],"additionalProperties":false})",
    // An enum and a nested object, one property optional.
    R"({"type":"object","properties":{"color":{"enum":["red","green","blue",null]},"size":{"type":"object","properties":{"w":{"type":"integer","minimum":1,"maximum":99},"h":{"type":"integer","minimum":1,"maximum":99}},"required":["w"],"additionalProperties":false}},"required":["color","size"],"additionalProperties":false})",
    // An array of objects, its length bounded on both sides.
    R"({"type":"array","items":{"type":"object","properties":{"id":{"type":"integer","minimum":0,"maximum":99},"tag":{"type":"string","maxLength":3}},"required":["id","tag"],"additionalProperties":false},"minItems":1,"maxItems":3})",
    // Recursion: a tree of small integers, nulls and arrays through $defs, $ref and anyOf.
    R"({"$defs":{"tree":{"anyOf":[{"type":"integer","minimum":0,"maximum":9},{"type":"null"},{"type":"array","items":{"$ref":"#/$defs/tree"},"maxItems":3}]}},"type":"object","properties":{"root":{"$ref":"#/$defs/tree"}},"required":["root"],"additionalProperties":false})",
    // String formats and a pattern.
    R"({"type":"object","properties":{"day":{"type":"string","format":"date"},"id":{"type":"string","format":"uuid"},"code":{"type":"string","pattern":"^[A-Z]{2}-[0-9]{3}$"}},"required":["day","id","code"],"additionalProperties":false})",
};
constexpr int kSeedsPerSchema = 16;
constexpr std::uint32_t kMaxTokens = 200;

std::pair<int, std::string> run_validator(const std::string& schema,
                                          const std::vector<std::string>& instances) {
  return test::validate_json(schema, instances);
}

std::unique_ptr<tokenizer::Tokenizer> load_tokenizer(const std::string& fixture) {
  auto t = tokenizer::Tokenizer::load(test::model_fixture_dir(fixture) + "/tokenizer.json");
  EXPECT_TRUE(t.ok()) << fixture << ": " << t.status().to_string();
  return t.ok() ? std::move(t).value() : nullptr;
}

// What the answers of one schema came to.
struct SchemaRun {
  std::vector<std::string> stopped;  // kStop answers' text, to validate
  int cut = 0;                       // kLength answers (each checked to be a viable prefix)
};

// Every schema's grammar over the fixture's tokenizer, kSeedsPerSchema requests each at
// temperature 1 in one engine, each answer's end and text checked against its grammar; the
// kStop texts by schema.
std::vector<SchemaRun> sample_ladder(FixtureModel& model, const tokenizer::Tokenizer& tokenizer,
                                     std::int32_t prompt_vocab) {
  auto vocabulary = grammar::Vocabulary::from_tokenizer(tokenizer, model.config.eos_token_ids);
  EXPECT_TRUE(vocabulary.ok()) << vocabulary.status().to_string();
  if (!vocabulary.ok()) return {};
  std::vector<std::shared_ptr<const grammar::CompiledGrammar>> grammars;
  for (const char* schema : kSchemas) {
    auto g = grammar::grammar_from_json_schema(schema);
    EXPECT_TRUE(g.ok()) << schema << ": " << g.status().to_string();
    if (!g.ok()) return {};
    auto compiled = grammar::CompiledGrammar::compile(std::move(g).value(), *vocabulary);
    EXPECT_TRUE(compiled.ok()) << schema << ": " << compiled.status().to_string();
    if (!compiled.ok()) return {};
    grammars.push_back(*compiled);
  }

  auto kv = make_kv(model.config, 8, 256);
  if (kv == nullptr) return {};
  Collector collector;
  std::vector<std::vector<RequestId>> ids(grammars.size());
  EngineOptions options = no_cache();
  options.tokenizer = &tokenizer;  // the text a client receives, validated below
  {
    auto engine = Engine::create(*model.model, *kv, options);
    EXPECT_TRUE(engine.ok()) << engine.status().to_string();
    if (!engine.ok()) return {};
    for (std::size_t s = 0; s < grammars.size(); ++s) {
      for (int seed = 0; seed < kSeedsPerSchema; ++seed) {
        EngineRequest r;
        const std::uint64_t key = s * 1000 + static_cast<std::uint64_t>(seed);
        r.prompt = testing::rig_prompt(8, key, prompt_vocab);
        r.max_tokens = kMaxTokens;
        r.sampling.temperature = 1.0f;
        r.sampling.seed = key;
        r.use_model_eos = true;  // the end token, allowed only where the schema's value closed
        r.grammar = grammars[s];
        auto id = (*engine)->submit(std::move(r), collector.callback());
        EXPECT_TRUE(id.ok()) << id.status().to_string();
        if (!id.ok()) return {};
        ids[s].push_back(*id);
      }
    }
    const Status run = (*engine)->run_until_idle();
    EXPECT_TRUE(run.ok()) << run.to_string();
    EXPECT_EQ((*engine)->stats().grammar.constrained_requests,
              grammars.size() * static_cast<std::size_t>(kSeedsPerSchema));
  }
  expect_clean(*kv);

  std::vector<SchemaRun> runs(grammars.size());
  for (std::size_t s = 0; s < grammars.size(); ++s) {
    const grammar::Grammar& g = grammars[s]->grammar();
    for (const RequestId id : ids[s]) {
      const testing::Outcome o = collector.get(id);
      EXPECT_TRUE(o.completed()) << kSchemas[s] << ": " << o.error.to_string();
      if (!o.completed()) continue;
      // The bytes the grammar saw: the text a client gets must be exactly these.
      std::string bytes;
      for (const std::int32_t t : o.tokens) bytes += tokenizer.token_bytes(t);
      EXPECT_EQ(o.text, bytes) << kSchemas[s];
      if (o.end == RequestEnd::kStop) {
        EXPECT_TRUE(grammar::testing::oracle_accepts(g, bytes)) << kSchemas[s] << "\n" << bytes;
        runs[s].stopped.push_back(o.text);
      } else {
        EXPECT_EQ(o.tokens.size(), kMaxTokens) << kSchemas[s] << "\n" << bytes;
        EXPECT_TRUE(grammar::testing::oracle_viable(g, bytes)) << kSchemas[s] << "\n" << bytes;
        ++runs[s].cut;
      }
    }
  }
  return runs;
}

// The kStop answers of every schema through the validator; each schema must have some.
void expect_valid(const std::vector<SchemaRun>& runs, const std::string& fixture) {
  ASSERT_EQ(runs.size(), std::size(kSchemas)) << fixture;
  for (std::size_t s = 0; s < runs.size(); ++s) {
    // Answers cut by max_tokens say nothing about validity; a schema none of whose answers
    // closes would pass vacuously, so each must close some (the bounds in the schemas keep a
    // random model's answers short enough).
    EXPECT_GT(runs[s].stopped.size(), 0u)
        << fixture << ": no answer closed within " << kMaxTokens << " tokens (" << runs[s].cut
        << " cut) for " << kSchemas[s];
    if (runs[s].stopped.empty()) continue;
    const auto [status, output] = run_validator(kSchemas[s], runs[s].stopped);
    ASSERT_NE(status, 2) << "validate_json.py could not run (is python3-jsonschema installed?)\n"
                         << output;
    EXPECT_EQ(status, 0) << fixture << ": " << kSchemas[s] << "\n" << output;
  }
}

// scripts/test.sh installs and checks the validator, so CI never skips these; a machine without
// it (the GPU machine) skips them, saying why.
bool have_validator() { return test::have_json_validator(); }

TEST(EngineJsonSchemaTest, EveryFinishedAnswerOfLlamaTinyIsValidAgainstItsSchema) {
  if (!have_validator()) GTEST_SKIP() << "no python3-jsonschema: answers not validated";
  const auto tokenizer = load_tokenizer("llama-tiny");
  ASSERT_NE(tokenizer, nullptr);
  FixtureModel& model = testing::llama();
  ASSERT_NE(model.model, nullptr);
  expect_valid(sample_ladder(model, *tokenizer, 1000), "llama-tiny");
}

// A second tokenizer (ByteLevel BPE, as Qwen's) and model: other token boundaries through
// the same schemas.
TEST(EngineJsonSchemaTest, EveryFinishedAnswerOfQwen2TinyIsValidAgainstItsSchema) {
  if (!have_validator()) GTEST_SKIP() << "no python3-jsonschema: answers not validated";
  const auto tokenizer = load_tokenizer("qwen2-tiny");
  ASSERT_NE(tokenizer, nullptr);
  const std::unique_ptr<FixtureModel> model = testing::load_fixture("qwen2-tiny");
  ASSERT_NE(model, nullptr);
  // Prompt ids below 600: away from the added tokens at the top of its 674.
  expect_valid(sample_ladder(*model, *tokenizer, 600), "qwen2-tiny");
}

// The validator itself: a schema's violation is reported, so that a pass above means
// something.
TEST(EngineJsonSchemaTest, TheValidatorRefusesAnAnswerOutsideItsSchema) {
  if (!have_validator()) GTEST_SKIP() << "python3-jsonschema is not installed";
  const auto [status, output] =
      run_validator(kSchemas[0], {R"({"name":"abc","count":1,"ok":true})",
                                  R"({"name":"abcdefg","count":1,"ok":true})",
                                  R"({"name":"a","count":1})", R"({"name":"a")"});
  ASSERT_NE(status, 2) << output;
  EXPECT_EQ(status, 1) << output;
  EXPECT_EQ(output.find("instance 0"), std::string::npos) << output;
  EXPECT_NE(output.find("instance 1"), std::string::npos) << output;
  EXPECT_NE(output.find("instance 2"), std::string::npos) << output;
  EXPECT_NE(output.find("instance 3"), std::string::npos) << output;
}

}  // namespace kvvm::engine::engine_json_schema_test
