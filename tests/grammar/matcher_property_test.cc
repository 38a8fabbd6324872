// Matcher properties over generated vocabularies (rapidcheck): for grammars drawn from every
// front end (JSON Schema, regular expressions, GBNF, choice lists) and a vocabulary of every
// byte plus generated token strings over JSON's and patterns' bytes, along random walks:
//  1. the mask fill_mask() gives equals brute force (each token accepted, then rolled back), so
//     the compiled grammar's shortcuts (partial stacks' masks, uncertain tokens, the trie walk
//     over the sorted vocabulary, the mask cache) never add or drop a token;
//  2. rolling back k tokens gives back exactly the mask recorded k steps earlier, as
//     speculative decoding relies on;
//  3. forced_bytes() names a run every continuation shares: accept_bytes takes it, each of its
//     bytes is the only one allowed there, and it stops where the grammar could end or offers a
//     choice (so a second call then gives "").
// matcher_test.cc walks one hand-built grammar over fixed seeds; here the grammars come from
// the front ends users call, the vocabulary's token boundaries are generated, and a failure
// shrinks to a short walk over a small vocabulary.
#include <gtest/gtest.h>
#include <rapidcheck.h>
#include <rapidcheck/gtest.h>

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kvvm/grammar/compiled_grammar.h"
#include "kvvm/grammar/constraint.h"
#include "kvvm/grammar/matcher.h"
#include "kvvm/grammar/vocabulary.h"
#include "support/grammar_oracle.h"

