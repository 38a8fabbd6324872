// The pre-tokenizer's pieces for each family's split pattern on strings where the patterns
// differ, the Split behaviours, ByteLevel's own options, and the NFC normalizer.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "kvvm/tokenizer/tokenizer.h"
#include "support/tokenizer_json.h"
#include "tokenizer/normalizer.h"
#include "tokenizer/pre_tokenizer.h"

namespace kvvm::tokenizer {
namespace {

using Pieces = std::vector<std::string>;

Pieces pieces(const nlohmann::json& pre_tokenizer, const std::string& text) {
  Result<std::unique_ptr<detail::PreTokenizer>> parsed =
      detail::parse_pre_tokenizer(pre_tokenizer, "pre_tokenizer");
  EXPECT_TRUE(parsed.ok()) << parsed.status().to_string();
  if (!parsed.ok()) return {};
  std::vector<detail::PreToken> tokens{{text, true}};
  (*parsed)->apply(tokens);
  Pieces out;
  for (const detail::PreToken& token : tokens) out.push_back(token.text);
  return out;
}

nlohmann::json split(const std::string& pattern, const std::string& behavior = "Isolated",
                     bool invert = false) {
  return {{"type", "Split"},
          {"pattern", {{"Regex", pattern}}},
          {"behavior", behavior},
          {"invert", invert}};
}

nlohmann::json byte_level(bool add_prefix_space, bool use_regex) {
  return {{"type", "ByteLevel"}, {"add_prefix_space", add_prefix_space}, {"use_regex", use_regex}};
}

Pieces spelled(const Pieces& raw) {
  Pieces out;
  for (const std::string& piece : raw) out.push_back(test::spell(piece));
  return out;
}

TEST(TokenizerSplit, Gpt2PatternThroughByteLevel) {
  const nlohmann::json gpt2 = byte_level(false, true);
  EXPECT_EQ(pieces(gpt2, "Hello world's  123 !!\n"),
            spelled({"Hello", " world", "'s", " ", " 123", " !!", "\n"}));
  // Case-sensitive contractions, and digits in one run.
  EXPECT_EQ(pieces(gpt2, "I'M 12345"), spelled({"I", "'", "M", " 12345"}));
}

TEST(TokenizerSplit, Llama3Pattern) {
  const nlohmann::json llama3 = split(test::kLlama3Pattern);
  EXPECT_EQ(pieces(llama3, "I'M 12345 don't"), (Pieces{"I", "'M", " ", "123", "45", " don", "'t"}));
  EXPECT_EQ(pieces(llama3, "a\n\n  b"), (Pieces{"a", "\n\n", " ", " b"}));
  EXPECT_EQ(pieces(llama3, "x:=y;\r\n\tz"), (Pieces{"x", ":=", "y", ";\r\n", "\tz"}));
  EXPECT_EQ(pieces(llama3, "héllo wörld 你好"), (Pieces{"héllo", " wörld", " 你好"}));
}

TEST(TokenizerSplit, Qwen2PatternSplitsDigitsOneByOne) {
  EXPECT_EQ(pieces(split(test::kQwen2Pattern), "ab 12345"),
            (Pieces{"ab", " ", "1", "2", "3", "4", "5"}));
}

TEST(TokenizerSplit, IllFormedBytesFallBetweenMatches) {
  EXPECT_EQ(pieces(split(test::kLlama3Pattern),
                   "ab\xFF\xFE"
                   "cd"),
            (Pieces{"ab", "\xFF\xFE", "cd"}));
}

TEST(TokenizerSplit, Behaviors) {
  const std::string text = "a-b--c";
  EXPECT_EQ(pieces(split("-", "Isolated"), text), (Pieces{"a", "-", "b", "-", "-", "c"}));
  EXPECT_EQ(pieces(split("-", "Removed"), text), (Pieces{"a", "b", "c"}));
  EXPECT_EQ(pieces(split("-", "MergedWithPrevious"), text), (Pieces{"a-", "b-", "-", "c"}));
  EXPECT_EQ(pieces(split("-", "MergedWithNext"), text), (Pieces{"a", "-b", "-", "-c"}));
  EXPECT_EQ(pieces(split("-", "Contiguous"), text), (Pieces{"a", "-", "b", "--", "c"}));
  EXPECT_EQ(pieces(split("-+", "Removed", true), text), (Pieces{"-", "--"}));
  const nlohmann::json literal = {
      {"type", "Split"}, {"pattern", {{"String", "."}}}, {"behavior", "Removed"}};
  EXPECT_EQ(pieces(literal, "a.b"), (Pieces{"a", "b"}));  // "." is a dot, not any character
}

TEST(TokenizerSplit, ByteLevelAddPrefixSpaceAndNoRegex) {
  EXPECT_EQ(pieces(byte_level(true, false), "hi there"), spelled({" hi there"}));
  EXPECT_EQ(pieces(byte_level(true, true), "hi there"), spelled({" hi", " there"}));
  EXPECT_EQ(pieces(byte_level(false, false), "hi there"), spelled({"hi there"}));
  const nlohmann::json sequence = {
      {"type", "Sequence"}, {"pretokenizers", {split("-", "Removed"), byte_level(false, false)}}};
  EXPECT_EQ(pieces(sequence, "a b-c"), spelled({"a b", "c"}));
}

std::string normalize(const nlohmann::json& normalizer, const std::string& text) {
  Result<std::unique_ptr<detail::Normalizer>> parsed =
      detail::parse_normalizer(normalizer, "normalizer");
  EXPECT_TRUE(parsed.ok()) << parsed.status().to_string();
  return parsed.ok() && *parsed ? (*parsed)->normalize(text) : text;
}

TEST(TokenizerSplit, NfcComposesAndKeepsIllFormedBytes) {
  const nlohmann::json nfc = {{"type", "NFC"}};
  EXPECT_EQ(normalize(nfc, "e\u0301"), "\u00E9");
  EXPECT_EQ(normalize(nfc, "Å"), "\u00C5");       // A + ring above
  EXPECT_EQ(normalize(nfc, "\uFB01"), "\uFB01");  // a ligature is NFKC's business
  EXPECT_EQ(normalize(nfc,
                      "e\u0301\xFF"
                      "e\u0301"),
            "\u00E9\xFF\u00E9");
  const nlohmann::json sequence = {{"type", "Sequence"}, {"normalizers", {{{"type", "NFKC"}}}}};
  EXPECT_EQ(normalize(sequence, "\uFB01"), "fi");
}

TEST(TokenizerSplit, NfcAppliesBeforeEncoding) {
  test::TokenizerSpec spec;
  spec.normalizer = {{"type", "NFC"}};
  spec.tokens = {"\u00E9"};
  spec.merges = {{"\xC3", "\xA9"}};
  Result<std::unique_ptr<Tokenizer>> tokenizer =
      Tokenizer::parse(test::tokenizer_json(spec).dump(), "nfc.json");
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status().to_string();
  EXPECT_EQ((*tokenizer)->encode("e\u0301"), (std::vector<TokenId>{256}));
  EXPECT_EQ((*tokenizer)->encode("\u00E9"), (std::vector<TokenId>{256}));
}

}  // namespace
}  // namespace kvvm::tokenizer
