// Added and special tokens: matched before the text is split (longest first), lstrip / rstrip /
// single_word honoured, skipped on decode when asked, and the post-processor's template.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "kvvm/tokenizer/tokenizer.h"
#include "support/tokenizer_json.h"

namespace kvvm::tokenizer {
namespace {

using Ids = std::vector<TokenId>;

using test::make_tokenizer;

Ids bytes(const std::string& text) {
  Ids out;
  for (const char c : text) out.push_back(static_cast<unsigned char>(c));
  return out;
}

Ids join(std::initializer_list<Ids> parts) {
  Ids out;
  for (const Ids& part : parts) out.insert(out.end(), part.begin(), part.end());
  return out;
}

TEST(TokenizerAdded, SpecialTokensAreMatchedBeforeSplitting) {
  // Split first, "<|eot|>" would be cut into "<|", "eot", "|>" by the pattern.
  test::TokenizerSpec spec;
  spec.added_tokens = {test::added_token(300, "<|eot|>"), test::added_token(301, "<|eot|>x")};
  auto tokenizer = make_tokenizer(spec);
  ASSERT_NE(tokenizer, nullptr);
  EXPECT_EQ(tokenizer->encode("hi<|eot|>there"), join({bytes("hi"), {300}, bytes("there")}));
  // Longest first: "<|eot|>x" wins over "<|eot|>".
  EXPECT_EQ(tokenizer->encode("<|eot|>xy<|eot|>"), join({{301}, bytes("y"), {300}}));
  EXPECT_EQ(tokenizer->encode("<|eot|"), bytes("<|eot|"));
  EXPECT_EQ(tokenizer->decode(tokenizer->encode("a<|eot|>b")), "a<|eot|>b");
  EXPECT_EQ(tokenizer->decode(tokenizer->encode("a<|eot|>b"), true), "ab");
}

TEST(TokenizerAdded, StripAndSingleWord) {
  test::TokenizerSpec spec;
  auto mask = test::added_token(300, "<mask>");
  mask["lstrip"] = true;
  auto end = test::added_token(301, "<end>");
  end["rstrip"] = true;
  auto hey = test::added_token(302, "hey", false);
  hey["single_word"] = true;
  spec.added_tokens = {mask, end, hey};
  auto tokenizer = make_tokenizer(spec);
  ASSERT_NE(tokenizer, nullptr);
  EXPECT_EQ(tokenizer->encode("a  <mask> b"), join({bytes("a"), {300}, bytes(" b")}));
  EXPECT_EQ(tokenizer->encode("a <end>  b"), join({bytes("a "), {301}, bytes("b")}));
  EXPECT_EQ(tokenizer->encode("hey there"), join({{302}, bytes(" there")}));
  EXPECT_EQ(tokenizer->encode("they"), bytes("they"));
  EXPECT_EQ(tokenizer->encode("heyo"), bytes("heyo"));
}

TEST(TokenizerAdded, NormalizedTokensMatchTheNormalizedText) {
  test::TokenizerSpec spec;
  spec.normalizer = {{"type", "NFC"}};
  spec.added_tokens = {test::added_token(300, "caf\u00E9", false)};
  auto tokenizer = make_tokenizer(spec);
  ASSERT_NE(tokenizer, nullptr);
  EXPECT_EQ(tokenizer->encode("cafe\u0301!"), join({{300}, bytes("!")}));
}

TEST(TokenizerAdded, TemplateProcessingAddsTheBosOnlyWhenAsked) {
  test::TokenizerSpec spec;
  spec.added_tokens = {test::added_token(300, "<|begin_of_text|>"),
                       test::added_token(301, "<|end|>")};
  const nlohmann::json specials = {
      {"<|begin_of_text|>",
       {{"id", "<|begin_of_text|>"}, {"ids", {300}}, {"tokens", {"<|begin_of_text|>"}}}},
      {"<|end|>", {{"id", "<|end|>"}, {"ids", {301}}, {"tokens", {"<|end|>"}}}}};
  const nlohmann::json single = {{{"SpecialToken", {{"id", "<|begin_of_text|>"}, {"type_id", 0}}}},
                                 {{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
                                 {{"SpecialToken", {{"id", "<|end|>"}, {"type_id", 0}}}}};
  spec.post_processor = {{"type", "Sequence"},
                         {"processors",
                          {{{"type", "ByteLevel"},
                            {"add_prefix_space", true},
                            {"trim_offsets", false},
                            {"use_regex", true}},
                           {{"type", "TemplateProcessing"},
                            {"single", single},
                            {"pair", nullptr},
                            {"special_tokens", specials}}}}};
  auto tokenizer = make_tokenizer(spec);
  ASSERT_NE(tokenizer, nullptr);
  EXPECT_EQ(tokenizer->encode("hi"), bytes("hi"));
  EXPECT_EQ(tokenizer->encode("hi", true), join({{300}, bytes("hi"), {301}}));
  EXPECT_EQ(tokenizer->encode("", true), (Ids{300, 301}));
}

TEST(TokenizerAdded, ByteLevelPostProcessorLeavesIdsAlone) {
  test::TokenizerSpec spec;
  spec.post_processor = {
      {"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}};
  auto tokenizer = make_tokenizer(spec);
  ASSERT_NE(tokenizer, nullptr);
  EXPECT_EQ(tokenizer->encode("hi", true), bytes("hi"));
}

}  // namespace
}  // namespace kvvm::tokenizer
