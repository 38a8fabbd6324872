// Parity with Hugging Face tokenizers on the committed fixtures (tests/data/models/*/, made by
// scripts/make_fixtures.py with transformers): the same ids with and without special tokens,
// decode and streaming giving the text back, and the chat templates rendering and encoding as
// apply_chat_template did.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "base/json_reader.h"
#include "kvvm/tokenizer/chat_template.h"
#include "kvvm/tokenizer/tokenizer.h"
#include "support/test_data.h"
#include "tokenizer/normalizer.h"

namespace kvvm::tokenizer {
namespace {

namespace fs = std::filesystem;

// Every fixture directory holding expected.json; the names the fixture script makes when none
// is there yet (their tests then skip, saying so).
std::vector<std::string> fixture_names() {
  std::vector<std::string> names;
  std::error_code error;
  const fs::path models = test::data_dir() / "models";
  for (fs::directory_iterator it(models, error), end; !error && it != end; it.increment(error)) {
    if (fs::exists(it->path() / "expected.json")) names.push_back(it->path().filename().string());
  }
  std::sort(names.begin(), names.end());
  if (names.empty()) {
    names = {"llama-tiny",      "llama-tiny-bf16", "qwen2-tiny",
             "qwen2-tiny-bf16", "qwen3-tiny",      "qwen3-tiny-bf16"};
  }
  return names;
}

std::vector<TokenId> ids_of(const nlohmann::json& list) {
  std::vector<TokenId> ids;
  for (const auto& id : list) ids.push_back(id.get<TokenId>());
  return ids;
}

class TokenizerParity : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    dir_ = test::model_fixture_dir(GetParam());
    ASSERT_TRUE(fs::exists(fs::path(dir_) / "expected.json"))
        << "no fixture at " << dir_ << " (scripts/make_fixtures.py makes it)";
    Result<nlohmann::json> expected = read_json_file(dir_ + "/expected.json");
    ASSERT_TRUE(expected.ok()) << expected.status().to_string();
    expected_ = std::move(*expected);
    Result<std::unique_ptr<Tokenizer>> tokenizer = Tokenizer::load(dir_ + "/tokenizer.json");
    ASSERT_TRUE(tokenizer.ok()) << tokenizer.status().to_string();
    tokenizer_ = std::move(*tokenizer);
    // Decoding gives the text as normalised (Qwen2's NFC composes "e\u0301" to "\u00e9").
    Result<nlohmann::json> file = read_json_file(dir_ + "/tokenizer.json");
    ASSERT_TRUE(file.ok()) << file.status().to_string();
    Result<std::unique_ptr<detail::Normalizer>> normalizer =
        detail::parse_normalizer(file->value("normalizer", nlohmann::json()), "normalizer");
    ASSERT_TRUE(normalizer.ok()) << normalizer.status().to_string();
    normalizer_ = std::move(*normalizer);
  }

  std::string normalized(const std::string& text) const {
    return normalizer_ ? normalizer_->normalize(text) : text;
  }

  std::string stream(const std::vector<TokenId>& ids) const {
    StreamDecoder decoder(*tokenizer_);
    std::string out;
    for (const TokenId id : ids) out += decoder.push(id);
    return out + decoder.finish();
  }

  std::string dir_;
  nlohmann::json expected_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::unique_ptr<detail::Normalizer> normalizer_;
};

TEST_P(TokenizerParity, TextsEncodeDecodeAndStream) {
  ASSERT_TRUE(expected_.contains("texts"));
  ASSERT_FALSE(expected_["texts"].empty());
  for (const auto& entry : expected_["texts"]) {
    const std::string text = entry["text"].get<std::string>();
    SCOPED_TRACE("text: '" + text + "'");
    const std::vector<TokenId> ids = tokenizer_->encode(text);
    EXPECT_EQ(ids, ids_of(entry["ids"]));
    EXPECT_EQ(tokenizer_->encode(text, true), ids_of(entry["ids_with_special"]));
    EXPECT_EQ(tokenizer_->decode(ids), normalized(text));
    EXPECT_EQ(stream(ids), tokenizer_->decode(ids));
    for (const TokenId id : ids) EXPECT_LT(static_cast<std::size_t>(id), tokenizer_->vocab_size());
  }
}

TEST_P(TokenizerParity, ChatRendersAndEncodesAsApplyChatTemplate) {
  ASSERT_TRUE(expected_.contains("chat"));
  ASSERT_FALSE(expected_["chat"].empty());
  Result<ChatTemplate> kind = detect_chat_template(dir_);
  ASSERT_TRUE(kind.ok()) << kind.status().to_string();
  const ChatTemplate want = GetParam().starts_with("qwen3")   ? ChatTemplate::kQwen3
                            : GetParam().starts_with("qwen2") ? ChatTemplate::kChatML
                                                              : ChatTemplate::kLlama3;
  EXPECT_EQ(*kind, want);
  for (const auto& entry : expected_["chat"]) {
    std::vector<ChatMessage> messages;
    for (const auto& message : entry["messages"]) {
      messages.push_back(
          {message["role"].get<std::string>(), message["content"].get<std::string>()});
    }
    const std::string text = entry["text"].get<std::string>();
    SCOPED_TRACE("chat: '" + text + "'");
    // The template's switches where the entry sets them (Qwen3's enable_thinking).
    const ChatRenderOptions options{
        .add_generation_prompt = entry.value("add_generation_prompt", true),
        .enable_thinking = entry.value("enable_thinking", true)};
    Result<std::string> rendered = render_chat(*kind, messages, options);
    ASSERT_TRUE(rendered.ok()) << rendered.status().to_string();
    EXPECT_EQ(*rendered, text);
    // apply_chat_template tokenizes without adding special tokens: those in the text parse.
    const std::vector<TokenId> ids = tokenizer_->encode(text);
    EXPECT_EQ(ids, ids_of(entry["ids"]));
    EXPECT_EQ(tokenizer_->decode(ids), normalized(text));
    EXPECT_EQ(stream(ids), normalized(text));
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, TokenizerParity, ::testing::ValuesIn(fixture_names()),
                         [](const ::testing::TestParamInfo<std::string>& param) {
                           std::string name = param.param;
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });

}  // namespace
}  // namespace kvvm::tokenizer
