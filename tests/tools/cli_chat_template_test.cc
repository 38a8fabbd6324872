// `kvvm chat-template` prints a chat exactly as the model's template renders it (the golden
// render of tests/data/chat_templates/expected.json), and names the file or field at fault.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "support/cli_run.h"
#include "support/safetensors_writer.h"
#include "support/test_data.h"

namespace kvvm::cli {
namespace {

namespace fs = std::filesystem;
using nlohmann::ordered_json;
using test::contains;
using test::run;

fs::path cli_chat_templates_dir() { return test::data_dir() / "chat_templates"; }

// The fixture case FAMILY/NAME of expected.json.
ordered_json golden_chat_case(const std::string& family, const std::string& name) {
  std::ifstream file(cli_chat_templates_dir() / "expected.json");
  std::ostringstream text;
  text << file.rdbuf();
  const ordered_json expected = ordered_json::parse(text.str());
  for (const ordered_json& entry : expected.at("cases")) {
    if (entry.at("family") == family && entry.at("name") == name) return entry;
  }
  ADD_FAILURE() << "no case " << family << "/" << name;
  return {};
}

void write_chat_file(const fs::path& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

TEST(CliChatTemplate, PrintsTheGoldenRender) {
  test::TempDir temp;
  const ordered_json tools_case = golden_chat_case("qwen2_5", "tool_call_and_result");
  write_chat_file(temp / "messages.json", tools_case.at("messages").dump(2));
  std::ifstream expected_file(cli_chat_templates_dir() / "expected.json");
  std::ostringstream expected_text;
  expected_text << expected_file.rdbuf();
  write_chat_file(temp / "tools.json", ordered_json::parse(expected_text.str()).at("tools").dump());
  const test::CliRun result = run(
      {"chat-template", "--model", (cli_chat_templates_dir() / "qwen2_5").string(), "--messages",
       (temp / "messages.json").string(), "--tools", (temp / "tools.json").string()});
  EXPECT_EQ(result.code, 0) << result.err;
  EXPECT_EQ(result.out, tools_case.at("text").get<std::string>());

  const ordered_json thinking = golden_chat_case("qwen3", "thinking_off");
  write_chat_file(temp / "thinking.json", thinking.at("messages").dump());
  const test::CliRun off =
      run({"chat-template", "--model", (cli_chat_templates_dir() / "qwen3").string(), "--messages",
           (temp / "thinking.json").string(), "--kwargs", R"({"enable_thinking": false})"});
  EXPECT_EQ(off.code, 0) << off.err;
  EXPECT_EQ(off.out, thinking.at("text").get<std::string>());

  const ordered_json continued = golden_chat_case("llama3_2", "continue_final_message");
  write_chat_file(temp / "continued.json", continued.at("messages").dump());
  const test::CliRun cont =
      run({"chat-template", "--model", (cli_chat_templates_dir() / "llama3_2").string(),
           "--messages", (temp / "continued.json").string(), "--continue-final-message"});
  EXPECT_EQ(cont.code, 0) << cont.err;
  // Llama 3.2 prints the date: the golden one is fixed, this one is today's.
  const std::string want = continued.at("text").get<std::string>();
  EXPECT_TRUE(cont.out.ends_with(want.substr(want.find("<|eot_id|>")))) << cont.out;
}

TEST(CliChatTemplate, ErrorsNameTheFileOrField) {
  test::TempDir temp;
  write_chat_file(temp / "bad.json", "[{\"role\": \"user\",]");
  write_chat_file(temp / "object.json", R"({"role": "user"})");
  write_chat_file(temp / "ok.json", R"([{"role": "user", "content": "Hi"}])");
  const std::string model = (cli_chat_templates_dir() / "qwen3").string();
  struct Case {
    std::vector<std::string> args;
    std::string named;
  };
  const std::vector<Case> cases = {
      {{"chat-template", "--model", model}, "--messages"},
      {{"chat-template", "--model", model, "--messages", (temp / "absent.json").string()},
       "absent.json"},
      {{"chat-template", "--model", model, "--messages", (temp / "bad.json").string()}, "bad.json"},
      {{"chat-template", "--model", model, "--messages", (temp / "object.json").string()},
       "object.json"},
      {{"chat-template", "--model", model, "--messages", (temp / "ok.json").string(), "--kwargs",
        "[1]"},
       "--kwargs"},
      {{"chat-template", "--model", model, "--messages", (temp / "ok.json").string(),
        "--chat-template", (temp / "none.jinja").string()},
       "none.jinja"},
      {{"chat-template", "--model", (cli_chat_templates_dir() / "gemma2").string(), "--messages",
        (temp / "ok.json").string()},
       "--chat-template FILE"},
      {{"chat-template", "--model", (temp / "no-dir").string(), "--messages",
        (temp / "ok.json").string()},
       "no-dir"},
  };
  for (const Case& c : cases) {
    const test::CliRun result = run(c.args);
    EXPECT_EQ(result.code, 2) << c.named << ": " << result.err;
    EXPECT_TRUE(contains(result.err, c.named)) << c.named << ": " << result.err;
  }
  const test::CliRun help = run({"chat-template", "--help"});
  EXPECT_EQ(help.code, 0);
  for (const char* option : {"--model", "--messages", "--tools", "--chat-template", "--kwargs",
                             "--no-generation-prompt", "--continue-final-message"}) {
    EXPECT_TRUE(contains(help.out, option)) << option;
  }
}

}  // namespace
}  // namespace kvvm::cli
