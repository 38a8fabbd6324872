// The character-class pre-tokenizers' pieces against what Hugging Face's own tests and
// definitions give: Digits (runs or single digits, any Unicode number), Punctuation (each of
// the five behaviours; ASCII punctuation and Unicode P*), Whitespace (\w+|[^\w\s]+ with the
// regex crate's Unicode classes), WhitespaceSplit, Metaspace (prepend schemes, split), and the
// refusals of values they do not take, each naming the field.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "kvvm/tokenizer/tokenizer.h"
#include "tokenizer/pre_tokenizer.h"

namespace kvvm::tokenizer::pre_tokenizers_test {
namespace {

using Pieces = std::vector<std::string>;

// The pieces of `text`; `at_start`: the text begins the input (Metaspace's "first").
Pieces pieces(const nlohmann::json& pre_tokenizer, const std::string& text, bool at_start = true) {
  Result<std::unique_ptr<detail::PreTokenizer>> parsed =
      detail::parse_pre_tokenizer(pre_tokenizer, "pre_tokenizer");
  EXPECT_TRUE(parsed.ok()) << parsed.status().to_string();
  if (!parsed.ok()) return {};
  std::vector<detail::PreToken> tokens{{text, at_start}};
  (*parsed)->apply(tokens);
  Pieces out;
  for (const detail::PreToken& token : tokens) out.push_back(token.text);
  return out;
}

std::string refusal(const nlohmann::json& pre_tokenizer) {
  Result<std::unique_ptr<detail::PreTokenizer>> parsed =
      detail::parse_pre_tokenizer(pre_tokenizer, "pre_tokenizer");
  EXPECT_FALSE(parsed.ok());
  return parsed.ok() ? "" : parsed.status().message();
}

nlohmann::json digits(bool individual) {
  return {{"type", "Digits"}, {"individual_digits", individual}};
}
nlohmann::json punctuation(const std::string& behavior) {
  return {{"type", "Punctuation"}, {"behavior", behavior}};
}
nlohmann::json metaspace(const std::string& scheme, bool split) {
  return {{"type", "Metaspace"},
          {"replacement", "\u2581"},
          {"prepend_scheme", scheme},
          {"split", split}};
}

TEST(TokenizerPreTokenizers, DigitsInRunsOrOneByOne) {
  // Hugging Face's digits.rs tests.
  EXPECT_EQ(pieces(digits(false), "Hey 123 friend!"), (Pieces{"Hey ", "123", " friend!"}));
  EXPECT_EQ(pieces(digits(true), "Hey 123 friend!"), (Pieces{"Hey ", "1", "2", "3", " friend!"}));
  // char::is_numeric: Nd (Arabic-Indic), No (vulgar fraction, superscript), Nl (Roman twelve).
  EXPECT_EQ(pieces(digits(false), "x\u0663\u0664y\u00bd\u00b2z\u216b"),
            (Pieces{"x", "\u0663\u0664", "y", "\u00bd\u00b2", "z", "\u216b"}));
  EXPECT_EQ(pieces(digits(true), "3.14"), (Pieces{"3", ".", "1", "4"}));
  const nlohmann::json absent = {{"type", "Digits"}};  // individual_digits defaults to false
  EXPECT_EQ(pieces(absent, "a12"), (Pieces{"a", "12"}));
}

TEST(TokenizerPreTokenizers, PunctuationEveryBehavior) {
  // Hugging Face's punctuation.rs test (Isolated, the default).
  const std::string text = "Hey friend!     How are you?!?";
  EXPECT_EQ(pieces({{"type", "Punctuation"}}, text),
            (Pieces{"Hey friend", "!", "     How are you", "?", "!", "?"}));
  EXPECT_EQ(pieces(punctuation("Isolated"), text),
            (Pieces{"Hey friend", "!", "     How are you", "?", "!", "?"}));
  EXPECT_EQ(pieces(punctuation("Removed"), text), (Pieces{"Hey friend", "     How are you"}));
  EXPECT_EQ(pieces(punctuation("MergedWithPrevious"), text),
            (Pieces{"Hey friend!", "     How are you?", "!", "?"}));
  EXPECT_EQ(pieces(punctuation("MergedWithNext"), text),
            (Pieces{"Hey friend", "!     How are you", "?", "!", "?"}));
  EXPECT_EQ(pieces(punctuation("Contiguous"), text),
            (Pieces{"Hey friend", "!", "     How are you", "?!?"}));
  // ASCII's punctuation includes the symbols $ + < = > ^ ` | ~; Unicode's P* the rest.
  EXPECT_EQ(pieces(punctuation("Contiguous"), "a$+<=>^`|~b"), (Pieces{"a", "$+<=>^`|~", "b"}));
  EXPECT_EQ(pieces(punctuation("Isolated"), "\u00bfQu\u00e9?\u00ab\u00bb\u2014"),
            (Pieces{"\u00bf", "Qu\u00e9", "?", "\u00ab", "\u00bb", "\u2014"}));
  // Symbols outside ASCII are not punctuation: the euro sign (Sc), an emoji (So).
  EXPECT_EQ(pieces(punctuation("Isolated"), "5\u20ac \U0001f600!"),
            (Pieces{"5\u20ac \U0001f600", "!"}));
}

TEST(TokenizerPreTokenizers, WhitespaceSplitsWordsFromOtherCharacters) {
  // Hugging Face's whitespace.rs tests.
  const nlohmann::json whitespace = {{"type", "Whitespace"}};
  EXPECT_EQ(pieces(whitespace, "Hey man!"), (Pieces{"Hey", "man", "!"}));
  EXPECT_EQ(pieces(whitespace, "How are you doing?"), (Pieces{"How", "are", "you", "doing", "?"}));
  EXPECT_EQ(pieces(whitespace, "\n"), Pieces{});
  // The regex crate's Unicode \w: letters with their marks, digits, '_', the joiners, the
  // circled letters (Other_Alphabetic); \s: every White_Space character.
  EXPECT_EQ(pieces(whitespace, "cafe\u0301_1\u00a0x\u3000\u24b6\u24b7!?"),
            (Pieces{"cafe\u0301_1", "x", "\u24b6\u24b7", "!?"}));
  EXPECT_EQ(pieces(whitespace, "\U0001f468\u200d\U0001f469"),
            (Pieces{"\U0001f468", "\u200d", "\U0001f469"}));
  EXPECT_EQ(pieces(whitespace, "x=100;"), (Pieces{"x", "=", "100", ";"}));
  EXPECT_EQ(pieces(whitespace, "\u00bd\u00b2"), (Pieces{"\u00bd\u00b2"}));  // No is not \w
}

TEST(TokenizerPreTokenizers, WhitespaceSplitDropsEveryWhiteSpaceCharacter) {
  const nlohmann::json split = {{"type", "WhitespaceSplit"}};
  EXPECT_EQ(pieces(split, "Hey man!"), (Pieces{"Hey", "man!"}));
  EXPECT_EQ(pieces(split, "Hey, man, Good?"), (Pieces{"Hey,", "man,", "Good?"}));
  EXPECT_EQ(pieces(split, " a\u00a0b\u3000c\td\n\u2003e\u0085f "),
            (Pieces{"a", "b", "c", "d", "e", "f"}));
  EXPECT_EQ(pieces(split, "a\u200bb"), (Pieces{"a\u200bb"}));  // a zero-width space is not
}

TEST(TokenizerPreTokenizers, MetaspaceSchemesAndSplit) {
  // Hugging Face's metaspace.rs tests.
  EXPECT_EQ(pieces(metaspace("always", true), "Hey friend!"),
            (Pieces{"\u2581Hey", "\u2581friend!"}));
  EXPECT_EQ(pieces(metaspace("always", true), "Hey   friend!"),
            (Pieces{"\u2581Hey", "\u2581", "\u2581", "\u2581friend!"}));
  EXPECT_EQ(pieces(metaspace("always", false), "Hey friend!"), (Pieces{"\u2581Hey\u2581friend!"}));
  // A leading space is the replacement already: nothing is prepended.
  EXPECT_EQ(pieces(metaspace("always", false), " Hey"), (Pieces{"\u2581Hey"}));
  EXPECT_EQ(pieces(metaspace("never", true), "Hey friend"), (Pieces{"Hey", "\u2581friend"}));
  // first: only where the input begins.
  EXPECT_EQ(pieces(metaspace("first", false), "how are", true), (Pieces{"\u2581how\u2581are"}));
  EXPECT_EQ(pieces(metaspace("first", false), "how are", false), (Pieces{"how\u2581are"}));
  EXPECT_EQ(pieces(metaspace("always", false), "how", false), (Pieces{"\u2581how"}));
  // Only U+0020 is replaced; another replacement character splits the same way.
  EXPECT_EQ(pieces(metaspace("never", true), "a\tb\u00a0c d"), (Pieces{"a\tb\u00a0c", "\u2581d"}));
  const nlohmann::json underscore = {{"type", "Metaspace"}, {"replacement", "_"}};
  EXPECT_EQ(pieces(underscore, "a b"), (Pieces{"_a", "_b"}));  // always and split by default
  // The legacy add_prefix_space: true is the default's meaning.
  const nlohmann::json legacy = {
      {"type", "Metaspace"}, {"replacement", "_"}, {"add_prefix_space", true}, {"str_rep", "_"}};
  EXPECT_EQ(pieces(legacy, "a b"), (Pieces{"_a", "_b"}));
}

TEST(TokenizerPreTokenizers, MetaspaceFirstInASequenceAndAfterRemovedText) {
  // The first piece keeps the input's start; one that a Removed split moved off it does not.
  const nlohmann::json sequence = {
      {"type", "Sequence"},
      {"pretokenizers", {{{"type", "WhitespaceSplit"}}, metaspace("first", true)}}};
  EXPECT_EQ(pieces(sequence, "a b"), (Pieces{"\u2581a", "b"}));
  EXPECT_EQ(pieces(sequence, "  a b"), (Pieces{"a", "b"}));
  const nlohmann::json digits_first = {
      {"type", "Sequence"}, {"pretokenizers", {digits(true), metaspace("always", true)}}};
  EXPECT_EQ(pieces(digits_first, "a12"), (Pieces{"\u2581a", "\u25811", "\u25812"}));
}

TEST(TokenizerPreTokenizers, RefusalsNameTheField) {
  EXPECT_NE(
      refusal({{"type", "Metaspace"}, {"replacement", "ab"}}).find("pre_tokenizer.replacement"),
      std::string::npos);
  EXPECT_NE(refusal({{"type", "Metaspace"}}).find("pre_tokenizer.replacement: missing"),
            std::string::npos);
  const std::string scheme = refusal(metaspace("sometimes", true));
  EXPECT_NE(scheme.find("pre_tokenizer.prepend_scheme"), std::string::npos) << scheme;
  EXPECT_NE(scheme.find("'sometimes'"), std::string::npos) << scheme;
  // As Hugging Face: add_prefix_space false goes only with never (absent meaning always).
  const std::string legacy =
      refusal({{"type", "Metaspace"}, {"replacement", "_"}, {"add_prefix_space", false}});
  EXPECT_NE(legacy.find("pre_tokenizer.add_prefix_space"), std::string::npos) << legacy;
  EXPECT_TRUE(detail::parse_pre_tokenizer({{"type", "Metaspace"},
                                           {"replacement", "_"},
                                           {"add_prefix_space", false},
                                           {"prepend_scheme", "never"}},
                                          "pre_tokenizer")
                  .ok());
  EXPECT_NE(refusal(punctuation("Sideways")).find("pre_tokenizer.behavior"), std::string::npos);
  EXPECT_NE(refusal({{"type", "Digits"}, {"individual_digits", "yes"}})
                .find("pre_tokenizer.individual_digits"),
            std::string::npos);
  EXPECT_NE(refusal({{"type", "UnicodeScripts"}}).find("'UnicodeScripts' is not implemented"),
            std::string::npos);
}

}  // namespace
}  // namespace kvvm::tokenizer::pre_tokenizers_test
