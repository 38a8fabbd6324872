// Parity with Hugging Face's `tokenizers` for the families beyond Llama-3 / Qwen2 on the
// committed fixtures (tests/data/tokenizers/*, made by scripts/make_tokenizer_fixtures.py):
// Digits and Punctuation (DeepSeek, StarCoder, Falcon and each Punctuation behaviour),
// Metaspace with byte fallback (Mistral's "first", "always", "never", Llama-2's legacy
// Prepend + Replace), Whitespace and WhitespaceSplit with an unk token. The same ids with and
// without special tokens, the same decoded text (with and without special tokens), and
// streaming equal to decoding. A missing fixture fails, naming the script that makes it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "base/json_reader.h"
#include "kvvm/tokenizer/tokenizer.h"
#include "support/test_data.h"

namespace kvvm::tokenizer::families_test {
namespace {

namespace fs = std::filesystem;

constexpr const char* kHowToMake =
    "run `python3 scripts/make_tokenizer_fixtures.py` on the GPU machine (the tokenizers and "
    "transformers packages) and commit tests/data/tokenizers/";

// Listed rather than found, so that a fixture that is missing fails instead of vanishing.
const std::vector<std::string>& families() {
  static const std::vector<std::string> names = {
      "deepseek-digits-punct",
      "starcoder-digits",
      "falcon-punct-digits",
      "punct-removed",
      "punct-isolated",
      "punct-merged-with-previous",
      "punct-merged-with-next",
      "punct-contiguous",
      "metaspace-first",
      "metaspace-always",
      "metaspace-never",
      "llama2-legacy",
      "whitespace",
      "whitespace-split",
  };
  return names;
}

std::vector<TokenId> ids_of(const nlohmann::json& list) {
  std::vector<TokenId> ids;
  for (const auto& id : list) ids.push_back(id.get<TokenId>());
  return ids;
}

// Printable in a failure message: each byte outside ASCII's printable range as \xNN.
std::string shown(const std::string& text) {
  std::string out;
  for (const char c : text) {
    const auto byte = static_cast<unsigned char>(c);
    if (byte >= 0x20 && byte < 0x7F) {
      out += c;
    } else {
      char escape[8];
      std::snprintf(escape, sizeof escape, "\\x%02X", byte);
      out += escape;
    }
  }
  return out;
}

class TokenizerFamilies : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    const fs::path dir = test::data_dir() / "tokenizers" / GetParam();
    ASSERT_TRUE(fs::exists(dir / "expected.json"))
        << "no fixture at " << dir.string() << ": " << kHowToMake;
    Result<nlohmann::json> expected = read_json_file((dir / "expected.json").string());
    ASSERT_TRUE(expected.ok()) << expected.status().to_string();
    expected_ = std::move(*expected);
    ASSERT_GE(expected_["texts"].size(), 30u);
    Result<std::unique_ptr<Tokenizer>> tokenizer =
        Tokenizer::load((dir / "tokenizer.json").string());
    ASSERT_TRUE(tokenizer.ok()) << tokenizer.status().to_string();
    tokenizer_ = std::move(*tokenizer);
  }

  std::string stream(const std::vector<TokenId>& ids, bool skip_special) const {
    StreamDecoder decoder(*tokenizer_, skip_special);
    std::string out;
    for (const TokenId id : ids) out += decoder.push(id);
    return out + decoder.finish();
  }

  nlohmann::json expected_;
  std::unique_ptr<Tokenizer> tokenizer_;
};

TEST_P(TokenizerFamilies, IdsEqualHuggingFaces) {
  for (const auto& entry : expected_["texts"]) {
    const std::string text = entry["text"].get<std::string>();
    SCOPED_TRACE("text: '" + shown(text) + "'");
    EXPECT_EQ(tokenizer_->encode(text, false), ids_of(entry["ids"]));
    EXPECT_EQ(tokenizer_->encode(text, true), ids_of(entry["ids_with_special"]));
  }
}

TEST_P(TokenizerFamilies, DecodingEqualsHuggingFacesAndStreamingEqualsDecoding) {
  for (const auto& entry : expected_["texts"]) {
    const std::string text = entry["text"].get<std::string>();
    SCOPED_TRACE("text: '" + shown(text) + "'");
    const std::vector<TokenId> ids = ids_of(entry["ids_with_special"]);
    const std::string decoded = tokenizer_->decode(ids);
    EXPECT_EQ(shown(decoded), shown(entry["decoded"].get<std::string>()));
    const std::string skipped = tokenizer_->decode(ids, true);
    EXPECT_EQ(shown(skipped), shown(entry["decoded_skip_special"].get<std::string>()));
    EXPECT_EQ(shown(stream(ids, false)), shown(decoded));
    EXPECT_EQ(shown(stream(ids, true)), shown(skipped));
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, TokenizerFamilies, ::testing::ValuesIn(families()),
                         [](const ::testing::TestParamInfo<std::string>& param) {
                           std::string name = param.param;
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });

// Every family directory the script writes is one the tests above read.
TEST(TokenizerFamiliesList, EveryFixtureDirectoryIsTested) {
  const fs::path root = test::data_dir() / "tokenizers";
  ASSERT_TRUE(fs::is_directory(root)) << "no " << root.string() << ": " << kHowToMake;
  const std::set<std::string> listed(families().begin(), families().end());
  std::error_code error;
  for (fs::directory_iterator it(root, error), end; !error && it != end; it.increment(error)) {
    const std::string name = it->path().filename().string();
    if (name.starts_with("config-")) continue;  // tokenizer_config_flags_test.cc's
    EXPECT_TRUE(listed.contains(name)) << name << " is in " << root.string() << " but not tested";
  }
}

}  // namespace
}  // namespace kvvm::tokenizer::families_test
