// The official JSON-Schema-Test-Suite (draft 4, as npm's json-schema-test-suite package
// ships it in tests/clients/node_modules after `npm ci --prefix tests/clients`) against the
// schema compiler. A group whose schema compiles: every instance the suite calls invalid is
// rejected by its grammar (the compact text of the instance; the grammar writes a subset of the
// valid ones, so valid instances are counted, not required). A group refused: refused by name.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "kvvm/grammar/constraint.h"
#include "support/grammar_oracle.h"

namespace kvvm::grammar::json_schema_suite_test {

using kvvm::grammar::testing::oracle_accepts;

TEST(JsonSchemaSuiteTest, InvalidInstancesAreRejectedAndRefusalsNameTheirKeyword) {
  const std::filesystem::path dir = std::filesystem::path(KVVM_TEST_DATA_DIR) /
                                    "../clients/node_modules/json-schema-test-suite/tests/draft4";
  if (!std::filesystem::is_directory(dir)) {
    GTEST_SKIP() << dir << " is missing: run npm ci --prefix tests/clients";
  }
  int groups = 0, compiled = 0, refused = 0, invalid = 0, rejected = 0, valid = 0, accepted = 0;
  std::vector<std::filesystem::path> files;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().extension() == ".json") files.push_back(entry.path());
  }
  std::sort(files.begin(), files.end());
  for (const auto& file : files) {
    std::ifstream in(file);
    const nlohmann::ordered_json suite = nlohmann::ordered_json::parse(in);
    for (const auto& group : suite) {
      ++groups;
      const std::string where =
          file.filename().string() + ": " + group["description"].get<std::string>();
      Result<Grammar> grammar = grammar_from_json_schema(group["schema"].dump());
      if (!grammar.ok()) {
        ++refused;
        const Status status = grammar.status();
        const std::string message = status.message();
        EXPECT_TRUE(grammar.status().code() == StatusCode::kInvalidArgument ||
                    grammar.status().code() == StatusCode::kResourceExhausted)
            << where;
        EXPECT_EQ(message.rfind("schema", 0), 0u) << where << ": " << message;
        EXPECT_NE(message.find('"'), std::string::npos) << where << ": " << message;
        continue;
      }
      ++compiled;
      for (const auto& test : group["tests"]) {
        const std::string text = test["data"].dump();
        const bool accepts = oracle_accepts(*grammar, text);
        if (test["valid"].get<bool>()) {
          ++valid;
          accepted += accepts;
        } else {
          ++invalid;
          rejected += !accepts;
          EXPECT_FALSE(accepts) << where << " / " << test["description"].get<std::string>() << ": "
                                << text;
        }
      }
    }
  }
  std::printf(
      "JSON-Schema-Test-Suite draft4: %d groups, %d compiled, %d refused; invalid "
      "instances rejected %d of %d; valid instances accepted %d of %d\n",
      groups, compiled, refused, rejected, invalid, accepted, valid);
  EXPECT_GT(compiled, 0);
}

}  // namespace kvvm::grammar::json_schema_suite_test
