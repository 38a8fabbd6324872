// grammar_from_choices: exactly the choices, as a trie whose alternatives never share a first
// byte, and its refusals.
#include <gtest/gtest.h>

#include <random>
#include <set>
#include <string>
#include <vector>

#include "kvvm/grammar/constraint.h"
#include "support/grammar_oracle.h"

namespace kvvm::grammar {
namespace {

using testing::oracle_accepts;
using testing::oracle_sample;
using testing::oracle_viable;

// Each rule's alternatives start with disjoint bytes, and at most one is empty: one parse per
// prefix, whatever the matcher.
void expect_deterministic(const Grammar& g) {
  for (const Rule& rule : g.rules()) {
    ByteSet seen;
    int empty = 0;
    for (const Sequence& alternative : rule.alternatives) {
      if (alternative.empty()) {
        ++empty;
        continue;
      }
      ASSERT_EQ(alternative[0].kind, Element::Kind::kBytes) << rule.name;
      const ByteSet& first = g.byte_sets()[alternative[0].index];
      for (unsigned b = 0; b < 256; ++b) {
        if (first.has(static_cast<std::uint8_t>(b))) {
          EXPECT_FALSE(seen.has(static_cast<std::uint8_t>(b))) << rule.name << " byte " << b;
        }
      }
      seen.add(first);
    }
    EXPECT_LE(empty, 1) << rule.name;
  }
}

TEST(ChoicesSourceTest, ExactlyOneOfTheChoices) {
  const std::vector<std::string> choices = {"yes", "yesterday", "no", "yes", "n/a"};
  const Result<Grammar> g = grammar_from_choices(choices);
  ASSERT_TRUE(g.ok()) << g.status().message();
  for (const std::string& c : choices) EXPECT_TRUE(oracle_accepts(*g, c)) << c;
  for (const char* s : {"", "y", "ye", "yest", "yesterdays", "noo", "n", "yesno", "Yes"}) {
    EXPECT_FALSE(oracle_accepts(*g, s)) << s;
  }
  EXPECT_TRUE(oracle_viable(*g, "yest"));
  EXPECT_FALSE(oracle_viable(*g, "yet"));
  expect_deterministic(*g);
  // "yes" is one path shared by both of its choices; "n" by "no" and "n/a".
  EXPECT_EQ(g->to_string(),
            "choice ::= [/] [a] | [o]\n"
            "choice-1 ::= \"\" | [t] [e] [r] [d] [a] [y]\n"
            "root ::= [n] choice | [y] [e] [s] choice-1\n");
  std::mt19937_64 rng(5);
  std::set<std::string> drawn;
  for (int i = 0; i < 200; ++i) {
    const std::optional<std::string> s = oracle_sample(*g, rng);
    ASSERT_TRUE(s);
    drawn.insert(*s);
  }
  EXPECT_EQ(drawn, (std::set<std::string>{"yes", "yesterday", "no", "n/a"}));
}

TEST(ChoicesSourceTest, BytesAreTakenAsTheyAre) {
  const std::vector<std::string> choices = {std::string("\xFF\x00", 2), "\xC3\xA9", "\"]\\"};
  const Result<Grammar> g = grammar_from_choices(choices);
  ASSERT_TRUE(g.ok()) << g.status().message();
  for (const std::string& c : choices) EXPECT_TRUE(oracle_accepts(*g, c));
  EXPECT_FALSE(oracle_accepts(*g, "\xC3"));
  EXPECT_FALSE(oracle_accepts(*g, "\xFF"));
  // One choice is one literal.
  const std::vector<std::string> one = {"only"};
  const Result<Grammar> single = grammar_from_choices(one);
  ASSERT_TRUE(single.ok());
  EXPECT_EQ(single->to_string(), "root ::= [o] [n] [l] [y]\n");
}

TEST(ChoicesSourceTest, Refusals) {
  const Result<Grammar> none = grammar_from_choices({});
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(none.status().message(), "choices: an empty list; give at least one");

  const std::vector<std::string> with_empty = {"a", "", "b"};
  const Result<Grammar> empty = grammar_from_choices(with_empty);
  ASSERT_FALSE(empty.ok());
  EXPECT_EQ(empty.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(empty.status().message(),
            "choices: choice 1 is the empty string; every choice needs a byte");

  const std::vector<std::string> big = {std::string(1 << 19, 'a'), std::string(1 << 19, 'b'), "c"};
  const Result<Grammar> large = grammar_from_choices(big);
  ASSERT_FALSE(large.ok());
  EXPECT_EQ(large.status().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(large.status().message(), "choices: 1048577 bytes in all; at most 1048576");

  // The limits' bounds too.
  const std::vector<std::string> branching = {"a", "ab", "abc", "abcd"};
  const Result<Grammar> rules = grammar_from_choices(branching, {.max_rules = 2});
  ASSERT_FALSE(rules.ok());
  EXPECT_EQ(rules.status().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(rules.status().message(), "choices: the trie needs 4 rules; at most 2");
  const Result<Grammar> elements = grammar_from_choices(branching, {.max_elements = 8});
  ASSERT_FALSE(elements.ok());
  EXPECT_EQ(elements.status().code(), StatusCode::kResourceExhausted);
}

// Random sets over {a, b}: accepted exactly when listed, for every string up to length 6.
TEST(ChoicesSourceTest, RandomSetsAreExact) {
  std::vector<std::string> strings{""};
  for (std::size_t n = 0; n < strings.size(); ++n) {
    if (strings[n].size() < 6) {
      strings.push_back(strings[n] + 'a');
      strings.push_back(strings[n] + 'b');
    }
  }
  std::mt19937_64 rng(17);
  for (int trial = 0; trial < 100; ++trial) {
    std::vector<std::string> choices;
    for (int i = 1 + static_cast<int>(rng() % 8); i > 0; --i) {
      choices.push_back(strings[1 + rng() % (strings.size() / 2)]);
    }
    const std::set<std::string> set(choices.begin(), choices.end());
    const Result<Grammar> g = grammar_from_choices(choices);
    ASSERT_TRUE(g.ok()) << g.status().message();
    expect_deterministic(*g);
    for (const std::string& s : strings) {
      ASSERT_EQ(oracle_accepts(*g, s), set.count(s) > 0) << s << "\n" << g->to_string();
    }
  }
}

TEST(ChoicesSourceTest, ManyChoicesCompile) {
  std::vector<std::string> choices;
  std::mt19937_64 rng(1);
  for (int i = 0; i < 20000; ++i) choices.push_back("label-" + std::to_string(rng() % 1000000));
  const Result<Grammar> g = grammar_from_choices(choices);
  ASSERT_TRUE(g.ok()) << g.status().message();
  EXPECT_TRUE(oracle_accepts(*g, choices[123]));
  EXPECT_FALSE(oracle_accepts(*g, "label-"));
}

}  // namespace
}  // namespace kvvm::grammar
