// A grammar's vocabulary read from a tokenizer: each token's bytes as it adds them mid-text
// (Metaspace's "▁" a space, <0xNN> its byte, byte-level characters their bytes), special tokens
// never text, end tokens apart, and the sorted order with shared prefixes a trie walk needs.
#include "kvvm/grammar/vocabulary.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "kvvm/tokenizer/tokenizer.h"
#include "support/test_data.h"

namespace kvvm::grammar {
namespace {

std::unique_ptr<tokenizer::Tokenizer> load(const std::string& path) {
  auto t = tokenizer::Tokenizer::load(path);
  EXPECT_TRUE(t.ok()) << t.status().to_string();
  return t.ok() ? std::move(t).value() : nullptr;
}

TEST(VocabularyTest, MetaspaceTokensAddSpacesAndByteTokensTheirByte) {
  const auto tok = load((test::data_dir() / "tokenizers/metaspace-first/tokenizer.json").string());
  ASSERT_NE(tok, nullptr);
  const std::vector<TokenId> ends{*tok->token_id("</s>")};
  auto v = Vocabulary::from_tokenizer(*tok, ends);
  ASSERT_TRUE(v.ok()) << v.status().to_string();
  const Vocabulary& vocab = **v;
  EXPECT_EQ(vocab.size(), tok->vocab_size());
  EXPECT_EQ(vocab.bytes(*tok->token_id("▁s")), " s");
  EXPECT_EQ(vocab.bytes(*tok->token_id("▁")), " ");
  EXPECT_EQ(vocab.bytes(*tok->token_id("<0x0A>")), "\n");
  EXPECT_EQ(vocab.bytes(*tok->token_id("<0x22>")), "\"");
  EXPECT_TRUE(vocab.is_text(*tok->token_id("▁s")));
  EXPECT_FALSE(vocab.is_text(*tok->token_id("<s>")));   // special: never inside a grammar
  EXPECT_FALSE(vocab.is_text(*tok->token_id("</s>")));  // the end, apart
  EXPECT_TRUE(vocab.is_end(*tok->token_id("</s>")));
  EXPECT_FALSE(vocab.is_end(*tok->token_id("<s>")));
}

TEST(VocabularyTest, ByteLevelTokensAreTheirBytesAndTheOrderIsATrie) {
  const auto tok = load(test::model_fixture_dir("llama-tiny") + "/tokenizer.json");
  ASSERT_NE(tok, nullptr);
  auto v = Vocabulary::from_tokenizer(*tok, {});
  ASSERT_TRUE(v.ok());
  const Vocabulary& vocab = **v;
  EXPECT_EQ(vocab.bytes(*tok->token_id("Ġand")), " and");
  // Every text token once, sorted by bytes, each shared prefix the true one.
  std::size_t text = 0;
  for (TokenId t = 0; t < static_cast<TokenId>(vocab.size()); ++t) text += vocab.is_text(t);
  ASSERT_EQ(vocab.sorted().size(), text);
  for (std::size_t i = 1; i < vocab.sorted().size(); ++i) {
    const std::string_view a = vocab.bytes(vocab.sorted()[i - 1]);
    const std::string_view b = vocab.bytes(vocab.sorted()[i]);
    EXPECT_LE(a, b);
    std::size_t k = 0;
    while (k < a.size() && k < b.size() && a[k] == b[k]) ++k;
    EXPECT_EQ(vocab.shared_prefix()[i], k) << i;
  }
}

TEST(VocabularyTest, BadEndsAndSizesAreRefused) {
  auto outside = Vocabulary::from_bytes({"a", "b"}, {false, false}, std::vector<TokenId>{2});
  ASSERT_FALSE(outside.ok());
  EXPECT_NE(outside.status().message().find("end token 2 is outside the vocabulary [0, 2)"),
            std::string::npos)
      << outside.status().message();
  auto sizes = Vocabulary::from_bytes({"a", "b"}, {false}, {});
  ASSERT_FALSE(sizes.ok());
  EXPECT_NE(sizes.status().message().find("2 tokens but 1 special flags"), std::string::npos);
}

}  // namespace
}  // namespace kvvm::grammar
