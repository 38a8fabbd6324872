#include "kvvm/grammar/matcher.h"

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "grammar/builder.h"
#include "support/grammar_oracle.h"

namespace kvvm::grammar {
namespace {

// A small JSON: objects, arrays, strings of any code point but " and \ (and \" \\ \n
// escapes), integers, true / false / null; recursive.
Grammar json_like() {
  Grammar g;
  Builder b(g);
  const RuleId value = g.declare("value");
  const Sequence character =
      b.any_of("char", {b.codepoints("plain", {{'"', '"'}, {'\\', '\\'}, {0, 0x1F}}, true),
                        Builder::cat({b.literal("\\"), b.bytes([] {
                                        ByteSet s;
                                        s.add('"');
                                        s.add('\\');
                                        s.add('n');
                                        return s;
                                      }())})});
  const RuleId string = g.add(
      "string", {Builder::cat({b.literal("\""), b.star("chars", character), b.literal("\"")})});
  const Sequence digits = b.star("digits", b.bytes(ByteSet::range('0', '9')));
  const Sequence integer =
      Builder::cat({b.optional("minus", b.literal("-")),
                    b.any_of("int", {b.literal("0"),
                                     Builder::cat({b.bytes(ByteSet::range('1', '9')), digits})})});
  const Sequence member = Builder::cat({b.ref(string), b.literal(":"), b.ref(value)});
  const Sequence members = *b.separated("members", member, b.literal(","), 0, std::nullopt);
  const Sequence items = *b.separated("items", b.ref(value), b.literal(","), 0, std::nullopt);
  g.define(value, {Builder::cat({b.literal("{"), members, b.literal("}")}),
                   Builder::cat({b.literal("["), items, b.literal("]")}), b.ref(string), integer,
                   b.literal("true"), b.literal("false"), b.literal("null")});
  g.set_root(value);
  EXPECT_TRUE(g.check().ok()) << g.check().message();
  return g;
}

// A vocabulary of every single byte, JSON-ish pieces and random strings over JSON's bytes, two
// special tokens and an end token.
std::shared_ptr<const Vocabulary> test_vocabulary(std::uint64_t seed, std::size_t random_tokens) {
  std::vector<std::string> bytes;
  for (int b = 0; b < 256; ++b) bytes.emplace_back(1, static_cast<char>(b));
  for (const char* piece :
       {"{\"",   "\":",   "\",\"", "\"}",    "\"]",   "}]",    "},{\"", "[{\"",   "true",
        "false", "null",  "nu",    "ll",     "12",    "-0",    "00",    "\\\"",   "\\n",
        "\"\"",  "é",     "\xC3",  "\xA9\"", "ab",    "abc\"", ",",     "\":{\"", "\":[",
        "]}",    "\":\"", "\":1",  "1,",     "\"x\"", "tr",    "ue"}) {
    bytes.emplace_back(piece);
  }
  const std::string alphabet = "{}[]\",:\\abcnxy019-é truefalsnl";
  std::mt19937_64 rng(seed);
  for (std::size_t i = 0; i < random_tokens; ++i) {
    std::string t;
    const std::size_t n = 1 + rng() % 6;
    for (std::size_t k = 0; k < n; ++k) t += alphabet[rng() % alphabet.size()];
    bytes.push_back(t);
  }
  std::vector<bool> special(bytes.size(), false);
  bytes.emplace_back("<|special|>");
  special.push_back(true);
  bytes.emplace_back("\"");  // special, with a text token's bytes: never allowed
  special.push_back(true);
  bytes.emplace_back("</s>");
  special.push_back(true);
  const TokenId end = static_cast<TokenId>(bytes.size() - 1);
  const std::vector<TokenId> ends{end};
  return *Vocabulary::from_bytes(std::move(bytes), std::move(special), ends);
}

bool bit(const std::vector<std::uint32_t>& words, TokenId t) {
  return (words[static_cast<std::size_t>(t) >> 5] >> (t & 31)) & 1;
}

// The mask against brute force: each token tried, then rolled back.
void expect_mask_is_brute_force(Matcher& m, const std::string& where) {
  const Vocabulary& v = m.grammar().vocabulary();
  std::vector<std::uint32_t> words(v.mask_words());
  m.fill_mask(words);
  for (TokenId t = 0; t < static_cast<TokenId>(v.size()); ++t) {
    const bool allowed = m.accept_token(t);
    if (allowed) {
      ASSERT_TRUE(m.rollback(1));
    }
    ASSERT_EQ(bit(words, t), allowed) << where << " token " << t << " '" << v.bytes(t) << "'";
  }
}

TEST(MatcherTest, MasksAreBruteForceAlongRandomWalks) {
  auto compiled = CompiledGrammar::compile(json_like(), test_vocabulary(1, 400));
  ASSERT_TRUE(compiled.ok()) << compiled.status().message();
  const Vocabulary& v = (*compiled)->vocabulary();
  std::mt19937_64 rng(11);
  for (int walk = 0; walk < 12; ++walk) {
    Matcher m(*compiled);
    std::string text;
    for (int step = 0; step < 40 && !m.ended(); ++step) {
      ASSERT_NO_FATAL_FAILURE(expect_mask_is_brute_force(m, "after '" + text + "'"));
      std::vector<std::uint32_t> words(v.mask_words());
      m.fill_mask(words);
      std::vector<TokenId> allowed;
      for (TokenId t = 0; t < static_cast<TokenId>(v.size()); ++t) {
        if (bit(words, t)) allowed.push_back(t);
      }
      ASSERT_FALSE(allowed.empty()) << text;
      const TokenId t = allowed[rng() % allowed.size()];
      ASSERT_TRUE(m.accept_token(t));
      if (!v.is_end(t)) text += v.bytes(t);
      EXPECT_TRUE(testing::oracle_viable((*compiled)->grammar(), text)) << text;
    }
    if (m.ended()) {
      EXPECT_TRUE(testing::oracle_accepts((*compiled)->grammar(), text)) << text;
    }
  }
}

TEST(MatcherTest, SpecialTokensNeverAndEndOnlyWhereTheGrammarMatched) {
  auto compiled = CompiledGrammar::compile(json_like(), test_vocabulary(2, 50));
  ASSERT_TRUE(compiled.ok());
  const Vocabulary& v = (*compiled)->vocabulary();
  const TokenId end = v.ends()[0];
  Matcher m(*compiled);
  std::vector<std::uint32_t> words(v.mask_words());
  EXPECT_FALSE(m.can_end());
  EXPECT_TRUE(m.accept_bytes("[1,"));
  m.fill_mask(words);
  EXPECT_FALSE(bit(words, end));
  EXPECT_FALSE(bit(words, end - 1));  // special, bytes "\"" a string would take
  EXPECT_FALSE(bit(words, end - 2));
  EXPECT_TRUE(bit(words, '"'));
  EXPECT_TRUE(m.accept_bytes("2]"));
  EXPECT_TRUE(m.can_end());
  EXPECT_TRUE(m.must_end());
  m.fill_mask(words);
  for (TokenId t = 0; t < static_cast<TokenId>(v.size()); ++t) EXPECT_EQ(bit(words, t), t == end);
  EXPECT_TRUE(m.accept_token(end));
  EXPECT_TRUE(m.ended());
  m.fill_mask(words);
  for (std::uint32_t w : words) EXPECT_EQ(w, 0u);
  EXPECT_TRUE(m.rollback(1));
  EXPECT_FALSE(m.ended());
  EXPECT_TRUE(m.can_end());
}

TEST(MatcherTest, RollbackRestoresEveryEarlierMask) {
  auto compiled = CompiledGrammar::compile(json_like(), test_vocabulary(3, 200));
  ASSERT_TRUE(compiled.ok());
  const Vocabulary& v = (*compiled)->vocabulary();
  Matcher m(*compiled);
  std::vector<std::vector<std::uint32_t>> masks;
  std::mt19937_64 rng(5);
  for (int step = 0; step < 30; ++step) {
    std::vector<std::uint32_t> words(v.mask_words());
    m.fill_mask(words);
    masks.push_back(words);
    std::vector<TokenId> allowed;
    for (TokenId t = 0; t < static_cast<TokenId>(v.size()); ++t) {
      if (bit(words, t) && !v.is_end(t)) allowed.push_back(t);
    }
    if (allowed.empty()) break;
    ASSERT_TRUE(m.accept_token(allowed[rng() % allowed.size()]));
  }
  const std::uint32_t n = m.accepted();
  EXPECT_FALSE(m.rollback(n + 1));
  EXPECT_EQ(m.accepted(), n);
  for (std::uint32_t back = 1; back <= n; back += 3) {
    ASSERT_TRUE(m.rollback(std::min(3u, m.accepted())));
    std::vector<std::uint32_t> words(v.mask_words());
    m.fill_mask(words);
    EXPECT_EQ(words, masks[m.accepted()]) << "after rolling back to " << m.accepted();
  }
}

TEST(MatcherTest, ForcedBytesStopAtTheFirstChoice) {
  Grammar g;
  Builder b(g);
  g.set_root(g.add("root", {Builder::cat({b.literal("{\"name\":\""),
                                          b.plus("letters", b.bytes(ByteSet::range('a', 'z'))),
                                          b.literal("\",\"ok\":true}")})}));
  auto compiled = CompiledGrammar::compile(std::move(g), test_vocabulary(4, 10));
  ASSERT_TRUE(compiled.ok());
  Matcher m(*compiled);
  EXPECT_EQ(m.forced_bytes(), "{\"name\":\"");
  EXPECT_EQ(m.forced_bytes(4), "{\"na");
  EXPECT_TRUE(m.accept_bytes("{\"name\":\"ab"));
  EXPECT_EQ(m.forced_bytes(), "");  // a letter or the closing quote
  EXPECT_TRUE(m.accept_bytes("\""));
  EXPECT_EQ(m.forced_bytes(), ",\"ok\":true}");
  EXPECT_TRUE(m.accept_bytes(",\"ok\":true}"));
  EXPECT_TRUE(m.must_end());
  EXPECT_EQ(m.forced_bytes(), "");
}

TEST(MatcherTest, CompileFindsThePartialStacksAhead) {
  auto compiled = CompiledGrammar::compile(json_like(), test_vocabulary(6, 100));
  ASSERT_TRUE(compiled.ok());
  const CompileStats& stats = (*compiled)->stats();
  EXPECT_GT(stats.partial_stacks, 10u);
  EXPECT_GT(stats.positions, 20u);
  EXPECT_GT((*compiled)->cache_bytes(), 0u);
  // A bound of no bytes keeps nothing and still gives the same masks.
  CompileOptions none;
  none.cache_bytes = 0;
  auto uncached = CompiledGrammar::compile(json_like(), test_vocabulary(6, 100), none);
  ASSERT_TRUE(uncached.ok());
  EXPECT_EQ((*uncached)->cache_bytes(), 0u);
  Matcher a(*compiled), b(*uncached);
  for (const char* piece : {"{\"a", "b\":[1", ",\"x\"", "]}"}) {
    std::vector<std::uint32_t> wa((*compiled)->vocabulary().mask_words()), wb(wa.size());
    a.fill_mask(wa);
    b.fill_mask(wb);
    EXPECT_EQ(wa, wb) << piece;
    ASSERT_TRUE(a.accept_bytes(piece));
    ASSERT_TRUE(b.accept_bytes(piece));
  }
}

TEST(MatcherTest, RefusesAGrammarThatFailsItsCheck) {
  Grammar g;
  g.set_root(g.add("root", {}));
  auto compiled = CompiledGrammar::compile(std::move(g), test_vocabulary(7, 0));
  ASSERT_FALSE(compiled.ok());
  EXPECT_NE(compiled.status().message().find("matches no string"), std::string::npos);
}

}  // namespace
}  // namespace kvvm::grammar
