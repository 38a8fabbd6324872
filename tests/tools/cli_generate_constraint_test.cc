// `kvvm generate`'s structured output flags through run_cli, on the demo model (which answers
// "What is A + B?" with the sum): one constraint at most, its refusals naming the flag (and the
// file), and the text matching it. The answers need the grammar front ends and the engine's
// masks: they skip while the front ends only refuse (a tree without them).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "kit/cli_common.h"
#include "kvvm/grammar/constraint.h"
#include "support/cli_run.h"
#include "support/test_data.h"

namespace kvvm::cli {
namespace {

namespace fs = std::filesystem;
using test::CliRun;
using test::contains;
using test::run;

// A file of the test's own under the system's temporary directory.
std::string write_file(const std::string& name, const std::string& text) {
  const fs::path path = fs::temp_directory_path() / ("kvvm_cli_constraint_" + name);
  std::ofstream(path) << text;
  return path.string();
}

std::vector<std::string> demo_args(std::vector<std::string> more) {
  std::vector<std::string> args = {"generate", "--model", test::demo_model_dir(), "--backend",
                                   "cpu",      "--chat",  "What is 482 + 39?",    "--max-tokens",
                                   "16",       "--json"};
  args.insert(args.end(), more.begin(), more.end());
  return args;
}

TEST(CliGenerateConstraint, HelpExplainsEveryConstraintFlag) {
  CliRun r = run({"generate", "--help"});
  ASSERT_EQ(r.code, kExitOk);
  for (const char* option : {"--json-schema", "--json-object", "--regex", "--grammar", "--choice",
                             "--json-whitespace"}) {
    EXPECT_TRUE(contains(r.out, option)) << option;
  }
}

TEST(CliGenerateConstraint, BadConstraintsAreRefusedNamingTheFlag) {
  // Two constraints: the command line's error, before any model is loaded.
  CliRun two = run(demo_args({"--regex", "[0-9]+", "--json-object"}));
  EXPECT_EQ(two.code, kExitUsage);
  EXPECT_TRUE(contains(two.err, "--regex")) << two.err;

  CliRun bad_whitespace = run(demo_args({"--json-object", "--json-whitespace", "wide"}));
  EXPECT_EQ(bad_whitespace.code, kExitUsage);
  EXPECT_TRUE(contains(bad_whitespace.err, "--json-whitespace")) << bad_whitespace.err;

  const std::string missing = (fs::temp_directory_path() / "kvvm_no_such_schema.json").string();
  CliRun no_file = run(demo_args({"--json-schema", missing}));
  EXPECT_EQ(no_file.code, kExitUsage);
  EXPECT_TRUE(contains(no_file.err, "--json-schema " + missing)) << no_file.err;

  CliRun no_grammar = run(demo_args({"--grammar", missing}));
  EXPECT_EQ(no_grammar.code, kExitUsage);
  EXPECT_TRUE(contains(no_grammar.err, "--grammar " + missing)) << no_grammar.err;

  // The compiler's refusal after the flag (and the file).
  CliRun lookahead = run(demo_args({"--regex", "(?=1)1"}));
  EXPECT_EQ(lookahead.code, kExitUsage);
  EXPECT_TRUE(contains(lookahead.err, "kvvm generate: ")) << lookahead.err;
  EXPECT_TRUE(contains(lookahead.err, "--regex: ")) << lookahead.err;

  const std::string schema = write_file("if.json", R"({"if": {"type": "string"}})");
  CliRun unsupported = run(demo_args({"--json-schema", schema}));
  EXPECT_EQ(unsupported.code, kExitUsage);
  EXPECT_TRUE(contains(unsupported.err, "--json-schema " + schema + ": ")) << unsupported.err;
  EXPECT_TRUE(contains(unsupported.err, R"("if" is not supported)")) << unsupported.err;
}

// --- The answers: these need the front ends and the engine's masks. ---

TEST(CliGenerateConstraint, TheTextMatchesItsConstraint) {
  CliRun digits = run(demo_args({"--regex", "[0-9]{3}"}));
  ASSERT_EQ(digits.code, kExitOk) << digits.err;
  const nlohmann::json three = nlohmann::json::parse(digits.out);
  EXPECT_EQ(three.at("text"), "521");  // the model's own answer fits the pattern
  EXPECT_EQ(three.at("finish_reason"), "stop");

  CliRun choice = run(demo_args({"--choice", "yes,no"}));
  ASSERT_EQ(choice.code, kExitOk) << choice.err;
  const std::string chosen = nlohmann::json::parse(choice.out).at("text");
  EXPECT_TRUE(chosen == "yes" || chosen == "no") << chosen;

  const std::string schema = write_file(
      "sum.json", R"({"type": "object", "properties": {"sum": {"type": "integer", "minimum": 0,)"
                  R"( "maximum": 1998}}, "required": ["sum"], "additionalProperties": false})");
  CliRun json = run(demo_args({"--json-schema", schema}));
  ASSERT_EQ(json.code, kExitOk) << json.err;
  const std::string text = nlohmann::json::parse(json.out).at("text");
  const nlohmann::json answer = nlohmann::json::parse(text, nullptr, false);
  ASSERT_TRUE(answer.is_object()) << text;
  EXPECT_TRUE(answer.at("sum").is_number_integer()) << text;
  EXPECT_EQ(text.find(' '), std::string::npos) << "compact by default: " << text;

  const std::string gbnf = write_file("yes.gbnf", "root ::= \"yes\" | \"no\"\n");
  CliRun grammar = run(demo_args({"--grammar", gbnf}));
  ASSERT_EQ(grammar.code, kExitOk) << grammar.err;
  const std::string said = nlohmann::json::parse(grammar.out).at("text");
  EXPECT_TRUE(said == "yes" || said == "no") << said;
}

}  // namespace
}  // namespace kvvm::cli
