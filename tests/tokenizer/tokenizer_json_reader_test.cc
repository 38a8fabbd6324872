// tokenizer.json's reader (src/tokenizer/tokenizer_json.cc: nlohmann's SAX parser), which streams
// the vocabulary and merges instead of building a DOM of them: it accepts what read_json accepts
// (escapes in tokens, merges in either form, the model's members in any order) and refuses
// what read_json refuses with the same kind of message (byte, line and column; a key given
// twice, in the vocabulary too; invalid UTF-8; nesting past the bound).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "kvvm/tokenizer/tokenizer.h"
#include "support/tokenizer_json.h"

namespace kvvm::tokenizer::json_reader_test {
namespace {

using Ids = std::vector<TokenId>;

std::string valid_text() {
  test::TokenizerSpec spec;
  spec.tokens = {"ab", "\"q"};
  spec.merges = {{"a", "b"}, {"\"", "q"}};
  return test::tokenizer_json(spec).dump();
}

std::string refusal(const std::string& text) {
  Result<std::unique_ptr<Tokenizer>> tokenizer = Tokenizer::parse(text, "bad.json");
  EXPECT_FALSE(tokenizer.ok());
  if (tokenizer.ok()) return "";
  EXPECT_EQ(tokenizer.status().code(), StatusCode::kInvalidArgument);
  return tokenizer.status().message();
}

TEST(TokenizerJsonReader, EscapedTokensAndMergesReadAsTheirText) {
  // "\"q" is escaped in the JSON text; \u escapes (a surrogate pair too) as nlohmann writes
  // them with ensure_ascii.
  auto tokenizer = Tokenizer::parse(valid_text(), "good.json");
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status().to_string();
  EXPECT_EQ((*tokenizer)->encode("ab\"q"), (Ids{256, 257}));
  test::TokenizerSpec spec;
  spec.tokens = {"\xC3\xA9"};  // é in byte-level characters: "Ã©"
  spec.merges = {{"\xC3", "\xA9"}};
  spec.pair_merges = true;
  const std::string ascii = test::tokenizer_json(spec).dump(-1, ' ', true);
  ASSERT_NE(ascii.find("\\u00c3"), std::string::npos);
  tokenizer = Tokenizer::parse(ascii, "ascii.json");
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status().to_string();
  EXPECT_EQ((*tokenizer)->encode("\u00e9"), (Ids{256}));
  EXPECT_EQ((*tokenizer)->token_id("\u00c3\u00a9"), 256);
  const std::string pair = R"({"model": {"vocab": {"\ud83d\ude00": 0}, "merges": []},
      "decoder": {"type": "ByteLevel"}})";
  tokenizer = Tokenizer::parse(pair, "pair.json");
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status().to_string();
  EXPECT_EQ((*tokenizer)->token_id("\U0001f600"), 0);
}

TEST(TokenizerJsonReader, MergesBeforeTheVocabularyAreResolvedAfterIt) {
  const std::string text = R"({"model": {"merges": ["a b", ["a", "c"]], "type": "BPE",
      "vocab": {"a": 0, "b": 1, "c": 2, "ab": 3, "ac": 4}}, "decoder": null})";
  auto tokenizer = Tokenizer::parse(text, "order.json");
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status().to_string();
  EXPECT_EQ((*tokenizer)->encode("abac"), (Ids{3, 4}));
  const std::string unknown = R"({"model": {"merges": ["a b", "a z"], "vocab": {"a": 0, "b": 1,
      "ab": 2}}})";
  const std::string message = refusal(unknown);
  EXPECT_NE(message.find("model.merges[1]"), std::string::npos) << message;
  EXPECT_NE(message.find("'z'"), std::string::npos) << message;
}

TEST(TokenizerJsonReader, AMalformedMergeIsNamedByItsIndexInEitherOrder) {
  for (const char* text :
       {R"({"model": {"vocab": {"a": 0, "b": 1, "ab": 2}, "merges": ["a b", ["a", 1]]}})",
        R"({"model": {"merges": ["a b", ["a", 1]], "vocab": {"a": 0, "b": 1, "ab": 2}}})"}) {
    const std::string message = refusal(text);
    EXPECT_NE(message.find("model.merges[1]: expected \"left right\" or [left, right]"),
              std::string::npos)
        << message;
  }
}

TEST(TokenizerJsonReader, KeysGivenTwiceAreRefusedWhereTheyAre) {
  std::string message = refusal(R"({"model": {"vocab": {"a": 0, "a": 1}, "merges": []}})");
  EXPECT_NE(message.find("duplicate key \"a\" at byte 29 (column 30)"), std::string::npos)
      << message;
  message = refusal(R"({"model": {"vocab": {"a": 0, "a": 0}, "merges": []}})");
  EXPECT_NE(message.find("duplicate key \"a\""), std::string::npos) << message;
  message = refusal(R"({"model": {"vocab": {}, "vocab": {}, "merges": []}})");
  EXPECT_NE(message.find("duplicate key \"vocab\""), std::string::npos) << message;
  message = refusal(R"({"decoder": null, "decoder": null})");
  EXPECT_NE(message.find("duplicate key \"decoder\""), std::string::npos) << message;
}

TEST(TokenizerJsonReader, SyntaxErrorsNameTheByteLineAndColumn) {
  std::string message = refusal("{\n  \"model\": {\"vocab\": {\"a\": 0,}}\n}");
  EXPECT_NE(message.find("bad.json: not valid JSON at byte 31 (line 2, column 30)"),
            std::string::npos)
      << message;
  message = refusal("{\"model\": {\"vocab\": {\"a\xFF\": 0}}}");
  EXPECT_NE(message.find("invalid UTF-8 at byte 23"), std::string::npos) << message;
  EXPECT_NE(message.find("0xFF"), std::string::npos) << message;
  message = refusal("{\"model\": {\"vocab\": {\"a\": 0}, \"merges\": [\"a\tb\"]}}");
  EXPECT_NE(message.find("control character"), std::string::npos) << message;
  message = refusal(R"({"model": {"vocab": {"\ud800": 0}}})");
  EXPECT_NE(message.find("surrogate"), std::string::npos) << message;
  message = refusal(R"({"model": {"vocab": {"a": 01}}})");
  EXPECT_NE(message.find("unexpected number literal"), std::string::npos) << message;
  message = refusal(R"({"model": {"dropout": 1e999}})");
  EXPECT_NE(message.find("number overflow"), std::string::npos) << message;
  message = refusal("{} x");
  EXPECT_NE(message.find("expected end of input"), std::string::npos) << message;
  message = refusal("{\"model\": {\"vocab\": {\"a\": 0}");
  EXPECT_NE(message.find("the end of the input"), std::string::npos) << message;
  message = refusal("{\"a\": " + std::string(100, '[') + std::string(100, ']') + "}");
  EXPECT_NE(message.find("nested deeper than the limit of 64 levels"), std::string::npos)
      << message;
}

TEST(TokenizerJsonReader, VocabularyValuesThatAreNotIdsAreNamed) {
  std::string message = refusal(R"({"model": {"vocab": {"a\"b": "7"}, "merges": []}})");
  EXPECT_NE(message.find("model.vocab['a\"b']: expected an integer token id, found string '7'"),
            std::string::npos)
      << message;
  message = refusal(R"({"model": {"vocab": {"a": 18446744073709551615}, "merges": []}})");
  EXPECT_NE(message.find("out of range"), std::string::npos) << message;
}

}  // namespace
}  // namespace kvvm::tokenizer::json_reader_test
