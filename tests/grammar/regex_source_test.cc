// grammar_from_regex: each construct's language through the oracle, every refusal by its
// message, schema bombs bounded in time, and the grammars of patterns typical of JSON Schema
// compared with PCRE2 on sampled, mutated and random strings.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "grammar/builder.h"
#include "grammar/regex_embed.h"
#include "kvvm/grammar/constraint.h"
#include "support/grammar_oracle.h"

namespace kvvm::grammar {
namespace {
// The helpers' own namespace: the grammar tests share unity batches.
namespace regex_test {

using testing::oracle_accepts;
using testing::oracle_sample;

// `pattern`'s language holds every string of `in` and none of `out`.
void expect_language(std::string_view pattern, const std::vector<std::string>& in,
                     const std::vector<std::string>& out) {
  SCOPED_TRACE(std::string("pattern ") + std::string(pattern));
  Result<Grammar> g = grammar_from_regex(pattern);
  ASSERT_TRUE(g.ok()) << g.status().to_string();
  for (const std::string& s : in) EXPECT_TRUE(oracle_accepts(*g, s)) << "should match: " << s;
  for (const std::string& s : out) EXPECT_FALSE(oracle_accepts(*g, s)) << "should not: " << s;
}

void expect_refused(std::string_view pattern, std::string_view message,
                    StatusCode code = StatusCode::kInvalidArgument) {
  SCOPED_TRACE(std::string("pattern ") + std::string(pattern));
  Result<Grammar> g = grammar_from_regex(pattern);
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.status().code(), code) << g.status().to_string();
  EXPECT_NE(g.status().message().find(message), std::string::npos) << g.status().message();
}

TEST(RegexSourceTest, LiteralsMatchThemselvesWhole) {
  expect_language("abc", {"abc"}, {"", "ab", "abcd", "xabc", "ABC"});
  expect_language("café€😀", {"café€😀"}, {"cafe€😀", "café€"});
  expect_language("", {""}, {"a"});
  expect_language("a b", {"a b"}, {"ab"});
}

TEST(RegexSourceTest, EscapesNameTheirCharacters) {
  expect_language("\\n\\t\\r\\f\\v\\0", {std::string("\n\t\r\f\v\0", 6)}, {"\\n\\t"});
  expect_language("\\/\\\\\\.\\*\\+\\?\\(\\)\\[\\]\\{\\}\\|\\^\\$", {"/\\.*+?()[]{}|^$"}, {});
  expect_language("\\x41\\u00e9\\u{1F600}\\uD83D\\uDE00\\u{0}", {std::string("Aé😀😀\0", 12)},
                  {"Aé😀😀"});
  expect_language("\\cJ\\ca\\cZ", {"\n\x01\x1a"}, {"cJ"});
  expect_language("\\.", {"."}, {"a"});
}

TEST(RegexSourceTest, DotIsAnyCodePointButALineTerminator) {
  expect_language(".", {"a", "é", "€", "😀", "\t", " ", std::string(1, '\0'), "\u0085"},
                  {"", "\n", "\r", "\u2028", "\u2029", "ab"});
  expect_language("a.c", {"abc", "a.c", "aéc"}, {"ac", "a\nc", "abbc"});
}

TEST(RegexSourceTest, ClassesAndNegations) {
  expect_language("[a-c]", {"a", "b", "c"}, {"d", "A", "", "ab"});
  expect_language("[^a-c]", {"d", "é", "\n", "😀"}, {"a", "c", ""});
  expect_language("[a-]", {"a", "-"}, {"b"});
  expect_language("[-a]", {"a", "-"}, {"b"});
  expect_language("[a-c-e]", {"a", "b", "-", "e"}, {"d"});
  expect_language("[\\d_]", {"0", "9", "_"}, {"a"});
  expect_language("[^\\d]", {"a", "é"}, {"5"});
  expect_language("[\\b]", {"\b"}, {"b"});
  expect_language("[\\-\\]\\\\]", {"-", "]", "\\"}, {"a"});
  expect_language("[\\w-]", {"a", "-", "_"}, {"é"});
  expect_language("[α-ω]", {"α", "λ", "ω"}, {"a", "Ω"});
  expect_language("[^]", {"a", "\n", "😀"}, {"", "ab"});
  expect_language("[\\s\\S]", {"a", "\n", "😀"}, {""});
  expect_language("[\\u{1F600}-\\u{1F64F}]", {"😀", "🙏"}, {"🙐", "a"});
  expect_language("[\\uD83D\\uDE00x]", {"😀", "x"}, {"\xed\xa0\xbd"});
  expect_language("[[]", {"["}, {"]"});
  expect_language("[\\x41-\\x43]", {"A", "C"}, {"D"});
  // A lone surrogate in a class bounds a range but is no member of its own.
  expect_language("[\\u0041-\\uDFFF]", {"A", "\uD7FF"}, {"\uE000"});
}

TEST(RegexSourceTest, ClassEscapesAreEcmaScripts) {
  expect_language("\\d", {"0", "9"}, {"a", "٣"});  // ASCII digits only
  expect_language("\\w", {"a", "Z", "0", "_"}, {"é", "-", " "});
  expect_language("\\s",
                  {"\t", "\n", "\v", "\f", "\r", " ", "\u00a0", "\u1680", "\u2000", "\u200a",
                   "\u2028", "\u2029", "\u202f", "\u205f", "\u3000", "\ufeff"},
                  {"\u0085", "\u200b", "a", "\u180e"});
  expect_language("\\S", {"a", "\u0085", "\u200b"}, {" ", "\ufeff", "\n"});
  expect_language("\\D", {"a", "é"}, {"5"});
  expect_language("\\W", {"é", "-"}, {"a", "_"});
}

TEST(RegexSourceTest, GroupsAndAlternation) {
  expect_language("(ab)+", {"ab", "abab"}, {"", "a", "aba"});
  expect_language("(?:ab)+c", {"abc", "ababc"}, {"c", "abac"});
  expect_language("(?<year>\\d{4})-(?<m>\\d{2})", {"2024-01"}, {"2024-1", "24-01"});
  expect_language("cat|dog|", {"cat", "dog", ""}, {"catdog", "ca"});
  expect_language("a(b|c|)d", {"abd", "acd", "ad"}, {"abcd", "a"});
  expect_language("((a|b)(c|d))*", {"", "ac", "bdad"}, {"a", "abcd"});
  expect_language("()", {""}, {"a"});
  expect_language("()*a", {"a"}, {"", "aa"});
  expect_language("(|a)*", {"", "a", "aaa"}, {"b"});
}

TEST(RegexSourceTest, QuantifiersAndTheirLazyFormsCount) {
  const std::vector<std::string> as = {"", "a", "aa", "aaa", "aaaa", "aaaaa", "aaaaaa"};
  const auto check = [&as](std::string_view pattern, int min, int max) {
    std::vector<std::string> in, out;
    for (int n = 0; n < static_cast<int>(as.size()); ++n) {
      (n >= min && (max < 0 || n <= max) ? in : out).push_back(as[static_cast<std::size_t>(n)]);
    }
    out.push_back("b");
    out.push_back("ab");
    expect_language(pattern, in, out);
  };
  for (std::string lazy : {"", "?"}) {
    check("a?" + lazy, 0, 1);
    check("a*" + lazy, 0, -1);
    check("a+" + lazy, 1, -1);
    check("a{3}" + lazy, 3, 3);
    check("a{2,}" + lazy, 2, -1);
    check("a{2,4}" + lazy, 2, 4);
    check("a{0}" + lazy, 0, 0);
    check("a{0,1}" + lazy, 0, 1);
    expect_language("(?:aa){1,2}" + lazy, {"aa", "aaaa"}, {"", "a", "aaa", "aaaaa"});
    check("(?:a|aa){2}" + lazy, 2, 4);
  }
  check("a{002,03}", 2, 3);
  expect_language("(a{3}){2}", {"aaaaaa"}, {"aaa", "aaaaa", "aaaaaaa"});
  expect_language("(ab){2,3}c", {"ababc", "abababc"}, {"abc", "ababababc"});
}

TEST(RegexSourceTest, AnchorsAtTheEndsAreDropped) {
  expect_language("^abc$", {"abc"}, {"abcabc", "", "ab"});
  expect_language("^a$|^b$", {"a", "b"}, {"ab", ""});
  expect_language("^a|b$", {"a", "b"}, {"ab"});
  expect_language("^$", {""}, {"a"});
  expect_language("^", {""}, {"a"});
  expect_language("$", {""}, {"a"});
}

TEST(RegexSourceTest, RefusesWhatAGrammarCannotMatchByName) {
  expect_refused("(?=a)", "regex at byte 0: lookahead \"(?=\" is not supported");
  expect_refused("a(?!b)", "regex at byte 1: negative lookahead \"(?!\" is not supported");
  expect_refused("(?<=a)b", "regex at byte 0: lookbehind \"(?<=\" is not supported");
  expect_refused("x(?<!a)b", "regex at byte 1: negative lookbehind \"(?<!\" is not supported");
  expect_refused("(a)\\1", "regex at byte 3: backreference \"\\1\" is not supported");
  expect_refused("(a)\\12", "regex at byte 3: backreference \"\\12\" is not supported");
  expect_refused("(?<n>a)\\k<n>", "regex at byte 7: backreference \"\\k<n>\" is not supported");
  expect_refused("a\\b", "regex at byte 1: word boundary \"\\b\" is not supported");
  expect_refused("\\Ba", "regex at byte 0: non-word-boundary \"\\B\" is not supported");
  expect_refused("a^b", "regex at byte 1: anchor \"^\" inside the pattern is not supported");
  expect_refused("a$b", "regex at byte 1: anchor \"$\" inside the pattern is not supported");
  expect_refused("(a$)", "regex at byte 2: anchor \"$\"");
  expect_refused("(^a)", "regex at byte 1: anchor \"^\"");
  expect_refused("^^a", "regex at byte 1: anchor \"^\"");
  expect_refused("\\p{L}", "regex at byte 0: Unicode property escape \"\\p{L}\" is not supported");
  expect_refused("[\\P{Lu}]", "regex at byte 1: Unicode property escape \"\\P{Lu}\"");
  expect_refused("(?i)a", "regex at byte 0: inline modifiers \"(?i\" are not supported");
  expect_refused("(?P<n>a)", "regex at byte 0: \"(?\" starts no group ECMAScript knows");
  expect_refused("\\uD800", "regex at byte 0: lone surrogate \"\\uD800\" matches no UTF-8 text");
}

TEST(RegexSourceTest, RefusesMalformedPatternsNamingTheOffset) {
  expect_refused("(ab", "regex at byte 0: the group opened here is not closed");
  expect_refused("a(b(c)", "regex at byte 1: the group opened here is not closed");
  expect_refused("ab)", "regex at byte 2: ')' closes no group");
  expect_refused("[z-a]", "regex at byte 1: range \"z-a\" is out of order");
  expect_refused("[\\d-z]", "regex at byte 1: range \"\\d-z\" has a class escape at an end");
  expect_refused("[abc", "regex at byte 0: the class opened here is not closed");
  expect_refused("[]", "regex at byte 0: class \"[]\" matches no character");
  expect_refused("x[^\\s\\S]", "regex at byte 1: class \"[^\\s\\S]\" matches no character");
  expect_refused("a{3,2}", "regex at byte 1: quantifier \"{3,2}\" has its bounds out of order");
  expect_refused("*a", "regex at byte 0: nothing to repeat before \"*\"");
  expect_refused("a|+", "regex at byte 2: nothing to repeat before \"+\"");
  expect_refused("(?a)", "regex at byte 0: inline modifiers");
  expect_refused("(?)", "regex at byte 0: \"(?\" starts no group");
  expect_refused("{2}", "regex at byte 0: nothing to repeat before \"{2}\"");
  expect_refused("a**", "regex at byte 2: nothing to repeat before \"*\"");
  expect_refused("a{2}{3}", "regex at byte 4: nothing to repeat before \"{\"");
  expect_refused("a*?+", "regex at byte 3: nothing to repeat before \"+\"");
  expect_refused("^*", "regex at byte 1: nothing to repeat");
  expect_refused("a\\", "regex at byte 1: the pattern ends with a lone backslash");
  expect_refused("[a\\", "regex at byte 2: the pattern ends with a lone backslash");
  expect_refused("a{", "regex at byte 1: '{' does not start a quantifier");
  expect_refused("a{,3}", "regex at byte 1: '{' does not start a quantifier");
  expect_refused("a{1,x}", "regex at byte 1: '{' does not start a quantifier");
  expect_refused("a}", "regex at byte 1: lone '}'");
  expect_refused("a]", "regex at byte 1: lone ']'");
  expect_refused("\\a", "regex at byte 0: unknown escape \"\\a\"");
  expect_refused("x\\-", "regex at byte 1: unknown escape \"\\-\"");
  expect_refused("\\é", "regex at byte 0: unknown escape \"\\é\"");
  expect_refused("[\\B]", "regex at byte 1: unknown escape \"\\B\"");
  expect_refused("\\x4g", "regex at byte 0: \"\\x\" needs two hex digits");
  expect_refused("\\u12", "regex at byte 0: \"\\u\" needs four hex digits");
  expect_refused("\\u{110000}", "regex at byte 0: \"\\u{...}\" is past U+10FFFF");
  expect_refused("\\u{}", "regex at byte 0: \"\\u{\" needs hex digits");
  expect_refused("\\c1", "regex at byte 0: control escape \"\\c\" needs a letter");
  expect_refused("\\01", "regex at byte 0: octal escape");
  expect_refused("(?<1a>x)", "regex at byte 3: group name has '1'");
  expect_refused("(?<a-b>x)", "regex at byte 4: group name has '-'");
  expect_refused("(?<ab", "regex at byte 0: the group name opened here has no closing '>'");
  expect_refused("(?<>x)", "regex at byte 0: the group name is empty");
}

TEST(RegexSourceTest, RefusesInvalidUtf8NamingTheByte) {
  expect_refused("ab\xff", "regex at byte 2: invalid UTF-8");
  expect_refused("a\xc3", "regex at byte 1: invalid UTF-8");
  expect_refused("\xc0\x80", "regex at byte 0: invalid UTF-8");          // overlong
  expect_refused("xx\xed\xa0\x80", "regex at byte 2: invalid UTF-8");    // a surrogate
  expect_refused("\xf4\x90\x80\x80", "regex at byte 0: invalid UTF-8");  // past U+10FFFF
  expect_refused("[\x80]", "regex at byte 1: invalid UTF-8");
}

TEST(RegexSourceTest, NestingPastTheBoundIsRefused) {
  const std::string deep = std::string(300, '(') + "a" + std::string(300, ')');
  expect_refused(deep, "regex at byte 256: groups nested deeper than 256",
                 StatusCode::kResourceExhausted);
  const std::string fine = std::string(200, '(') + "a" + std::string(200, ')');
  expect_language(fine, {"a"}, {""});
}

// Schema bombs: nested counts share their bodies (the grammar grows as their sum, not their
// product); a count too large for the limits is refused before it is built.
TEST(RegexSourceTest, SchemaBombsAreSmallOrRefused) {
  for (std::string_view bomb : {"(a{1000}){1000}", "((a{1000}){1000}){1000}",
                                "(((a|b){0,1000}){0,1000}){0,1000}", "((ab){1000}c){1000}"}) {
    Result<Grammar> g = grammar_from_regex(bomb);
    ASSERT_TRUE(g.ok()) << bomb << ": " << g.status().to_string();
    EXPECT_LT(g->element_count(), 20000u) << bomb;
  }
  expect_language("((a{2}){3}){2}", {std::string(12, 'a')}, {std::string(11, 'a')});
  expect_refused("a{2000000}", "regex@1: a repetition of 2000000 copies",
                 StatusCode::kResourceExhausted);
  expect_refused("xy(ab){1048576}", "regex@6: a repetition of 1048576 copies",
                 StatusCode::kResourceExhausted);
  expect_refused("a{99999999999999999999999}", "regex@1: a repetition of 18446744073709551615",
                 StatusCode::kResourceExhausted);
  expect_refused("a{3,99999999999999999999999}", "passes the grammar's bound",
                 StatusCode::kResourceExhausted);
  expect_refused("a{0,100000}", "regex@1: a repetition with 100000 optional copies",
                 StatusCode::kResourceExhausted);
  expect_refused("(a{0,40000}){0,40000}", "regex@12: a repetition with 40000 optional copies",
                 StatusCode::kResourceExhausted);
  expect_refused("a{1000000}b{1000000}", "regex@11: a repetition of 1000000 copies",
                 StatusCode::kResourceExhausted);
  const GrammarLimits small{.max_rules = 1000, .max_elements = 1000};
  Result<Grammar> limited = grammar_from_regex("(a{1000}){1000}", small);
  ASSERT_FALSE(limited.ok());
  EXPECT_EQ(limited.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(limited.status().message().find("regex@9: a repetition of 1000 copies"),
            std::string::npos)
      << limited.status().message();
}

// Long patterns of many small constructs: each rule and repetition costs the same however many
// came before (naming a rule and counting elements are not walks of the grammar so far).
TEST(RegexSourceTest, LongPatternsGrowTheGrammarLinearly) {
  std::string optionals, counted, literal(200000, 'x');
  for (int i = 0; i < 20000; ++i) optionals += "a?";
  for (int i = 0; i < 8000; ++i) counted += "(a|b){2}";
  // The grammar grows with the pattern, a few elements and rules per construct (the time is
  // kvvm bench's to measure, not a test's).
  for (const std::string& pattern : {optionals, counted, literal}) {
    Result<Grammar> g = grammar_from_regex(pattern);
    ASSERT_TRUE(g.ok()) << g.status().to_string();
    EXPECT_LT(g->element_count(), 4 * pattern.size()) << pattern.substr(0, 20);
    EXPECT_LT(g->rules().size(), 4 * pattern.size()) << pattern.substr(0, 20);
  }
  expect_refused(std::string(1100000, 'x'), "regex@0: a sequence of 1100000 elements passes",
                 StatusCode::kResourceExhausted);
}

TEST(RegexSourceTest, EmbedsIntoAnotherGrammarNamingTheCallersPlace) {
  Grammar g;
  Builder b(g);
  Result<Sequence> body = embed_regex(b, "^[a-c]+\\d$", "schema at /a: pattern");
  ASSERT_TRUE(body.ok()) << body.status().to_string();
  g.set_root(g.add("root", {Builder::cat({b.literal("\""), *body, b.literal("\"")})}));
  ASSERT_TRUE(g.check().ok()) << g.check().message();
  EXPECT_TRUE(oracle_accepts(g, "\"ab1\""));
  EXPECT_FALSE(oracle_accepts(g, "ab1"));
  EXPECT_FALSE(oracle_accepts(g, "\"1\""));
  Result<Sequence> refused = embed_regex(b, "a(?=b)", "schema at /a: pattern");
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().message(),
            "schema at /a: pattern at byte 1: lookahead \"(?=\" is not supported");
  Result<Sequence> bomb = embed_regex(b, "a{2000000}", "schema at /a: pattern");
  ASSERT_FALSE(bomb.ok());
  EXPECT_EQ(bomb.status().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(bomb.status().message().rfind("schema at /a: pattern: regex@1: a repetition", 0), 0u)
      << bomb.status().message();
}

// ---- Against PCRE2 ----

// ECMAScript's \s and \S, as the insides of PCRE2 classes (PCRE2's own are ASCII without UCP,
// and Unicode's White_Space with it: neither is ECMAScript's).
constexpr std::string_view kPcreSpace =
    "\\t\\n\\x{0B}\\f\\r \\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}"
    "\\x{205F}\\x{3000}\\x{FEFF}";
constexpr std::string_view kPcreNonSpace =
    "\\x{0}-\\x{8}\\x{E}-\\x{1F}\\x{21}-\\x{9F}\\x{A1}-\\x{167F}\\x{1681}-\\x{1FFF}"
    "\\x{200B}-\\x{2027}\\x{202A}-\\x{202E}\\x{2030}-\\x{205E}\\x{2060}-\\x{2FFF}"
    "\\x{3001}-\\x{FEFE}\\x{FF00}-\\x{10FFFF}";

int hex(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return c - 'A' + 10;
}

// The corpus's ECMAScript patterns in PCRE2's syntax, where the two differ: \s and . are
// ECMAScript's sets, \uXXXX (and pairs) and \u{...} are \x{...}, \v is VT, '[' in a class is a
// character (not POSIX [:...:]), [^] is anything. \d and \w are ASCII in both (no UCP).
std::string to_pcre2(std::string_view p) {
  std::string out;
  bool in_class = false;
  for (std::size_t i = 0; i < p.size(); ++i) {
    const char c = p[i];
    if (c == '\\') {
      const char e = p[++i];
      if (e == 's' || e == 'S') {
        const std::string_view set = e == 's' ? kPcreSpace : kPcreNonSpace;
        out += in_class ? std::string(set) : "[" + std::string(set) + "]";
      } else if (e == 'v') {
        out += "\\x{0B}";
      } else if (e == 'u') {
        std::uint32_t cp = 0;
        if (p[i + 1] == '{') {
          for (i += 2; p[i] != '}'; ++i) cp = cp * 16 + static_cast<std::uint32_t>(hex(p[i]));
        } else {
          for (int k = 0; k < 4; ++k) cp = cp * 16 + static_cast<std::uint32_t>(hex(p[++i]));
          if (cp >= 0xD800 && cp < 0xDC00 && p.substr(i + 1, 2) == "\\u") {
            i += 2;  // past the second "\\u"
            std::uint32_t low = 0;
            for (int k = 0; k < 4; ++k) low = low * 16 + static_cast<std::uint32_t>(hex(p[++i]));
            cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
          }
        }
        char buf[16];
        std::snprintf(buf, sizeof buf, "\\x{%X}", cp);
        out += buf;
      } else {
        out += c;
        out += e;
      }
    } else if (in_class) {
      if (c == ']') in_class = false;
      out += c == '[' ? std::string("\\[") : std::string(1, c);
    } else if (c == '[') {
      if (p.substr(i, 3) == "[^]") {
        out += "[\\x{0}-\\x{10FFFF}]";
        i += 2;
      } else {
        in_class = true;
        out += c;
        if (p[i + 1] == '^') out += p[++i];
      }
    } else if (c == '.') {
      out += "[^\\n\\r\\x{2028}\\x{2029}]";
    } else {
      out += c;
    }
  }
  return out;
}

class Pcre2 {
 public:
  explicit Pcre2(const std::string& pattern) {
    int error = 0;
    PCRE2_SIZE offset = 0;
    code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                          PCRE2_UTF | PCRE2_DOLLAR_ENDONLY, &error, &offset, nullptr);
    if (code_ == nullptr) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(error, message, sizeof message);
      error_ =
          std::string(reinterpret_cast<const char*>(message)) + " at " + std::to_string(offset);
      return;
    }
    data_ = pcre2_match_data_create_from_pattern(code_, nullptr);
  }
  ~Pcre2() {
    pcre2_match_data_free(data_);
    pcre2_code_free(code_);
  }
  Pcre2(const Pcre2&) = delete;
  Pcre2& operator=(const Pcre2&) = delete;

