// A tokenizer.json that is not the BPE implemented is refused with InvalidArgument naming the
// field and the value, never a crash and never a tokenizer that encodes differently.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "kvvm/tokenizer/tokenizer.h"
#include "support/tokenizer_json.h"

namespace kvvm::tokenizer {
namespace {

// The message of parsing `json`, which must fail with InvalidArgument.
std::string refusal(const std::string& json) {
  Result<std::unique_ptr<Tokenizer>> tokenizer = Tokenizer::parse(json, "bad.json");
  EXPECT_FALSE(tokenizer.ok());
  if (tokenizer.ok()) return "";
  EXPECT_EQ(tokenizer.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(tokenizer.status().message().rfind("bad.json", 0), 0u) << tokenizer.status().message();
  return tokenizer.status().message();
}

std::string refusal(const nlohmann::json& json) { return refusal(json.dump()); }

nlohmann::json valid() {
  test::TokenizerSpec spec;
  spec.tokens = {"ab"};
  spec.merges = {{"a", "b"}};
  return test::tokenizer_json(spec);
}

TEST(TokenizerErrors, TheValidBaseParses) {
  EXPECT_TRUE(Tokenizer::parse(valid().dump(), "good.json").ok());
}

TEST(TokenizerErrors, MalformedJson) {
  EXPECT_NE(refusal(std::string("{\"model\": ")).find("not valid JSON"), std::string::npos);
  EXPECT_NE(refusal(std::string("[1, 2]")).find("expected an object"), std::string::npos);
  EXPECT_NE(refusal(std::string(1000, '[')).find("nested deeper"), std::string::npos);
}

TEST(TokenizerErrors, ModelMissingOrNotBpe) {
  nlohmann::json json = valid();
  json.erase("model");
  EXPECT_NE(refusal(json).find("model: missing"), std::string::npos);
  json = valid();
  json["model"]["type"] = "Unigram";
  const std::string message = refusal(json);
  EXPECT_NE(message.find("model.type"), std::string::npos) << message;
  EXPECT_NE(message.find("Unigram"), std::string::npos) << message;
}

TEST(TokenizerErrors, MergeNamingAnUnknownToken) {
  nlohmann::json json = valid();
  json["model"]["merges"].push_back("a zz");
  std::string message = refusal(json);
  EXPECT_NE(message.find("model.merges[1]"), std::string::npos) << message;
  EXPECT_NE(message.find("'zz'"), std::string::npos) << message;
  json = valid();
  json["model"]["merges"].push_back("b c");  // both known, but "bc" is not in the vocab
  message = refusal(json);
  EXPECT_NE(message.find("makes token 'bc'"), std::string::npos) << message;
  json = valid();
  json["model"]["merges"].push_back("abc");
  EXPECT_NE(refusal(json).find("not two tokens"), std::string::npos);
}

TEST(TokenizerErrors, VocabIdsOutOfRangeOrShared) {
  for (const nlohmann::json& id : {nlohmann::json(-1), nlohmann::json(std::int64_t{1} << 40),
                                   nlohmann::json("7"), nlohmann::json(1.5)}) {
    nlohmann::json json = valid();
    json["model"]["vocab"]["zz"] = id;
    const std::string message = refusal(json);
    EXPECT_NE(message.find("model.vocab['zz']"), std::string::npos) << message;
  }
  nlohmann::json json = valid();
  json["model"]["vocab"]["zz"] = 97;  // the id of "a"
  EXPECT_NE(refusal(json).find("also the id of"), std::string::npos);
  json = valid();
  json["added_tokens"] = {test::added_token(-3, "<x>")};
  EXPECT_NE(refusal(json).find("added_tokens[0].id"), std::string::npos);
  json = valid();
  json["added_tokens"] = {test::added_token(97, "<x>")};  // the id of "a"
  EXPECT_NE(refusal(json).find("already the id of"), std::string::npos);
}

TEST(TokenizerErrors, UnimplementedOptionsAreRefusedByName) {
  const auto refused = [](const char* path, nlohmann::json json, const char* expect) {
    const std::string message = refusal(json);
    EXPECT_NE(message.find(expect), std::string::npos) << path << ": " << message;
  };
  nlohmann::json json = valid();
  json["model"]["continuing_subword_prefix"] = "##";
  refused("continuing_subword_prefix", json, "model.continuing_subword_prefix");
  json = valid();
  json["model"]["unk_token"] = "<unk>";  // not in the vocab
  refused("unk_token", json, "model.unk_token");
  json = valid();
  json["model"]["dropout"] = 0.1;
  refused("dropout", json, "model.dropout");
  json = valid();
  json["pre_tokenizer"] = {{"type", "BertPreTokenizer"}};
  refused("pre_tokenizer", json, "BertPreTokenizer");
  json = valid();
  json["pre_tokenizer"] = {
      {"type", "Split"}, {"pattern", {{"Regex", "(unclosed"}}}, {"behavior", "Isolated"}};
  refused("regex", json, "does not compile");
  json = valid();
  json["pre_tokenizer"]["pretokenizers"][0]["behavior"] = "Sideways";
  refused("behavior", json, "pre_tokenizer.pretokenizers[0].behavior");
  json = valid();
  json["normalizer"] = {{"type", "Lowercase"}};
  refused("normalizer", json, "Lowercase");
  json = valid();
  json["decoder"] = {{"type", "WordPiece"}};
  refused("decoder", json, "WordPiece");
  json = valid();
  json["post_processor"] = {{"type", "RobertaProcessing"}};
  refused("post_processor", json, "RobertaProcessing");
  json = valid();
  json["truncation"] = {{"max_length", 8}};
  refused("truncation", json, "truncation");
}

// The JSON pointers of every value in `json`, all but the first few members of the vocab and
// merges (256 byte tokens add nothing the first ones do not).
void collect_paths(const nlohmann::json& json, const nlohmann::json::json_pointer& at,
                   std::vector<nlohmann::json::json_pointer>& out) {
  out.push_back(at);
  const bool long_list = at.to_string() == "/model/vocab" || at.to_string() == "/model/merges";
  std::size_t seen = 0;
  if (json.is_object()) {
    for (const auto& [key, value] : json.items()) {
      if (long_list && ++seen > 3) break;
      collect_paths(value, at / key, out);
    }
  } else if (json.is_array()) {
    for (std::size_t i = 0; i < json.size() && !(long_list && i >= 3); ++i) {
      collect_paths(json[i], at / i, out);
    }
  }
}

TEST(TokenizerErrors, AnyFieldOfAnyTypeIsAcceptedOrRefusedNeverThrown) {
  test::TokenizerSpec spec;
  spec.tokens = {"ab"};
  spec.merges = {{"a", "b"}};
  spec.normalizer = {{"type", "Sequence"}, {"normalizers", {{{"type", "NFC"}}}}};
  spec.added_tokens = {test::added_token(300, "<|bos|>")};
  const nlohmann::json bos = {{"SpecialToken", {{"id", "<|bos|>"}, {"type_id", 0}}}};
  const nlohmann::json text = {{"Sequence", {{"id", "A"}, {"type_id", 0}}}};
  const nlohmann::json bos_ids = {{"id", "<|bos|>"}, {"ids", {300}}};
  spec.post_processor = {{"type", "TemplateProcessing"},
                         {"single", {bos, text}},
                         {"special_tokens", {{"<|bos|>", bos_ids}}}};
  const nlohmann::json base = test::tokenizer_json(spec);
  ASSERT_TRUE(Tokenizer::parse(base.dump(), "base.json").ok());
  std::vector<nlohmann::json::json_pointer> paths;
  collect_paths(base, nlohmann::json::json_pointer(), paths);
  const std::vector<nlohmann::json> replacements = {
      nullptr,
      true,
      -1,
      std::int64_t{1} << 40,
      1.5,
      "x",
      nlohmann::json::array(),
      nlohmann::json::object(),
      nlohmann::json::array({nlohmann::json::array({1})})};
  int accepted = 0, refused = 0;
  for (const auto& path : paths) {
    for (const nlohmann::json& replacement : replacements) {
      nlohmann::json json = base;
      json[path] = replacement;
      SCOPED_TRACE(path.to_string() + " = " + replacement.dump());
      Result<std::unique_ptr<Tokenizer>> tokenizer = Tokenizer::parse("{}", "");
      ASSERT_NO_THROW(tokenizer = Tokenizer::parse(json.dump(), "mutated.json"));
      if (tokenizer.ok()) {
        ++accepted;
        EXPECT_NO_THROW((*tokenizer)->encode("ab <|bos|> \xFF", true));
      } else {
        ++refused;
        EXPECT_EQ(tokenizer.status().code(), StatusCode::kInvalidArgument);
      }
    }
  }
  EXPECT_GT(refused, 100);
  EXPECT_GT(accepted, 10);  // optional fields set to null, flags to true, ...
}

TEST(TokenizerErrors, LoadNamesThePath) {
  const std::string missing = "/nonexistent/kvvm/tokenizer.json";
  Result<std::unique_ptr<Tokenizer>> absent = Tokenizer::load(missing);
  ASSERT_FALSE(absent.ok());
  EXPECT_EQ(absent.status().code(), StatusCode::kNotFound);
  EXPECT_NE(absent.status().message().find("not found"), std::string::npos);
  EXPECT_NE(absent.status().message().find(missing), std::string::npos);

  const auto path = std::filesystem::temp_directory_path() /
                    ("kvvm_tokenizer_errors_" + std::to_string(getpid()) + ".json");
  nlohmann::json json = valid();
  json["model"]["type"] = "WordPiece";
  std::ofstream(path) << json.dump();
  Result<std::unique_ptr<Tokenizer>> bad = Tokenizer::load(path.string());
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find(path.string()), std::string::npos);
  EXPECT_NE(bad.status().message().find("WordPiece"), std::string::npos);
  std::ofstream(path) << valid().dump();
  EXPECT_TRUE(Tokenizer::load(path.string()).ok());
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace kvvm::tokenizer
