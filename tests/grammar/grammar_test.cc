#include "kvvm/grammar/grammar.h"

#include <gtest/gtest.h>

#include <random>
#include <string>

#include "grammar/builder.h"
#include "support/grammar_oracle.h"

namespace kvvm::grammar {
namespace {

using testing::oracle_accepts;
using testing::oracle_sample;
using testing::oracle_viable;

TEST(GrammarTest, RefusesWhatHasNoPushdownRun) {
  Grammar g;
  const RuleId a = g.declare("a");
  Builder b(g);
  // a ::= a "x" | "y": left recursion.
  g.define(a, {Builder::cat({b.ref(a), b.literal("x")}), b.literal("y")});
  g.set_root(a);
  const Status status = g.check();
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("'a' is left-recursive"), std::string::npos) << status.message();
}

TEST(GrammarTest, RefusesUndefinedAndEmptyRules) {
  Grammar g;
  const RuleId root = g.declare("root");
  const RuleId later = g.declare("later");
  Builder b(g);
  g.define(root, {b.ref(later)});
  g.set_root(root);
  EXPECT_NE(g.check().message().find("'later' is not defined"), std::string::npos);
  g.define(later, {});
  EXPECT_NE(g.check().message().find("'later' matches no string"), std::string::npos)
      << g.check().message();
  Grammar none;
  EXPECT_NE(none.check().message().find("no root"), std::string::npos);
}

TEST(GrammarTest, RepetitionOfSomethingEmptyIsNotLeftRecursion) {
  Grammar g;
  Builder b(g);
  // ("a"?)*: the star's body can be empty; the self-reference is in last place.
  const Sequence body = b.optional("opt", b.literal("a"));
  g.set_root(g.add("root", {b.star("many", body)}));
  ASSERT_TRUE(g.check().ok()) << g.check().message();
  EXPECT_TRUE(oracle_accepts(g, ""));
  EXPECT_TRUE(oracle_accepts(g, "aaa"));
  EXPECT_FALSE(oracle_accepts(g, "ab"));
}

TEST(GrammarTest, BoundedRepetitionMatchesExactlyItsCounts) {
  Grammar g;
  Builder b(g);
  Result<Sequence> body = b.repeat("ab", b.literal("ab"), 2, 4);
  ASSERT_TRUE(body.ok());
  g.set_root(g.add("root", {*body}));
  ASSERT_TRUE(g.check().ok());
  EXPECT_FALSE(oracle_accepts(g, "ab"));
  EXPECT_TRUE(oracle_accepts(g, "abab"));
  EXPECT_TRUE(oracle_accepts(g, "abababab"));
  EXPECT_FALSE(oracle_accepts(g, "ababababab"));
  EXPECT_TRUE(oracle_viable(g, "aba"));
  EXPECT_FALSE(oracle_viable(g, "abb"));
}

TEST(GrammarTest, RepetitionPastTheBoundIsRefusedBeforeItIsBuilt) {
  Grammar g;
  Builder b(g, GrammarLimits{.max_rules = 1000, .max_elements = 1000});
  Result<Sequence> body = b.repeat("digits", b.literal("0123456789"), 0, 1000000);
  ASSERT_FALSE(body.ok());
  EXPECT_EQ(body.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(body.status().message().find("digits: a repetition of 1000000"), std::string::npos)
      << body.status().message();
  EXPECT_LT(g.element_count(), 100u);
}

TEST(GrammarTest, SeparatedListsCountTheirItems) {
  Grammar g;
  Builder b(g);
  Result<Sequence> list = b.separated("list", b.literal("x"), b.literal(","), 0, 2);
  ASSERT_TRUE(list.ok());
  g.set_root(g.add("root", {Builder::cat({b.literal("["), *list, b.literal("]")})}));
  ASSERT_TRUE(g.check().ok());
  EXPECT_TRUE(oracle_accepts(g, "[]"));
  EXPECT_TRUE(oracle_accepts(g, "[x]"));
  EXPECT_TRUE(oracle_accepts(g, "[x,x]"));
  EXPECT_FALSE(oracle_accepts(g, "[x,x,x]"));
  EXPECT_FALSE(oracle_accepts(g, "[,]"));
}

// Every code point in the ranges encodes to a string the rule accepts, and none outside.
TEST(GrammarTest, CodepointRangesAreTheirUtf8Encodings) {
  const auto utf8 = [](std::uint32_t cp) {
    std::string out;
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xC0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      out += static_cast<char>(0xE0 | (cp >> 12));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (cp >> 18));
      out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    }
    return out;
  };
  const std::vector<CodepointRange> ranges = {
      {'a', 'f'}, {0x3B1, 0x3C9}, {0x7F0, 0x1000}, {0xD000, 0xE100}, {0x1F600, 0x1F64F}};
  for (bool negate : {false, true}) {
    Grammar g;
    Builder b(g);
    g.set_root(g.add("root", {b.codepoints("class", ranges, negate)}));
    ASSERT_TRUE(g.check().ok());
    std::mt19937_64 rng(7);
    for (int i = 0; i < 3000; ++i) {
      std::uint32_t cp = static_cast<std::uint32_t>(rng() % 0x110000);
      if (i < 64)
        cp = std::vector<std::uint32_t>{'a',     'f',     'g',     0x3B1,   0x3C9,   0x7EF,
                                        0x7F0,   0x7FF,   0x800,   0xFFF,   0x1000,  0x1001,
                                        0xD000,  0xD7FF,  0xE000,  0xE100,  0xE101,  0xFFFF,
                                        0x10000, 0x1F600, 0x1F64F, 0x1F650, 0x10FFFF}[i % 23];
      if (cp >= 0xD800 && cp <= 0xDFFF) continue;
      bool inside = false;
      for (const CodepointRange& r : ranges) inside |= cp >= r.lo && cp <= r.hi;
      EXPECT_EQ(oracle_accepts(g, utf8(cp)), inside != negate) << std::hex << cp << negate;
    }
    // A surrogate's encoding and a bare continuation byte never match.
    EXPECT_FALSE(oracle_accepts(g, "\xED\xA0\x80"));
    EXPECT_FALSE(oracle_accepts(g, "\x80"));
  }
}

