// grammar_from_gbnf: each construct, each refusal with its place, grammars users paste, random
// grammars against a direct reading of their text, and bombs refused in bounded time.
#include <gtest/gtest.h>

#include <functional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "grammar/builder.h"
#include "kvvm/grammar/constraint.h"
#include "support/grammar_oracle.h"

namespace kvvm::grammar {
namespace {

using testing::oracle_accepts;
using testing::oracle_sample;
using testing::oracle_viable;

Grammar compile(std::string_view text) {
  Result<Grammar> g = grammar_from_gbnf(text);
  EXPECT_TRUE(g.ok()) << g.status().message() << "\n" << text;
  if (!g.ok()) return Grammar();
  return std::move(g).value();
}

// Every sample is accepted; the listed strings are and are not.
void expect_language(const Grammar& g, const std::vector<std::string>& in,
                     const std::vector<std::string>& out, int samples = 100) {
  for (const std::string& s : in) EXPECT_TRUE(oracle_accepts(g, s)) << "should accept: " << s;
  for (const std::string& s : out) EXPECT_FALSE(oracle_accepts(g, s)) << "should refuse: " << s;
  std::mt19937_64 rng(11);
  for (int i = 0; i < samples; ++i) {
    const std::optional<std::string> text = oracle_sample(g, rng, 8);
    ASSERT_TRUE(text);
    EXPECT_TRUE(oracle_accepts(g, *text)) << *text;
  }
}

TEST(GbnfSourceTest, LiteralsAndTheirEscapes) {
  const Grammar g = compile(R"(root ::= "a\n\t\r\\\"\[\]\x41\u00e9\U0001F600" "é")");
  expect_language(g, {"a\n\t\r\\\"[]A\xC3\xA9\xF0\x9F\x98\x80\xC3\xA9"},
                  {"a", "a\n\t\r\\\"[]A\xE9\xF0\x9F\x98\x80\xC3\xA9"});
  // \xHH is a code point, as llama.cpp reads it: "\xe9" is the two bytes of é.
  EXPECT_TRUE(oracle_accepts(compile(R"(root ::= "\xe9")"), "\xC3\xA9"));
  // The empty literal matches the empty string.
  EXPECT_TRUE(oracle_accepts(compile(R"(root ::= "" "x" "")"), "x"));
}

TEST(GbnfSourceTest, ClassesOverCodePoints) {
  const Grammar word = compile("root ::= [a-z0-9_] [^\"\\\\a-z] [α-ω] [-x] [x-] [\\]\\-\\^^]");
  expect_language(word, {"a\x01\xCE\xB1-x]", "_Z\xCF\x89x-^", "9\xF0\x9F\x98\x80\xCE\xB2--^"},
                  {"aa\xCE\xB1--]", "a\"\xCE\xB1--]", "A!\xCE\xB1--]", "a!a--]", "a!\xCE\xB1y-]"});
  // A negated class takes any code point outside it, never a lone byte of one.
  const Grammar other = compile(R"(root ::= [^a])");
  EXPECT_TRUE(oracle_accepts(other, "\xE4\xB8\xAD"));
  EXPECT_FALSE(oracle_accepts(other, "\xE4"));
  EXPECT_FALSE(oracle_accepts(other, "a"));
  // [^] is any code point; escapes in ranges.
  EXPECT_TRUE(oracle_accepts(compile("root ::= [^]"), "\xF4\x8F\xBF\xBF"));
  const Grammar hex = compile(R"(root ::= [\x30-\x39\u0041-\U00000046])");
  EXPECT_TRUE(oracle_accepts(hex, "7"));
  EXPECT_TRUE(oracle_accepts(hex, "F"));
  EXPECT_FALSE(oracle_accepts(hex, "G"));
}

TEST(GbnfSourceTest, DotIsOneCodePoint) {
  const Grammar g = compile(R"(root ::= "<" . . ">")");
  expect_language(g, {"<ab>", "<\xC3\xA9\xF0\x9F\x98\x80>", "<\n\x7F>"},
                  {"<a>", "<abc>", "<\xC3>", "<\xFF\xFF>"});
}

TEST(GbnfSourceTest, GroupsAlternativesAndPostfixOperators) {
  expect_language(compile(R"(root ::= ("ab" | "c")? "d")"), {"abd", "cd", "d"}, {"abcd", "ab"});
  expect_language(compile(R"(root ::= "ab"* "c")"), {"c", "abc", "ababc"}, {"ac", "abab"});
  expect_language(compile(R"(root ::= [0-9]+ ("." [0-9]+)?)"), {"1", "12.5"}, {"", "1.", ".5"});
  expect_language(compile(R"(root ::= "a"{3})"), {"aaa"}, {"aa", "aaaa"});
  expect_language(compile(R"(root ::= "a"{2,})"), {"aa", "aaaaaaa"}, {"a", ""});
  expect_language(compile(R"(root ::= "ab"{1,3})"), {"ab", "abab", "ababab"}, {"", "abababab"});
  expect_language(compile(R"(root ::= "a"{ 0 , 2 } "b")"), {"b", "ab", "aab"}, {"aaab"});
  expect_language(compile(R"(root ::= "a"{,2})"), {"", "a", "aa"}, {"aaa"});
  expect_language(compile(R"(root ::= "a"{0})"), {""}, {"a"});
  // Stacked: x{2}? is (x x)?; (x+)+ is x+.
  expect_language(compile(R"(root ::= "x"{2}? "y")"), {"y", "xxy"}, {"xy", "xxxy"});
  expect_language(compile(R"(root ::= (("x")+)+ | "")"), {"", "x", "xxxx"}, {"y"});
  // Empty alternatives and empty groups.
  expect_language(compile(R"(root ::= "a" | | "b" ()*)"), {"a", "", "b"}, {"ab"});
  // Nested groups.
  expect_language(compile(R"(root ::= ("a" ("b" | "c")+ | "d")* "!")"),
                  {"!", "ab!", "acbcb!", "dab!"}, {"a!", "abd"});
}

TEST(GbnfSourceTest, RulesSpanLinesReferLaterAndKeepTheirNames) {
  const Grammar g = compile(R"(
# a comment before anything
root ::= greeting
  " " name   # comments end at the line's end
  ("!" | "?")
greeting ::=
  "hello" |
  "hi"
name ::= [A-Z] [a-z]* # a last comment, no newline after)");
  expect_language(g, {"hello Ann!", "hi B?"}, {"hello ann!", "hey Ann!", "hi Ann"});
  const std::string text = g.to_string();
  EXPECT_NE(text.find("greeting ::= "), std::string::npos) << text;
  EXPECT_NE(text.find("name ::= "), std::string::npos) << text;
  EXPECT_NE(text.find("name-star@"), std::string::npos) << text;
  // Names with '-' and '_' and digits; CRLF lines.
  expect_language(compile("root ::= my-rule_2\r\nmy-rule_2 ::= \"x\"\r\n"), {"x"}, {"y"});
  // A rule name that is also a word of a later rule's text is not a new rule without ::=.
  expect_language(compile("root ::= a b\na ::= \"1\"\nb ::= a a"), {"111"}, {"11"});
}

TEST(GbnfSourceTest, CheckNamesTheUsersRule) {
  const Result<Grammar> g = grammar_from_gbnf(
      "root ::= expr\nexpr ::= expr \"+\" num | num\n"
      "num ::= [0-9]+");
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(g.status().message().rfind("rule 'expr' is left-recursive", 0), 0)
      << g.status().message();
}

struct Refusal {
  std::string text;
  std::string message;  // a prefix of the status's message
  StatusCode code = StatusCode::kInvalidArgument;
};

TEST(GbnfSourceTest, RefusalsNameLineAndColumn) {
  const std::vector<Refusal> cases = {
      {"root ::= foo", "grammar at 1:10: rule 'foo' is not defined"},
      {"root ::= a\na ::= b c\nb ::= \"x\"", "grammar at 2:9: rule 'c' is not defined"},
      {"a ::= \"x\"", "grammar at 1:1: no rule is named root"},
      {"# nothing\n", "grammar at 1:1: no rule is named root"},
      {"root ::= \"a\"\n\nroot ::= \"b\"",
       "grammar at 3:1: rule 'root' is defined twice (first at 1:1)"},
      {"root ::= \"abc\nx ::= \"y\"", "grammar at 1:10: unterminated literal"},
      {"root ::= [abc", "grammar at 1:10: unterminated class"},
      {"root ::= [a-\n]", "grammar at 1:10: unterminated class"},
      {"root ::= []", "grammar at 1:10: an empty class [] matches nothing"},
      {"root ::= [z-a]", "grammar at 1:11: a reversed range in a class: 'z'-'a'"},
      {"root ::= \"a\\qb\"", "grammar at 1:12: bad escape '\\q'"},
      {"root ::= \"\\x4\"", "grammar at 1:11: bad escape '\\x': it takes 2 hex digits"},
      {"root ::= [\\u12G4]", "grammar at 1:11: bad escape '\\u': it takes 4 hex digits"},
      {"root ::= \"\\uD800\"", "grammar at 1:11: bad escape '\\uD800': a surrogate"},
      {"root ::= \"\\U00110000\"", "grammar at 1:11: bad escape '\\U00110000': past U+10FFFF"},
      {"root ::= \"\\", "grammar at 1:11: a '\\' at the end of the grammar"},
      {"root ::= \"a\"{3,2}",
       "grammar at 1:13: bad repetition bounds '{3,2}': the most, 2, is fewer than the least, 3"},
      {"root ::= \"a\"{}", "grammar at 1:13: bad repetition bounds '{}': no count given"},
      {"root ::= \"a\"{,}", "grammar at 1:13: bad repetition bounds '{,}': no count given"},
      {"root ::= \"a\"{x}", "grammar at 1:13: bad repetition bounds '{x}': expected a number"},
      {"root ::= \"a\"{2", "grammar at 1:13: bad repetition bounds '{': expected ',' or '}'"},
      {"root ::= * \"a\"", "grammar at 1:10: '*' follows nothing it could repeat"},
      {"root ::= \"a\" | +", "grammar at 1:16: '+' follows nothing it could repeat"},
      {"root ::= \"a\")", "grammar at 1:13: a ')' that closes no '('"},
      {"root ::= (\"a\"", "grammar at 1:10: unclosed '(': no ')' before the end"},
      {"root ::= (\"a\"\nb ::= \"c\")",
       "grammar at 1:10: unclosed '(': rule 'b' starts at 2:1 before its ')'"},
      {"root ::= ::= \"a\"", "grammar at 1:10: '::=' without a rule name before it"},
      {"root ::= \"a\" ; \"b\"", "grammar at 1:14: unexpected ';'"},
      {"root = \"a\"", "grammar at 1:6: expected '::=' after the rule name 'root', found '='"},
      {"\"a\" ::= root", "grammar at 1:1: expected a rule name"},
      {"root ::= \"\xFF\"", "grammar at 1:11: invalid UTF-8 (byte \\xFF)"},
      {"root ::= \"\xC3\xA9\" \xED\xA0\x80", "grammar at 1:14: invalid UTF-8 (byte \\xED)"},
      // Columns count code points.
      {"root ::= \"\xC3\xA9\xC3\xA9\" bar", "grammar at 1:15: rule 'bar' is not defined"},
      {"root ::= root \"a\" | \"b\"", "rule 'root' is left-recursive"},
      // Through references in last place too: root's frame stays under expr's each time.
      {"root ::= expr\nexpr ::= root \"+\" | \"x\"", "rule 'root' is left-recursive"},
      {"root ::= a\na ::= b\nb ::= \"x\"? root \"x\" | \"y\"", "rule 'root' is left-recursive"},
      {"root ::= [^\\x00-\\U0010FFFF]", "rule 'root-class@9' matches no string"},
      {"root ::= \"a\"{2000000}", "grammar at 1:13: root-repeat@12: a repetition of 2000000",
       StatusCode::kResourceExhausted},
      {"root ::= \"a\"{0,100000}",
       "grammar at 1:13: root-repeat@12: a repetition with 100000 optional copies passes",
       StatusCode::kResourceExhausted},
      {"root ::= " + std::string(300, '(') + "\"a\"" + std::string(300, ')'),
       "grammar at 1:266: groups nested more than 256 deep", StatusCode::kResourceExhausted},
  };
  for (const Refusal& c : cases) {
    const Result<Grammar> g = grammar_from_gbnf(c.text);
    ASSERT_FALSE(g.ok()) << c.text;
    EXPECT_EQ(g.status().code(), c.code) << c.text << ": " << g.status().message();
    EXPECT_EQ(g.status().message().rfind(c.message, 0), 0)
        << c.text << "\n got: " << g.status().message() << "\n want: " << c.message;
  }
}

TEST(GbnfSourceTest, TextPastItsBoundIsRefused) {
  std::string text = "root ::= \"" + std::string((1 << 20) - 11, 'a') + "\"";
  const Result<Grammar> g = grammar_from_gbnf(text + " ");
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.status().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(g.status().message(), "grammar: the text is 1048577 bytes; at most 1048576");
  // One byte less is a (long) grammar.
  EXPECT_TRUE(grammar_from_gbnf(text).ok());
}

std::string concat_rule(int i) {
  return "r" + std::to_string(i) + " ::= r" + std::to_string(i + 1) + "\n";
}

TEST(GbnfSourceTest, BombsAreRefusedAtTheirBound) {
  std::string nested = "root ::= \"x\"";
  for (int i = 0; i < 12; ++i) nested += "{100000}";
  std::vector<std::string> bombs = {
      nested,
      "root ::= a{600000} a{600000}\na ::= \"ab\"",
      "root ::= (\"a\" | \"b\"){100000,200000}",
      "root ::= a{0,60000}\na ::= \"x\"{0,60000}",
      "root ::= " + std::string(100000, '(') + "\"a\"",
  };
  std::string classes = "root ::= ";
  for (int i = 0; i < 70000; ++i) classes += "[^a] ";
  bombs.push_back(classes);  // a rule each: past the rule bound
  for (const std::string& text : bombs) {
    const Result<Grammar> g = grammar_from_gbnf(text);
    ASSERT_FALSE(g.ok()) << text.substr(0, 60);
    EXPECT_EQ(g.status().code(), StatusCode::kResourceExhausted) << g.status().message();
  }
  // Nested repetitions are rules, not copies of copies: x{1000}{1000} is two thousand elements.
  const Result<Grammar> product = grammar_from_gbnf("root ::= \"x\"{1000}{1000} \"y\"");
  ASSERT_TRUE(product.ok()) << product.status().message();
  EXPECT_LT(product->element_count(), 3000u);
  EXPECT_TRUE(oracle_accepts(*product, std::string(1000000, 'x') + "y"));
  EXPECT_FALSE(oracle_accepts(*product, std::string(999999, 'x') + "y"));
  // Many rules are not quadratic: a chain of 30000 rules, each naming the next.
  std::string chain = "root ::= r0\n";
  for (int i = 0; i < 30000; ++i) chain += concat_rule(i);
  chain += "r30000 ::= \"x\"\n";
  const Result<Grammar> long_chain = grammar_from_gbnf(chain);
  ASSERT_TRUE(long_chain.ok()) << long_chain.status().message();
  EXPECT_GT(long_chain->rules().size(), 30000u);  // (the Earley oracle is quadratic on it)
}

TEST(GbnfSourceTest, SmallerLimitsAreHonoured) {
  const GrammarLimits limits{.max_rules = 8, .max_elements = 64};
  const Result<Grammar> rules =
      grammar_from_gbnf("root ::= a? a? a? a? a? a? a? a? a? a?\na ::= \"x\"", limits);
  ASSERT_FALSE(rules.ok());
  EXPECT_EQ(rules.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(rules.status().message().find("bound of 8 rules"), std::string::npos)
      << rules.status().message();
  const Result<Grammar> elements =
      grammar_from_gbnf("root ::= \"" + std::string(100, 'a') + "\"", limits);
  ASSERT_FALSE(elements.ok());
  EXPECT_EQ(elements.status().code(), StatusCode::kResourceExhausted);
}

// Grammars users paste.

constexpr std::string_view kJson = R"(
root   ::= object
value  ::= object | array | string | number | ("true" | "false" | "null") ws

object ::=
  "{" ws (
            string ":" ws value
    ("," ws string ":" ws value)*
  )? "}" ws

array  ::=
  "[" ws (
            value
    ("," ws value)*
  )? "]" ws

string ::=
  "\"" (
    [^"\\\x7F\x00-\x1F] |
    "\\" (["\\bfnrt/] | "u" [0-9a-fA-F]{4}) # escapes
  )* "\"" ws

number ::= ("-"? ([0-9] | [1-9] [0-9]{0,15})) ("." [0-9]+)? ([eE] [-+]? [0-9] [1-9]{0,15})? ws

# Optional space: by convention, applied in this grammar after literal chars when allowed
ws ::= | " " | "\n" [ \t]{0,20}
)";

TEST(GbnfSourceTest, JsonGrammar) {
  const Grammar g = compile(kJson);
  expect_language(g,
                  {"{}", R"({"a": 1, "b": [true, null, "x\n\u00e9"]})", "{\"k\":{\"n\":-12.5e+3}}",
                   "{\"\xC3\xA9\": []}"},
                  {"[]", "{", R"({"a" 1})", R"({"a": 01x})", "{\"a\": \"\x01\"}", R"({"a": "\q"})",
                   R"({"a": [1,]})"},
                  200);
}

TEST(GbnfSourceTest, ArithmeticGrammar) {
  const Grammar g = compile(R"g(
root  ::= (expr "=" ws term "\n")+
expr  ::= term ([-+*/] term)*
term  ::= ident | num | "(" ws expr ")" ws
ident ::= [a-z] [a-z0-9_]* ws
num   ::= [0-9]+ ws
ws    ::= [ \t\n]*
)g");
  expect_language(g, {"1+2=3\n", "(a *b_1)/4 = x\n1=1\n", "((1))=2\n"},
                  {"1+=3\n", "1+2=3", "(1=1\n", "A=1\n"});
}

TEST(GbnfSourceTest, ListGrammar) {
  const Grammar g = compile(R"(
root ::= item+
# Excludes various line break characters
item ::= "- " [^\r\n\x0b\x0c\x85\u2028\u2029]+ "\n"
)");
  expect_language(g, {"- milk\n", "- eggs\n- b\xC3\xA9 \n"},
                  {"", "- \n", "-milk\n",
                   "- a\xE2\x80\xA8"
                   "b\n",
                   "- a"});
}

TEST(GbnfSourceTest, ChessGrammar) {
  const Grammar g = compile(R"(
# Specifies chess moves as a list in algebraic notation, using PGN conventions
root   ::= "1. " move " " move "\n" ([1-9] [0-9]? ". " move " " move "\n")+
move   ::= (pawn | nonpawn | castle) [+#]?
pawn   ::= ([a-h] "x")? [a-h] [1-8] ("=" [NBKQ])?
nonpawn ::= [NBKRQ] [a-h]? [1-8]? "x"? [a-h] [1-8]
castle ::= "O-O" "-O"?
)");
  expect_language(
      g, {"1. e4 e5\n2. Nf3 Nc6\n", "1. d4 Nf6\n2. c4 e6\n3. Nc3 Bb4+\n4. O-O-O exd8=Q#\n"},
      {"1. e4 e5\n", "1. e9 e5\n2. a3 a6\n", "1. e4 e5\n2. Zf3 Nc6\n"});
}

// Random grammars: rules of literals, classes, groups and operators over {a, b, c} rendered as
// GBNF text, against the strings of length <= 4 each expression denotes, computed directly.
struct Expr {
  enum Kind { kLiteral, kClass, kRef, kSeq, kAlt, kOp } kind = kLiteral;
  std::string text;     // literal: its bytes; class: the bytes in it
  bool negate = false;  // class
  int rule = 0;         // ref
  std::vector<Expr> parts;
  std::string op;         // "?", "*", "+", "{m}", "{m,}", "{m,n}"
  int min = 0, max = -1;  // op; max -1: unbounded
};

constexpr std::size_t kMaxLen = 4;
using Lang = std::set<std::string>;

Lang concat_langs(const Lang& a, const Lang& b) {
  Lang out;
  for (const std::string& x : a) {
    for (const std::string& y : b) {
      if (x.size() + y.size() <= kMaxLen) out.insert(x + y);
    }
  }
  return out;
}

Lang denote(const Expr& e, const std::vector<Lang>& rules) {
  switch (e.kind) {
    case Expr::kLiteral:
      return e.text.size() <= kMaxLen ? Lang{e.text} : Lang{};
    case Expr::kClass: {
      Lang out;
      for (char c : std::string("abcd")) {
        if ((e.text.find(c) != std::string::npos) != e.negate) out.insert(std::string(1, c));
      }
      return out;
    }
    case Expr::kRef:
      return rules[e.rule];
    case Expr::kSeq: {
      Lang out{""};
      for (const Expr& p : e.parts) out = concat_langs(out, denote(p, rules));
      return out;
    }
    case Expr::kAlt: {
      Lang out;
      for (const Expr& p : e.parts) {
        const Lang l = denote(p, rules);
        out.insert(l.begin(), l.end());
      }
      return out;
    }
    case Expr::kOp: {
      const Lang body = denote(e.parts[0], rules);
      Lang power{""};
      Lang out;
      // Past kMaxLen + 1 copies a non-empty string is too long; empty copies add nothing.
      const int last = e.max < 0 ? static_cast<int>(kMaxLen) + 1 : e.max;
      for (int n = 0; n <= std::max(last, e.min); ++n) {
        if (n >= e.min && n <= last) out.insert(power.begin(), power.end());
        power = concat_langs(power, body);
      }
      return out;
    }
  }
  return {};
}

std::string render(const Expr& e) {
  switch (e.kind) {
    case Expr::kLiteral:
      return "\"" + e.text + "\"";
    case Expr::kClass:
      return std::string("[") + (e.negate ? "^" : "") + e.text + "]";
    case Expr::kRef:
      return "r" + std::to_string(e.rule);
    case Expr::kSeq: {
      std::string out = "(";
      for (const Expr& p : e.parts) out += render(p) + " ";
      return out + ")";
    }
    case Expr::kAlt: {
      std::string out = "(";
      for (std::size_t i = 0; i < e.parts.size(); ++i) out += (i ? " | " : "") + render(e.parts[i]);
      return out + ")";
    }
    case Expr::kOp:
      return render(e.parts[0]) + e.op;
  }
  return "";
}

Expr random_expr(std::mt19937_64& rng, int depth, int rule) {
  const auto pick = [&](int n) { return static_cast<int>(rng() % static_cast<unsigned>(n)); };
  Expr e;
  const int kind = depth <= 0 ? pick(3) : pick(6);
  if (kind == 0) {
    e.kind = Expr::kLiteral;
    for (int i = pick(3); i > 0; --i) e.text += "abc"[pick(3)];
  } else if (kind == 1) {
    e.kind = Expr::kClass;
    e.negate = pick(4) == 0;
    for (int i = 1 + pick(2); i > 0; --i) e.text += "abc"[pick(3)];
  } else if (kind == 2) {
    // Later rules only: no recursion, so each rule's language is computed before its users.
    if (rule + 1 >= 4) return random_expr(rng, 0, 4);
    e.kind = Expr::kRef;
    e.rule = rule + 1 + pick(3 - rule);
  } else if (kind == 3 || kind == 4) {
    e.kind = kind == 3 ? Expr::kSeq : Expr::kAlt;
    for (int i = 1 + pick(3); i > 0; --i) e.parts.push_back(random_expr(rng, depth - 1, rule));
  } else {
    e.kind = Expr::kOp;
    e.parts.push_back(random_expr(rng, depth - 1, rule));
    switch (pick(6)) {
      case 0:
        e.op = "?";
        e.min = 0;
        e.max = 1;
        break;
      case 1:
        e.op = "*";
        e.min = 0;
        e.max = -1;
        break;
      case 2:
        e.op = "+";
        e.min = 1;
        e.max = -1;
        break;
      case 3:
        e.min = e.max = pick(3);
        e.op = "{" + std::to_string(e.min) + "}";
        break;
      case 4:
        e.min = pick(3);
        e.op = "{" + std::to_string(e.min) + ",}";
        break;
      default:
        e.min = pick(3);
        e.max = e.min + pick(3);
        e.op = "{" + std::to_string(e.min) + "," + std::to_string(e.max) + "}";
    }
  }
  return e;
}

TEST(GbnfSourceTest, RandomGrammarsMatchADirectReading) {
  std::vector<std::string> strings{""};
  for (std::size_t n = 0; n < strings.size(); ++n) {
    if (strings[n].size() == kMaxLen) continue;
    for (char c : std::string("abcd")) strings.push_back(strings[n] + c);
  }
  std::mt19937_64 rng(2024);
  int compared = 0;
  for (int trial = 0; trial < 300; ++trial) {
    std::vector<Expr> rules;
    for (int r = 0; r < 4; ++r) rules.push_back(random_expr(rng, 3, r));
    std::string text;
    for (int r = 0; r < 4; ++r)
      text += (r ? "r" + std::to_string(r) : "root") + " ::= " + render(rules[r]) + "\n";
    std::vector<Lang> langs(4);
    for (int r = 3; r >= 0; --r) langs[r] = denote(rules[r], langs);
    const Result<Grammar> g = grammar_from_gbnf(text);
    if (!g.ok()) {
      // A rule matching nothing ([^abc] over this alphabet still matches 'd', so only a
      // negated class of every code point could), nothing else is refused.
      ADD_FAILURE() << g.status().message() << "\n" << text;
      continue;
    }
    for (const std::string& s : strings) {
      ASSERT_EQ(oracle_accepts(*g, s), langs[0].count(s) > 0) << "string '" << s << "' in\n"
                                                              << text << g->to_string();
      ++compared;
    }
  }
  EXPECT_GT(compared, 1000);
}

// GBNF repetition against the same repetition built with the Builder by hand.
TEST(GbnfSourceTest, RepetitionEqualsTheBuildersOwn) {
  Grammar hand;
  Builder b(hand);
  Result<Sequence> rep = b.repeat("rep", b.literal("a"), 2, 3);
  ASSERT_TRUE(rep.ok());
  hand.set_root(hand.add("root", {*rep}));
  const Grammar text = compile(R"(root ::= "a"{2,3})");
  for (int n = 0; n < 6; ++n) {
    EXPECT_EQ(oracle_accepts(text, std::string(n, 'a')), oracle_accepts(hand, std::string(n, 'a')))
        << n;
  }
}

}  // namespace
}  // namespace kvvm::grammar