  const std::string& error() const { return error_; }
  // Whether the whole of `text` (valid UTF-8) matches.
  bool full_match(std::string_view text) const {
    const int rc = pcre2_match(code_, reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(), 0,
                               PCRE2_ANCHORED | PCRE2_ENDANCHORED, data_, nullptr);
    EXPECT_TRUE(rc >= 0 || rc == PCRE2_ERROR_NOMATCH) << "pcre2_match: " << rc;
    return rc >= 0;
  }

 private:
  pcre2_code* code_ = nullptr;
  pcre2_match_data* data_ = nullptr;
  std::string error_;
};

bool valid_utf8(std::string_view s) {
  for (std::size_t i = 0; i < s.size();) {
    const auto b = static_cast<std::uint8_t>(s[i]);
    const std::size_t n = b < 0x80                 ? 1
                          : b >= 0xC2 && b <= 0xDF ? 2
                          : b >= 0xE0 && b <= 0xEF ? 3
                          : b >= 0xF0 && b <= 0xF4 ? 4
                                                   : 0;
    if (n == 0 || i + n > s.size()) return false;
    for (std::size_t k = 1; k < n; ++k) {
      if ((static_cast<std::uint8_t>(s[i + k]) & 0xC0) != 0x80) return false;
    }
    const auto b1 = static_cast<std::uint8_t>(n > 1 ? s[i + 1] : 0);
    if ((b == 0xE0 && b1 < 0xA0) || (b == 0xED && b1 >= 0xA0) || (b == 0xF0 && b1 < 0x90) ||
        (b == 0xF4 && b1 >= 0x90)) {
      return false;
    }
    i += n;
  }
  return true;
}

// The code points of a valid UTF-8 string, each as its bytes.
std::vector<std::string> split_utf8(std::string_view s) {
  std::vector<std::string> out;
  for (std::size_t i = 0; i < s.size();) {
    const auto b = static_cast<std::uint8_t>(s[i]);
    const std::size_t n = b < 0x80 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4;
    out.emplace_back(s.substr(i, n));
    i += n;
  }
  return out;
}

std::string join(const std::vector<std::string>& parts) {
  std::string out;
  for (const std::string& p : parts) out += p;
  return out;
}

// Patterns as JSON Schemas write them: dates, times, emails, phones, identifiers, versions,
// colours, addresses, Unicode classes, alternations, nested and lazy repetition.
const std::vector<std::string>& corpus() {
  static const std::vector<std::string> patterns = {
      R"(^\d{4}-\d{2}-\d{2}$)",
      R"(^(\d{4})-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])$)",
      R"(^([01]\d|2[0-3]):[0-5]\d(:[0-5]\d(\.\d{1,3})?)?$)",
      R"(^[a-zA-Z0-9._%+-]+@[a-zA-Z0-9.-]+\.[a-zA-Z]{2,}$)",
      R"(^[^@\s]+@[^@\s]+\.[^@\s]+$)",
      R"(^\+?[1-9]\d{1,14}$)",
      R"(^\(\d{3}\) \d{3}-\d{4}$)",
      R"(^[A-Za-z_$][A-Za-z0-9_$]*$)",
      R"(^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(?:-((?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(?:\.(?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*))?(?:\+([0-9a-zA-Z-]+(?:\.[0-9a-zA-Z-]+)*))?$)",
      R"(^#([0-9a-fA-F]{3}|[0-9a-fA-F]{6})$)",
      R"(^#?[0-9A-F]{6}([0-9A-F]{2})?$)",
      R"(^[0-9a-f]{8}-[0-9a-f]{4}-[1-5][0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$)",
      R"(^(?:[0-9]{1,3}\.){3}[0-9]{1,3}$)",
      R"(^((25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)\.){3}(25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)$)",
      R"(^https?:\/\/[^\s/$.?#].[^\s]*$)",
      R"(^[a-z0-9]+(?:-[a-z0-9]+)*$)",
      R"(^[A-Z]{2}\d{2}[A-Z0-9]{1,30}$)",
      R"(^\d{5}(-\d{4})?$)",
      R"(^[\u00C0-\u017F a-zA-Z'-]+$)",
      R"(^[\u4e00-\u9fff]+$)",
      R"(^[^\u0000-\u001F]*$)",
      R"(^(?<user>[a-z]+)@(?<host>[a-z]+\.(com|org|net))$)",
      R"(^(red|green|blue|)$)",
      R"(^(a|ab)(c|bcd)(d*)$)",
      R"(^((a|b)*c)+$)",
      R"(^(?:(?:a+)?b?)*c$)",
      R"(^.{3,8}$)",
      R"(^\s*\S+\s*$)",
      R"(^[\w.-]+$)",
      R"(^\D+\W?$)",
      R"(^€?\d+(?:[.,]\d{2})?$)",
      R"(^[😀-😏]{1,3}$)",
      R"(^\u{1F600}+x\uD83D\uDE01$)",
      R"(^[A-Z][a-z]*(?: [A-Z][a-z]*)*$)",
      R"(^(?:\+|-)?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?$)",
      R"(^\d{3}-\d{2}-\d{4}$)",
      R"(^(?:true|false|null)$)",
      R"(^[a-z]{2,3}(?:-[A-Z]{2})?$)",
      R"(^\/path\/\d+\/?$)",
      R"(^(\w+\.)*\w+$)",
      R"(^\t?[\x20-\x7E]*$)",
      R"(^x{0}y{2}z{1,}$)",
      R"(^(?:a{2}){1,3}b*?c+?$)",
      R"(^[\s\S]{0,5}$)",
      R"(^[^]{2}$)",
      R"(^(?:[\d]|[^\d\s])+\v?$)",
      R"(^[\[\]{}()]*$)",
      R"(^\x41\cJ?[\b-]$)",
  };
  return patterns;
}

// Code points every pattern's strings are also mutated with: the ends of the classes above,
// ECMAScript's and PCRE2's differences (\s, line terminators), and each UTF-8 length.
const std::vector<std::string>& probe_codepoints() {
  static const std::vector<std::string> probes = {"a",
                                                  "z",
                                                  "A",
                                                  "Z",
                                                  "0",
                                                  "9",
                                                  "_",
                                                  "-",
                                                  ".",
                                                  "@",
                                                  " ",
                                                  "\t",
                                                  "\n",
                                                  "\r",
                                                  "\v",
                                                  "\f",
                                                  std::string(1, '\0'),
                                                  "\b",
                                                  "#",
                                                  "+",
                                                  "/",
                                                  "[",
                                                  "{",
                                                  "é",
                                                  "ß",
                                                  "\u00a0",
                                                  "\u0085",
                                                  "\u1680",
                                                  "\u2028",
                                                  "\u2029",
                                                  "\ufeff",
                                                  "\u3000",
                                                  "\u200b",
                                                  "中",
                                                  "€",
                                                  "😀",
                                                  "😏",
                                                  "😐",
                                                  "\U0010FFFF"};
  return probes;
}

TEST(RegexSourceTest, AgreesWithPcre2OnPatternsJsonSchemasUse) {
  std::mt19937_64 rng(20240611);
  std::size_t compared = 0, matched = 0;
  for (const std::string& pattern : corpus()) {
    SCOPED_TRACE("pattern " + pattern);
    Result<Grammar> g = grammar_from_regex(pattern);
    ASSERT_TRUE(g.ok()) << g.status().to_string();
    const std::string translated = to_pcre2(pattern);
    const Pcre2 pcre(translated);
    ASSERT_TRUE(pcre.error().empty()) << translated << ": " << pcre.error();

    // The grammar's own strings: every one matches.
    std::vector<std::string> samples;
    for (int i = 0; i < 80; ++i) {
      const int depth = std::uniform_int_distribution<int>(2, 16)(rng);
      const std::optional<std::string> s = oracle_sample(*g, rng, depth, 200);
      if (!s) continue;
      EXPECT_TRUE(pcre.full_match(*s)) << "sampled from the grammar: " << *s;
      samples.push_back(*s);
    }
    ASSERT_FALSE(samples.empty());

    std::vector<std::string> alphabet = probe_codepoints();
    for (const std::string& s : samples) {
      for (std::string& cp : split_utf8(s)) alphabet.push_back(std::move(cp));
    }
    const auto pick = [&rng](std::size_t n) {
      return std::uniform_int_distribution<std::size_t>(0, n - 1)(rng);
    };
    const auto compare = [&](const std::string& s) {
      ++compared;
      const bool accepted = oracle_accepts(*g, s);
      if (!valid_utf8(s)) {
        EXPECT_FALSE(accepted) << "invalid UTF-8 accepted";
        return;
      }
      const bool expected = pcre.full_match(s);
      matched += expected;
      EXPECT_EQ(accepted, expected) << "text \"" << s << "\" (PCRE2: " << translated << ")";
    };
    for (const std::string& sample : samples) {
      compare(sample);
      for (int m = 0; m < 6; ++m) {
        std::vector<std::string> cps = split_utf8(sample);
        std::string bytes = sample;
        switch (pick(7)) {
          case 0:  // insert a code point
            cps.insert(cps.begin() + static_cast<std::ptrdiff_t>(pick(cps.size() + 1)),
                       alphabet[pick(alphabet.size())]);
            break;
          case 1:  // delete one
            if (!cps.empty())
              cps.erase(cps.begin() + static_cast<std::ptrdiff_t>(pick(cps.size())));
            break;
          case 2:  // replace one
            if (!cps.empty()) cps[pick(cps.size())] = alphabet[pick(alphabet.size())];
            break;
          case 3:  // repeat a piece
            if (!cps.empty()) {
              const std::size_t at = pick(cps.size());
              const std::size_t n = 1 + pick(std::min<std::size_t>(4, cps.size() - at));
              std::vector<std::string> piece(cps.begin() + static_cast<std::ptrdiff_t>(at),
                                             cps.begin() + static_cast<std::ptrdiff_t>(at + n));
              cps.insert(cps.begin() + static_cast<std::ptrdiff_t>(at), piece.begin(), piece.end());
            }
            break;
          case 4:  // two samples joined
            cps = split_utf8(sample + samples[pick(samples.size())]);
            break;
          case 5:  // a byte replaced: often not UTF-8 any more
            if (!bytes.empty()) {
              bytes[pick(bytes.size())] = static_cast<char>(pick(256));
              compare(bytes);
              continue;
            }
            break;
          default:  // cut short
            cps.resize(pick(cps.size() + 1));
        }
        compare(join(cps));
      }
    }
    // Short strings over the pattern's alphabet.
    for (int i = 0; i < 200; ++i) {
      std::string s;
      for (std::size_t n = pick(9); n > 0; --n) s += alphabet[pick(alphabet.size())];
      compare(s);
    }
  }
  // Enough of both answers for the comparison to mean something.
  EXPECT_GT(compared, 25000u);
  EXPECT_GT(matched, 8000u);
  EXPECT_GT(compared - matched, 12000u);
  std::printf("compared %zu strings, %zu matching\n", compared, matched);
}

}  // namespace regex_test
}  // namespace
}  // namespace kvvm::grammar
