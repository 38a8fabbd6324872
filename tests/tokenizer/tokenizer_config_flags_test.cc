// tokenizer_config.json's add_bos_token / add_eos_token: against transformers' ids on the
// committed fixtures (tests/data/tokenizers/config-*, made by scripts/make_tokenizer_fixtures.py:
// each flag combination beside a tokenizer.json whose post-processor adds a BOS and beside one
// that adds nothing), and by hand: a flag the config leaves out, a token spelled as an object,
// and the refusals, each naming the file and the field.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "base/json_reader.h"
#include "kvvm/tokenizer/tokenizer.h"
#include "support/test_data.h"
#include "support/tokenizer_json.h"

namespace kvvm::tokenizer::config_flags_test {
namespace {

namespace fs = std::filesystem;

std::vector<std::string> config_fixtures() {
  std::vector<std::string> names;
  for (const char* template_kind : {"no-template", "bos-template"}) {
    for (const char* bos : {"true", "false"}) {
      for (const char* eos : {"true", "false"}) {
        names.push_back(std::string("config-") + template_kind + "-bos-" + bos + "-eos-" + eos);
      }
    }
  }
  return names;
}

std::vector<TokenId> ids_of(const nlohmann::json& list) {
  std::vector<TokenId> ids;
  for (const auto& id : list) ids.push_back(id.get<TokenId>());
  return ids;
}

class TokenizerConfigFlags : public ::testing::TestWithParam<std::string> {};

TEST_P(TokenizerConfigFlags, IdsEqualTransformersGivenTheFlags) {
  const fs::path dir = test::data_dir() / "tokenizers" / GetParam();
  ASSERT_TRUE(fs::exists(dir / "expected.json"))
      << "no fixture at " << dir.string()
      << ": run `python3 scripts/make_tokenizer_fixtures.py` on the GPU machine (the "
         "tokenizers and transformers packages) and commit tests/data/tokenizers/";
  Result<nlohmann::json> expected = read_json_file((dir / "expected.json").string());
  ASSERT_TRUE(expected.ok()) << expected.status().to_string();
  // Tokenizer::load reads the tokenizer_config.json beside the file.
  Result<std::unique_ptr<Tokenizer>> tokenizer = Tokenizer::load((dir / "tokenizer.json").string());
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status().to_string();
  ASSERT_FALSE((*expected)["texts"].empty());
  for (const auto& entry : (*expected)["texts"]) {
    const std::string text = entry["text"].get<std::string>();
    SCOPED_TRACE("text: '" + text + "'");
    EXPECT_EQ((*tokenizer)->encode(text, true), ids_of(entry["ids_with_special"]));
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, TokenizerConfigFlags, ::testing::ValuesIn(config_fixtures()),
                         [](const ::testing::TestParamInfo<std::string>& param) {
                           std::string name = param.param;
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });

// A byte-level tokenizer with <s> (300) and </s> (301); `bos_template`: its post-processor
// adds <s>.
nlohmann::json base(bool bos_template) {
  test::TokenizerSpec spec;
  spec.tokens = {"ab"};
  spec.merges = {{"a", "b"}};
  spec.added_tokens = {test::added_token(300, "<s>"), test::added_token(301, "</s>")};
  if (bos_template) {
    spec.post_processor = {{"type", "TemplateProcessing"},
                           {"single",
                            {{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}},
                             {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
                           {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", {300}}}}}}};
  }
  return test::tokenizer_json(spec);
}

std::unique_ptr<Tokenizer> with_config(bool bos_template, const nlohmann::json& config) {
  Result<std::unique_ptr<Tokenizer>> tokenizer =
      Tokenizer::parse(base(bos_template).dump(), "test.json", config.dump());
  EXPECT_TRUE(tokenizer.ok()) << tokenizer.status().to_string();
  return tokenizer.ok() ? std::move(*tokenizer) : nullptr;
}

using Ids = std::vector<TokenId>;

TEST(TokenizerConfigFlagsByHand, ASetFlagDecidesItsSideAndAnAbsentOneKeepsTheTemplates) {
  const nlohmann::json names = {{"bos_token", "<s>"}, {"eos_token", "</s>"}};
  nlohmann::json config = names;
  config["add_bos_token"] = true;
  // Asked in the config, absent from tokenizer.json: added; present in both: once.
  EXPECT_EQ(with_config(false, config)->encode("ab", true), (Ids{300, 256}));
  EXPECT_EQ(with_config(true, config)->encode("ab", true), (Ids{300, 256}));
  config["add_bos_token"] = false;  // false where the template adds it: gone
  EXPECT_EQ(with_config(true, config)->encode("ab", true), (Ids{256}));
  config = names;
  config["add_eos_token"] = true;  // no add_bos_token: the template's BOS stays
  EXPECT_EQ(with_config(true, config)->encode("ab", true), (Ids{300, 256, 301}));
  EXPECT_EQ(with_config(false, config)->encode("ab", true), (Ids{256, 301}));
  EXPECT_EQ(with_config(false, config)->encode("", true), (Ids{301}));
  EXPECT_EQ(with_config(false, config)->encode("ab", false), (Ids{256}));
  EXPECT_EQ(with_config(true, names)->encode("ab", true), (Ids{300, 256}));  // no flag at all
}

TEST(TokenizerConfigFlagsByHand, ATokenMayBeSpelledAsAnAddedTokenObject) {
  const nlohmann::json config = {
      {"add_bos_token", true},
      {"bos_token", {{"__type", "AddedToken"}, {"content", "</s>"}, {"special", true}}}};
  EXPECT_EQ(with_config(false, config)->encode("ab", true), (Ids{301, 256}));
}

std::string refusal(bool bos_template, const nlohmann::json& config) {
  Result<std::unique_ptr<Tokenizer>> tokenizer =
      Tokenizer::parse(base(bos_template).dump(), "test.json", config.dump());
  EXPECT_FALSE(tokenizer.ok());
  if (tokenizer.ok()) return "";
  EXPECT_EQ(tokenizer.status().code(), StatusCode::kInvalidArgument);
  return tokenizer.status().message();
}

TEST(TokenizerConfigFlagsByHand, RefusalsNameTheField) {
  EXPECT_NE(refusal(false, {{"add_bos_token", "yes"}, {"bos_token", "<s>"}})
                .find("tokenizer_config.json.add_bos_token: expected a boolean"),
            std::string::npos);
  EXPECT_NE(refusal(false, {{"add_eos_token", true}}).find("eos_token names no token"),
            std::string::npos);
  const std::string unknown = refusal(false, {{"add_bos_token", true}, {"bos_token", "<bos>"}});
  EXPECT_NE(unknown.find("tokenizer_config.json.bos_token"), std::string::npos) << unknown;
  EXPECT_NE(unknown.find("'<bos>' is neither in the vocab"), std::string::npos) << unknown;
  EXPECT_NE(refusal(false, {{"add_bos_token", true}, {"bos_token", 7}}).find("bos_token"),
            std::string::npos);
  EXPECT_NE(refusal(false, nlohmann::json::array()).find("expected an object"), std::string::npos);
  // Flags of no effect are not read: a malformed token beside no flag is no error.
  EXPECT_NE(with_config(false, {{"bos_token", 7}}), nullptr);
}

TEST(TokenizerConfigFlagsByHand, LoadReadsTheConfigBesideTheFileAndNamesIt) {
  const fs::path dir =
      fs::temp_directory_path() / ("kvvm_tokenizer_config_flags_" + std::to_string(getpid()));
  fs::create_directories(dir);
  std::ofstream(dir / "tokenizer.json") << base(false).dump();
  std::ofstream(dir / "tokenizer_config.json")
      << R"({"add_bos_token": true, "add_eos_token": false, "bos_token": "<s>"})";
  Result<std::unique_ptr<Tokenizer>> loaded = Tokenizer::load((dir / "tokenizer.json").string());
  ASSERT_TRUE(loaded.ok()) << loaded.status().to_string();
  EXPECT_EQ((*loaded)->encode("ab", true), (Ids{300, 256}));
  std::ofstream(dir / "tokenizer_config.json") << R"({"add_bos_token": 1})";
  loaded = Tokenizer::load((dir / "tokenizer.json").string());
  ASSERT_FALSE(loaded.ok());
  EXPECT_NE(loaded.status().message().find((dir / "tokenizer_config.json").string()),
            std::string::npos)
      << loaded.status().message();
  std::ofstream(dir / "tokenizer_config.json") << "{";
  loaded = Tokenizer::load((dir / "tokenizer.json").string());
  ASSERT_FALSE(loaded.ok());
  EXPECT_NE(loaded.status().message().find("tokenizer_config.json"), std::string::npos);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace kvvm::tokenizer::config_flags_test