namespace kvvm::grammar::matcher_property_test {

struct Source {
  enum class Kind { kSchema, kFlexibleSchema, kRegex, kGbnf, kChoices };
  Kind kind;
  std::string text;
  std::vector<std::string> choices;
};

// A few constraints of each front end, chosen for what makes masks hard: strings whose tokens
// may hold quotes and escapes, recursion (a token crossing several nested rules), bounded
// repetition, code points of several bytes, choices that are prefixes of one another.
const std::vector<Source>& sources() {
  using K = Source::Kind;
  static const std::vector<Source> all = {
      {K::kSchema,
       R"({"type":"object","properties":{"name":{"type":"string","maxLength":8},"age":{"type":"integer"},"ok":{"type":"boolean"}},"required":["name","age"],"additionalProperties":false})",
       {}},
      {K::kSchema, R"({"enum":["red","green","grey",1,null,{"k":[true]}]})", {}},
      {K::kSchema,
       R"({"type":"array","items":{"type":"array","items":{"type":"integer","minimum":-5,"maximum":99},"maxItems":3},"minItems":1,"maxItems":3})",
       {}},
      {K::kSchema,
       R"({"$defs":{"node":{"type":"object","properties":{"v":{"type":"integer"},"kids":{"type":"array","items":{"$ref":"#/$defs/node"}}},"required":["v"],"additionalProperties":false}},"$ref":"#/$defs/node"})",
       {}},
      {K::kSchema,
       R"({"type":"object","properties":{"d":{"type":"string","format":"date"},"id":{"type":"string","format":"uuid"}},"required":["d"]})",
       {}},
      {K::kSchema,
       R"({"anyOf":[{"type":"number"},{"type":"null"},{"type":"string","pattern":"^[a-c]+\\.x$"}]})",
       {}},
      {K::kFlexibleSchema,
       R"({"type":"object","properties":{"a":{"type":"array","items":{"type":"string"}},"b":{"type":"boolean"}}})",
       {}},
      {K::kRegex, R"([a-z0-9._+-]+@[a-z0-9-]+(\.[a-z]{2,4})+)", {}},
      {K::kRegex, R"(-?(0|[1-9]\d*)(\.\d+)?([eE][+-]?\d+)?)", {}},
      {K::kRegex, R"((ab|abc|a)*c)", {}},
      {K::kRegex, R"(\d{4}-\d{2}-\d{2})", {}},
      {K::kRegex, R"("([^"\\]|\\.)*")", {}},
      {K::kRegex, R"((true|false|null){1,3}|é+x?)", {}},
      {K::kGbnf,
       "root ::= expr\n"
       "expr ::= term ((\"+\" | \"-\") term)*\n"
       "term ::= factor ((\"*\" | \"/\") factor)*\n"
       "factor ::= [0-9]+ | \"(\" expr \")\"\n",
       {}},
      {K::kGbnf,
       "root ::= \"[\" (word (\",\" word)*)? \"]\"\nword ::= \"\\\"\" [a-z]+ \"\\\"\"\n",
       {}},
      {K::kGbnf, "root ::= line{1,3}\nline ::= [a-c]+ \"=\" [0-9]{1,2} \"\\n\"\n", {}},
      {K::kGbnf, "root ::= \"(\" root* \")\"\n", {}},
      {K::kGbnf, "root ::= [à-ü]+ \"!\"? # accented letters, two bytes each\n", {}},
      {K::kGbnf, "root ::= (\"true\" | \"false\" | \"tru\") (\",\" root)?\n", {}},
      {K::kChoices, "", {"red", "green", "greenish", "grey"}},
      {K::kChoices, "", {"a", "ab", "abc", "abcd"}},
      {K::kChoices, "", {"true", "false", "null"}},
      {K::kChoices, "", {"{\"a\":1}", "{\"a\":12}", "{\"b\":true}"}},
      {K::kChoices, "", {"yes", "no", "maybe", "maybe not"}},
      {K::kChoices, "", {"é", "éa", "\"x\""}},
  };
  return all;
}

// Each source's grammar, built once (the front ends are not under test here, only what the
// matcher makes of their grammars).
const Grammar& grammar_of_source(std::size_t i) {
  static const std::vector<Grammar> grammars = [] {
    std::vector<Grammar> out;
    for (const Source& s : sources()) {
      Result<Grammar> g = [&]() -> Result<Grammar> {
        switch (s.kind) {
          case Source::Kind::kSchema:
            return grammar_from_json_schema(s.text);
          case Source::Kind::kFlexibleSchema: {
            JsonSchemaOptions options;
            options.whitespace = {.flexible = true, .max_run = 2};
            return grammar_from_json_schema(s.text, options);
          }
          case Source::Kind::kRegex:
            return grammar_from_regex(s.text);
          case Source::Kind::kGbnf:
            return grammar_from_gbnf(s.text);
          case Source::Kind::kChoices:
            return grammar_from_choices(s.choices);
        }
        return Status::InvalidArgument("unknown source kind");
      }();
      EXPECT_TRUE(g.ok()) << s.text << ": " << g.status().message();
      out.push_back(g.ok() ? std::move(g).value() : Grammar{});
    }
    return out;
  }();
  return grammars[i];
}

// The bytes the generated tokens are made of: JSON's punctuation and escapes, the patterns'
// and grammars' literals, digits, the two bytes of "é" apart (tokens that split a code point).
const std::vector<char>& alphabet() {
  static const std::vector<char> chars = [] {
    const std::string text = "{}[]\",:\\ \nabcdeflnrstuxy0129.-+*/()@=!\xC3\xA9\xA0";
    return std::vector<char>(text.begin(), text.end());
  }();
  return chars;
}

struct Setup {
  std::size_t source = 0;
  std::shared_ptr<const CompiledGrammar> compiled;
};

// Draws a source and a vocabulary: every single byte, generated tokens of up to 8 bytes, a few
// special tokens (one with a text token's bytes, which must never be allowed all the same), an
// empty token and one end token. The compile options are drawn too, so that both the masks
// found at compile time and those computed on first use, cached or not, are checked.
Setup draw_setup() {
  Setup setup;
  setup.source = *rc::gen::inRange<std::size_t>(0, sources().size());
  std::vector<std::string> bytes;
  for (int b = 0; b < 256; ++b) bytes.emplace_back(1, static_cast<char>(b));
  const auto count = *rc::gen::inRange<std::size_t>(20, 300);
  const std::vector<std::string> generated = *rc::gen::container<std::vector<std::string>>(
      count,
      rc::gen::resize(
          8, rc::gen::nonEmpty(rc::gen::container<std::string>(rc::gen::elementOf(alphabet())))));
  bytes.insert(bytes.end(), generated.begin(), generated.end());
  std::vector<bool> special(bytes.size(), false);
  bytes.emplace_back("");  // no bytes: never allowed (it would not move the output)
  special.push_back(false);
  bytes.emplace_back("<|special|>");
  special.push_back(true);
  bytes.emplace_back("\"");
  special.push_back(true);
  bytes.emplace_back("</s>");
  special.push_back(true);
  const std::vector<TokenId> ends{static_cast<TokenId>(bytes.size() - 1)};
  auto vocabulary = Vocabulary::from_bytes(std::move(bytes), std::move(special), ends);
  RC_ASSERT(vocabulary.ok());

  CompileOptions options;
  options.explore_states =
      *rc::gen::element(std::uint32_t{0}, std::uint32_t{16}, std::uint32_t{4096});
  options.cache_bytes = *rc::gen::element(std::uint64_t{0}, std::uint64_t{1} << 24);
  options.threads = 1;  // the tests run beside others on two cores
  auto compiled = CompiledGrammar::compile(grammar_of_source(setup.source), *vocabulary, options);
  if (!compiled.ok()) RC_FAIL("compile: " + compiled.status().message());
  setup.compiled = *compiled;
  RC_LOG() << "source " << setup.source << ": " << sources()[setup.source].text << "\n";
  return setup;
}

bool bit_of(std::span<const std::uint32_t> words, TokenId t) {
  return (words[static_cast<std::size_t>(t) >> 5] >> (t & 31)) & 1;
}

std::vector<std::uint32_t> mask_of(Matcher& m) {
  std::vector<std::uint32_t> words(m.grammar().vocabulary().mask_words());
  m.fill_mask(words);
  return words;
}

std::string shown(std::string_view bytes) {
  std::string out;
  for (const char c : bytes) {
    const auto u = static_cast<unsigned char>(c);
    if (u >= 0x20 && u < 0x7F && c != '\\') {
      out += c;
    } else {
      static const char* const hex = "0123456789abcdef";
      out += "\\x";
      out += hex[u >> 4];
      out += hex[u & 15];
    }
  }
  return out;
}

// Fails unless the mask is what trying every token says; leaves the matcher as it was.
void check_mask_is_brute_force(Matcher& m, const std::vector<std::uint32_t>& words,
                               const std::string& text) {
  const Vocabulary& v = m.grammar().vocabulary();
  const std::uint32_t before = m.accepted();
  for (TokenId t = 0; t < static_cast<TokenId>(v.size()); ++t) {
    const bool allowed = m.accept_token(t);
    if (allowed) RC_ASSERT(m.rollback(1));
    if (bit_of(words, t) != allowed) {
      RC_FAIL("after '" + shown(text) + "': token " + std::to_string(t) + " '" + shown(v.bytes(t)) +
              "' is " + (allowed ? "accepted" : "refused") + " but the mask says " +
              (bit_of(words, t) ? "allowed" : "not allowed"));
    }
  }
  RC_ASSERT(m.accepted() == before);
  // Nothing is allowed past the vocabulary's end (the mask's last word's spare bits).
  for (std::size_t t = v.size(); t < words.size() * 32; ++t) {
    RC_ASSERT(!bit_of(words, static_cast<TokenId>(t)));
  }
}

// One walk: the tokens drawn and the mask at each step (masks[i] with i tokens accepted).
struct Walk {
  std::vector<TokenId> tokens;
  std::vector<std::vector<std::uint32_t>> masks;
  std::string text;
};

// Up to `steps` tokens drawn from each step's mask (end tokens included: a walk may end),
// with `at_step` called at each step before the draw.
template <typename AtStep>
Walk random_walk(Matcher& m, int steps, const AtStep& at_step) {
  const Vocabulary& v = m.grammar().vocabulary();
  Walk walk;
  for (int step = 0; step <= steps; ++step) {
    std::vector<std::uint32_t> words = mask_of(m);
    at_step(words, walk.text);
    walk.masks.push_back(words);
    if (step == steps || m.ended()) break;
    std::vector<TokenId> allowed;
    for (TokenId t = 0; t < static_cast<TokenId>(v.size()); ++t) {
      if (bit_of(words, t)) allowed.push_back(t);
    }
    // A checked grammar never strands a sequence: some text token or the end is always allowed.
    if (allowed.empty()) RC_FAIL("no token allowed after '" + shown(walk.text) + "'");
    const TokenId t = allowed[*rc::gen::inRange<std::size_t>(0, allowed.size())];
    RC_LOG() << "step " << step << ": token " << t << " '" << shown(v.bytes(t)) << "'\n";
    RC_ASSERT(m.accept_token(t));
    walk.tokens.push_back(t);
    if (!v.is_end(t)) walk.text += v.bytes(t);
  }
  RC_LOG() << "walk '" << shown(walk.text) << "' (" << walk.tokens.size() << " tokens"
           << (m.ended() ? ", ended" : "") << ")\n";
  return walk;
}

RC_GTEST_PROP(MatcherPropertyTest, MasksAreBruteForceAlongRandomWalks, ()) {
  const Setup setup = draw_setup();
  const Grammar& g = setup.compiled->grammar();
  Matcher m(setup.compiled);
  const int steps = *rc::gen::inRange(0, 26);
  const Walk walk =
      random_walk(m, steps, [&](const std::vector<std::uint32_t>& words, const std::string& text) {
        check_mask_is_brute_force(m, words, text);
        // The walk stays inside the language's prefixes, by a reading that shares nothing with
        // the matcher.
        RC_ASSERT(testing::oracle_viable(g, text));
        // (Once ended, can_end() is false: no second end token may come.)
        if (!m.ended() && m.can_end() != testing::oracle_accepts(g, text)) {
          RC_FAIL("after '" + shown(text) + "': can_end() says " + (m.can_end() ? "yes" : "no") +
                  ", the oracle the opposite");
        }
      });
  if (m.ended()) RC_ASSERT(testing::oracle_accepts(g, walk.text));
}

RC_GTEST_PROP(MatcherPropertyTest, RollbackGivesBackEveryEarlierMask, ()) {
  const Setup setup = draw_setup();
  Matcher m(setup.compiled);
  const Walk walk = random_walk(m, *rc::gen::inRange(1, 26),
                                [](const std::vector<std::uint32_t>&, const std::string&) {});
  const auto n = static_cast<std::uint32_t>(walk.tokens.size());
  RC_ASSERT(m.accepted() == n);
  RC_ASSERT(!m.rollback(n + 1));
  RC_ASSERT(m.accepted() == n);
  // Back in random strides to the start, each stop's mask the one recorded there, and a new
  // token accepted there and rolled back again, so that what rollback restores is a state the
  // matcher can go on from, not only one whose mask looks right.
  while (m.accepted() > 0) {
    const std::uint32_t k = *rc::gen::inRange<std::uint32_t>(1, m.accepted() + 1);
    RC_ASSERT(m.rollback(k));
    const std::uint32_t at = m.accepted();
    RC_ASSERT(!m.ended());
    RC_ASSERT(mask_of(m) == walk.masks[at]);
    RC_ASSERT(m.accept_token(walk.tokens[at]));
    RC_ASSERT(mask_of(m) == walk.masks[at + 1]);
    RC_ASSERT(m.rollback(1));
  }
  RC_ASSERT(mask_of(m) == walk.masks[0]);
}

// The bytes that may come next, by trying each one.
std::vector<std::uint8_t> next_bytes(Matcher& m) {
  std::vector<std::uint8_t> out;
  for (int b = 0; b < 256; ++b) {
    if (m.accept_bytes(std::string(1, static_cast<char>(b)))) {
      out.push_back(static_cast<std::uint8_t>(b));
      RC_ASSERT(m.rollback(1));
    }
  }
  return out;
}

// At the matcher's state: forced_bytes() is taken whole by accept_bytes, each of its bytes is
// the only one allowed where it stands (and the grammar cannot end before it), and after it
// the grammar can end or offers a choice. Leaves the matcher as it was.
void check_forced_bytes(Matcher& m, const std::string& text) {
  if (m.ended()) {
    RC_ASSERT(m.forced_bytes().empty());
    return;
  }
  const std::uint32_t before = m.accepted();
  const std::string forced = m.forced_bytes();
  RC_LOG() << "forced after '" << shown(text) << "': '" << shown(forced) << "'\n";
  for (std::size_t i = 0; i < forced.size(); ++i) {
    RC_ASSERT(!m.can_end());
    const std::vector<std::uint8_t> next = next_bytes(m);
    RC_ASSERT(next.size() == 1u);
    RC_ASSERT(next[0] == static_cast<std::uint8_t>(forced[i]));
    RC_ASSERT(m.accept_bytes(forced.substr(i, 1)));
  }
  if (!forced.empty()) RC_ASSERT(m.rollback(static_cast<std::uint32_t>(forced.size())));
  RC_ASSERT(m.accepted() == before);
  // The same run accepted in one call: one step to roll back.
  if (!forced.empty()) RC_ASSERT(m.accept_bytes(forced));
  if (forced.size() < 256) {  // not cut by forced_bytes' bound
    RC_ASSERT(m.forced_bytes().empty());
    RC_ASSERT(m.can_end() || next_bytes(m).size() > 1u);
  }
  // A bound shorter than the run gives its start.
  if (forced.size() > 1) {
    RC_ASSERT(m.rollback(1));
    RC_ASSERT(m.forced_bytes(forced.size() - 1) == forced.substr(0, forced.size() - 1));
    RC_ASSERT(m.accept_bytes(forced));
  }
  if (!forced.empty()) RC_ASSERT(m.rollback(1));
  RC_ASSERT(m.accepted() == before);
}

RC_GTEST_PROP(MatcherPropertyTest, ForcedBytesAreAcceptedAndStopAtAChoice, ()) {
  const Setup setup = draw_setup();
  Matcher m(setup.compiled);
  const Walk walk = random_walk(m, *rc::gen::inRange(0, 26),
                                [&](const std::vector<std::uint32_t>&, const std::string& text) {
                                  check_forced_bytes(m, text);
                                });
  // After the walk, the forced run taken as a step of its own (as the engine emits it) leaves
  // a state whose mask is still brute force.
  if (!m.ended()) {
    const std::string forced = m.forced_bytes();
    if (!forced.empty()) {
      RC_ASSERT(m.accept_bytes(forced));
      check_mask_is_brute_force(m, mask_of(m), walk.text + forced);
    }
  }
}

}  // namespace kvvm::grammar::matcher_property_test