TEST(GrammarTest, SamplesAreInTheLanguage) {
  Grammar g;
  Builder b(g);
  const RuleId value = g.declare("value");
  Result<Sequence> items = b.separated("items", b.ref(value), b.literal(","), 0, std::nullopt);
  ASSERT_TRUE(items.ok());
  g.define(value, {b.plus("digits", b.bytes(ByteSet::range('0', '9'))),
                   Builder::cat({b.literal("["), *items, b.literal("]")})});
  g.set_root(value);
  ASSERT_TRUE(g.check().ok());
  std::mt19937_64 rng(3);
  for (int i = 0; i < 200; ++i) {
    const std::optional<std::string> text = oracle_sample(g, rng, 6);
    ASSERT_TRUE(text);
    EXPECT_TRUE(oracle_accepts(g, *text)) << *text;
  }
  EXPECT_FALSE(oracle_accepts(g, "[1,]"));
  EXPECT_TRUE(oracle_accepts(g, "[[1],[],2]"));
}

TEST(GrammarTest, PrintsOneRuleALineAndFingerprintsContent) {
  Grammar g;
  Builder b(g);
  g.set_root(g.add("root", {b.literal("a\""), {}}));
  EXPECT_EQ(g.to_string(), "root ::= [a] [\\x22] | \"\"\n");
  Grammar same;
  Builder b2(same);
  same.set_root(same.add("other-name", {b2.literal("a\""), {}}));
  EXPECT_EQ(g.fingerprint(), same.fingerprint());
  Grammar different;
  Builder b3(different);
  different.set_root(different.add("root", {b3.literal("b\""), {}}));
  EXPECT_NE(g.fingerprint(), different.fingerprint());
}

}  // namespace
}  // namespace kvvm::grammar
