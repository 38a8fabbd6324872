// StreamDecoder: what push() returns, joined with finish(), equals decode(); a character split
// over tokens is released whole, once its last byte arrives.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "kvvm/tokenizer/tokenizer.h"
#include "support/tokenizer_json.h"

namespace kvvm::tokenizer {
namespace {

std::unique_ptr<Tokenizer> make() {
  // Tokens that cut characters in the middle: the first two bytes of 日 alone, and the last
  // byte of 日 with the first of 本.
  test::TokenizerSpec spec;
  spec.tokens = {"\xE6\x97", "\xA5\xE6"};
  spec.merges = {{"\xE6", "\x97"}, {"\xA5", "\xE6"}};
  spec.added_tokens = {test::added_token(300, "<|eot|>")};
  Result<std::unique_ptr<Tokenizer>> tokenizer =
      Tokenizer::parse(test::tokenizer_json(spec).dump(), "stream.json");
  EXPECT_TRUE(tokenizer.ok()) << tokenizer.status().to_string();
  return tokenizer.ok() ? std::move(*tokenizer) : nullptr;
}

TEST(TokenizerStream, AnEmojiOverFourTokensComesOutWhole) {
  auto tokenizer = make();
  ASSERT_NE(tokenizer, nullptr);
  const std::vector<TokenId> ids = tokenizer->encode("😀");
  ASSERT_EQ(ids.size(), 4u);
  StreamDecoder stream(*tokenizer);
  EXPECT_EQ(stream.push(ids[0]), "");
  EXPECT_EQ(stream.push(ids[1]), "");
  EXPECT_EQ(stream.push(ids[2]), "");
  EXPECT_EQ(stream.push(ids[3]), "😀");
  EXPECT_EQ(stream.finish(), "");
}

TEST(TokenizerStream, TokensThatCutCharactersReleaseWholeOnes) {
  auto tokenizer = make();
  ASSERT_NE(tokenizer, nullptr);
  const std::vector<TokenId> ids = tokenizer->encode("日本");  // [E6 97] [A5 E6] [9C] [AC]
  ASSERT_EQ(ids.size(), 4u);
  StreamDecoder stream(*tokenizer);
  EXPECT_EQ(stream.push(ids[0]), "");
  EXPECT_EQ(stream.push(ids[1]), "日");
  EXPECT_EQ(stream.push(ids[2]), "");
  EXPECT_EQ(stream.push(ids[3]), "本");
}

TEST(TokenizerStream, EqualsDecodeOnMixedText) {
  auto tokenizer = make();
  ASSERT_NE(tokenizer, nullptr);
  const std::string text = "日本語 😀 é<|eot|>x\xE6\x97";  // ends in an unfinished 日
  const std::vector<TokenId> ids = tokenizer->encode(text);
  for (const bool skip : {false, true}) {
    StreamDecoder stream(*tokenizer, skip);
    std::string streamed;
    for (const TokenId id : ids) {
      const std::string piece = stream.push(id);
      // Every piece released is whole characters.
      for (std::size_t i = 0; i < piece.size();) {
        const auto lead = static_cast<unsigned char>(piece[i]);
        const std::size_t length = lead < 0x80 ? 1 : lead < 0xE0 ? 2 : lead < 0xF0 ? 3 : 4;
        ASSERT_LE(i + length, piece.size()) << "a piece ends inside a character";
        i += length;
      }
      streamed += piece;
    }
    EXPECT_EQ(stream.finish(), "\xE6\x97");
    streamed += "\xE6\x97";
    EXPECT_EQ(streamed, tokenizer->decode(ids, skip));
  }
}

TEST(TokenizerStream, IllFormedBytesAreNotHeldForever) {
  auto tokenizer = make();
  ASSERT_NE(tokenizer, nullptr);
  StreamDecoder stream(*tokenizer);
  EXPECT_EQ(stream.push(0xFF), "\xFF");  // can never start a character
  EXPECT_EQ(stream.push(0xE6), "");      // may
  EXPECT_EQ(stream.push('a'),
            "\xE6"
            "a");  // and did not
  EXPECT_EQ(stream.push(0xED), "");
  EXPECT_EQ(stream.push(0xA0), "\xED\xA0");  // a surrogate: ill-formed at its second byte

  std::mt19937 random(11);
  for (int round = 0; round < 100; ++round) {
    std::vector<TokenId> ids(random() % 32);
    for (TokenId& id : ids) id = static_cast<TokenId>(random() % 260);
    StreamDecoder fresh(*tokenizer);
    std::string streamed;
    for (const TokenId id : ids) streamed += fresh.push(id);
    streamed += fresh.finish();
    EXPECT_EQ(streamed, tokenizer->decode(ids)) << "round " << round;
  }
}

}  // namespace
}  // namespace kvvm::tokenizer
