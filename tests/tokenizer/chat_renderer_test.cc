// ChatRenderer renders a checkpoint's own chat template byte for byte as transformers'
// apply_chat_template does (tests/data/chat_templates/expected.json, written by
// scripts/fixtures/chat_templates.py with jinja2 configured as transformers configures it),
// finds the template where transformers finds it, and falls back to a built-in one only when
// the checkpoint ships none.
#include "kvvm/tokenizer/chat_renderer.h"

#include <gtest/gtest.h>

#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "support/safetensors_writer.h"
#include "support/test_data.h"
#include "support/text_match.h"

namespace kvvm::tokenizer {
namespace {

namespace fs = std::filesystem;
using nlohmann::ordered_json;
using test::contains;

fs::path chat_templates_dir() { return test::data_dir() / "chat_templates"; }

std::string read_fixture_text(const fs::path& path) {
  std::ifstream file(path, std::ios::binary);
  std::ostringstream text;
  text << file.rdbuf();
  return text.str();
}

void write_scratch_file(const fs::path& path, const std::string& text) {
  std::ofstream file(path, std::ios::binary);
  file << text;
}

// The clock the fixture script fixed: 2026-01-15 09:30:00, a Thursday.
jinja::RenderHooks fixed_clock() {
  jinja::RenderHooks hooks;
  hooks.strftime_now = [](std::string_view format) {
    std::tm when{};
    when.tm_year = 2026 - 1900;
    when.tm_mon = 0;
    when.tm_mday = 15;
    when.tm_hour = 9;
    when.tm_min = 30;
    when.tm_wday = 4;
    when.tm_yday = 14;
    char out[256];
    const std::size_t length = std::strftime(out, sizeof(out), std::string(format).c_str(), &when);
    return std::string(out, length);
  };
  return hooks;
}

ChatInput chat_input_of(const ordered_json& entry, const ordered_json& tools) {
  ChatInput input;
  input.messages_json = entry.at("messages").dump();
  if (entry.value("tools", false)) input.tools_json = tools.dump();
  if (entry.contains("documents")) input.documents_json = entry.at("documents").dump();
  if (entry.contains("kwargs")) input.kwargs_json = entry.at("kwargs").dump();
  input.add_generation_prompt = entry.at("add_generation_prompt").get<bool>();
  input.continue_final_message = entry.at("continue_final_message").get<bool>();
  return input;
}

ChatRenderer load_renderer(const fs::path& dir, std::string_view spec = "") {
  Result<ChatRenderer> renderer = ChatRenderer::load(dir.string(), spec);
  EXPECT_TRUE(renderer.ok()) << dir << ": " << renderer.status().to_string();
  return renderer.ok() ? std::move(renderer).value() : ChatRenderer::builtin(ChatTemplate::kChatML);
}

TEST(ChatRenderer, EveryFixtureCaseIsByteIdenticalToTransformers) {
  const ordered_json expected =
      ordered_json::parse(read_fixture_text(chat_templates_dir() / "expected.json"));
  const ordered_json& tools = expected.at("tools");
  const jinja::RenderHooks hooks = fixed_clock();
  std::map<std::string, ChatRenderer> renderers;
  std::size_t texts = 0;
  std::size_t errors = 0;
  for (const ordered_json& entry : expected.at("cases")) {
    const std::string family = entry.at("family").get<std::string>();
    const std::string name = family + "/" + entry.at("name").get<std::string>();
    if (!renderers.contains(family))
      renderers.emplace(family, load_renderer(chat_templates_dir() / family));
    const Result<std::string> text =
        renderers.at(family).render(chat_input_of(entry, tools), hooks);
    if (entry.contains("text")) {
      ++texts;
      ASSERT_TRUE(text.ok()) << name << ": " << text.status().to_string();
      EXPECT_EQ(*text, entry.at("text").get<std::string>()) << name;
      continue;
    }
    ++errors;
    const std::string error = entry.at("error").get<std::string>();
    ASSERT_FALSE(text.ok()) << name << " rendered, transformers said: " << error;
    EXPECT_EQ(text.status().code(), StatusCode::kInvalidArgument) << name;
    // raise_exception's message is kept, and the renderer's own errors are transformers'; an
    // error of the interpreter (a str + list, say) is Python's own wording, not compared.
    if (entry.value("raised", false) || error.starts_with("continue_final_message")) {
      EXPECT_TRUE(contains(text.status().message(), error.substr(0, 80)))
          << name << ": " << text.status().message();
    }
  }
  EXPECT_GT(texts, 150u);
  EXPECT_GT(errors, 10u);
}

TEST(ChatRenderer, ParityWithTheModelFixturesChats) {
  // The tiny checkpoints' chats as transformers 5.17 rendered them (scripts/make_fixtures.py).
  for (const char* model : {"qwen2-tiny", "llama-tiny", "qwen3-tiny"}) {
    const ChatRenderer renderer = load_renderer(test::model_fixture_dir(model));
    EXPECT_EQ(renderer.origin(), "chat_template.jinja");
    const nlohmann::json expected = nlohmann::json::parse(
        read_fixture_text(fs::path(test::model_fixture_dir(model)) / "expected.json"));
    for (const nlohmann::json& chat : expected.at("chat")) {
      ChatInput input;
      input.messages_json = chat.at("messages").dump();
      input.add_generation_prompt = chat.value("add_generation_prompt", true);
      if (chat.contains("enable_thinking")) {
        input.kwargs_json = nlohmann::json{{"enable_thinking", chat.at("enable_thinking")}}.dump();
      }
      Result<std::string> text = renderer.render(input);
      ASSERT_TRUE(text.ok()) << model << ": " << text.status().to_string();
      EXPECT_EQ(*text, chat.at("text").get<std::string>()) << model;
    }
  }
}

TEST(ChatRenderer, LoadsTheConfigsStringTemplate) {
  const ChatRenderer renderer = load_renderer(chat_templates_dir() / "qwen3");
  EXPECT_FALSE(renderer.is_builtin());
  EXPECT_EQ(renderer.origin(), "tokenizer_config.json");
  const nlohmann::json config = nlohmann::json::parse(
      read_fixture_text(chat_templates_dir() / "qwen3" / "tokenizer_config.json"));
  EXPECT_EQ(renderer.source(), config.at("chat_template").get<std::string>());
}

TEST(ChatRenderer, ListOfNamedTemplatesTakesToolUseWithTools) {
  const ChatRenderer renderer = load_renderer(chat_templates_dir() / "named");
  EXPECT_EQ(renderer.origin(), "tokenizer_config.json (default, tool_use)");
  ChatInput input;
  input.messages_json = R"([{"role": "user", "content": "Hi"}])";
  Result<std::string> plain = renderer.render(input);
  ASSERT_TRUE(plain.ok()) << plain.status().to_string();
  EXPECT_EQ(*plain, "<bos><user>Hi</user>\n<assistant>");
  input.tools_json = "null";  // None, as absent
  Result<std::string> null_tools = renderer.render(input);
  ASSERT_TRUE(null_tools.ok()) << null_tools.status().to_string();
  EXPECT_EQ(*null_tools, *plain);
  input.tools_json = R"([{"type": "function", "function": {"name": "f"}}])";
  Result<std::string> with_tools = renderer.render(input);
  ASSERT_TRUE(with_tools.ok()) << with_tools.status().to_string();
  EXPECT_EQ(*with_tools, "<bos><tools>f</tools>\n<user>Hi</user>\n<assistant>");
}

TEST(ChatRenderer, ListWithoutDefaultRendersOnlyWithTools) {
  test::TempDir temp;
  write_scratch_file(
      temp / "tokenizer_config.json",
      R"({"chat_template": [{"name": "tool_use", "template": "T{{ tools | length }}"}]})");
  const ChatRenderer renderer = load_renderer(temp.path());
  ChatInput input;
  input.messages_json = "[]";
  Result<std::string> none = renderer.render(input);
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(contains(none.status().message(), "default")) << none.status().message();
  input.tools_json = "[{}, {}]";
  Result<std::string> tools = renderer.render(input);
  ASSERT_TRUE(tools.ok()) << tools.status().to_string();
  EXPECT_EQ(*tools, "T2");
}

TEST(ChatRenderer, ChatTemplateJinjaWinsOverTheConfig) {
  test::TempDir temp;
  write_scratch_file(temp / "tokenizer_config.json",
                     R"({"chat_template": "config", "bos_token": {"content": "<s>"}})");
  write_scratch_file(temp / "chat_template.jinja", "file {{ bos_token }}\n");
  const ChatRenderer renderer = load_renderer(temp.path());
  EXPECT_EQ(renderer.origin(), "chat_template.jinja");
  ChatInput input;
  input.messages_json = "[]";
  Result<std::string> text = renderer.render(input);
  ASSERT_TRUE(text.ok()) << text.status().to_string();
  EXPECT_EQ(*text, "file <s>");  // keep_trailing_newline off, as in transformers
}

TEST(ChatRenderer, AdditionalChatTemplatesAreNamedByTheirFiles) {
  // transformers 5's layout: the default in chat_template.jinja, the others in
  // additional_chat_templates/NAME.jinja.
  test::TempDir temp;
  write_scratch_file(temp / "chat_template.jinja", "default");
  fs::create_directories(temp / "additional_chat_templates");
  write_scratch_file(temp / "additional_chat_templates" / "tool_use.jinja",
                     "tools {{ tools | length }}");
  write_scratch_file(temp / "additional_chat_templates" / "notes.txt", "not a template");
  const ChatRenderer renderer = load_renderer(temp.path());
  EXPECT_EQ(renderer.origin(), "chat_template.jinja (default, tool_use)");
  EXPECT_EQ(renderer.source(), "default");
  ChatInput input;
  input.messages_json = "[]";
  Result<std::string> plain = renderer.render(input);
  ASSERT_TRUE(plain.ok()) << plain.status().to_string();
  EXPECT_EQ(*plain, "default");
  input.tools_json = "[{}]";
  Result<std::string> tools = renderer.render(input);
  ASSERT_TRUE(tools.ok()) << tools.status().to_string();
  EXPECT_EQ(*tools, "tools 1");
}

TEST(ChatRenderer, OverrideFileGetsTheModelsSpecialTokens) {
  test::TempDir temp;
  write_scratch_file(temp / "tokenizer_config.json",
                     R"({"chat_template": "config", "bos_token": "<B>", "eos_token": null})");
  const fs::path file = temp / "mine.jinja";
  write_scratch_file(file, "{{ bos_token }}|{{ eos_token is defined }}|{{ messages[0].content }}");
  const ChatRenderer renderer = load_renderer(temp.path(), file.string());
  EXPECT_EQ(renderer.origin(), file.string());
  ChatInput input;
  input.messages_json = R"([{"role": "user", "content": "x"}])";
  Result<std::string> text = renderer.render(input);
  ASSERT_TRUE(text.ok()) << text.status().to_string();
  EXPECT_EQ(*text, "<B>|False|x");
}

TEST(ChatRenderer, BuiltInNamesSelectABuiltIn) {
  for (const char* name : {"chatml", "llama3", "qwen3"}) {
    const ChatRenderer renderer = load_renderer(chat_templates_dir() / "qwen3", name);
    EXPECT_TRUE(renderer.is_builtin());
    EXPECT_EQ(renderer.origin(), std::string("built-in ") + name);
    EXPECT_TRUE(renderer.source().empty());
  }
}

TEST(ChatRenderer, BuiltInOnlyWhenTheCheckpointShipsNoTemplate) {
  struct Case {
    std::string tokens;
    std::string origin;
  };
  for (const Case& c : {Case{R"("<|im_start|>", "<|im_end|>")", "built-in chatml"},
                        Case{R"("<|im_start|>", "<think>")", "built-in qwen3"},
                        Case{R"("<|start_header_id|>")", "built-in llama3"}}) {
    test::TempDir temp;
    write_scratch_file(temp / "tokenizer_config.json", R"({"eos_token": "x"})");
    write_scratch_file(temp / "tokenizer.json", R"({"added_tokens": [)" + c.tokens + "]}");
    const ChatRenderer renderer = load_renderer(temp.path());
    EXPECT_EQ(renderer.origin(), c.origin);
  }
}

TEST(ChatRenderer, NoTemplateIsNotFoundSayingWhatToPass) {
  // Gemma 2's npm package ships no chat_template, and its tokens are no built-in's.
  Result<ChatRenderer> renderer =
      ChatRenderer::load((chat_templates_dir() / "gemma2").string(), "");
  ASSERT_FALSE(renderer.ok());
  EXPECT_EQ(renderer.status().code(), StatusCode::kNotFound);
  EXPECT_TRUE(contains(renderer.status().message(), "--chat-template FILE"))
      << renderer.status().message();
  EXPECT_TRUE(contains(renderer.status().message(), "tokenizer_config.json"));

  Result<ChatRenderer> missing =
      ChatRenderer::load((chat_templates_dir() / "qwen3").string(), "/no/such/template.jinja");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_TRUE(contains(missing.status().message(), "/no/such/template.jinja"));
}

TEST(ChatRenderer, TemplateErrorsNameTheOriginAndLine) {
  test::TempDir temp;
  const fs::path bad = temp / "bad.jinja";
  write_scratch_file(bad, "line one\n{{ messages[0].content ");
  Result<ChatRenderer> unparsed = ChatRenderer::load(temp.path().string(), bad.string());
  ASSERT_FALSE(unparsed.ok());
  EXPECT_EQ(unparsed.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(contains(unparsed.status().message(), bad.string() + ":2"))
      << unparsed.status().message();

  write_scratch_file(temp / "tokenizer_config.json",
                     "{\"chat_template\": \"a\\nb\\n{{ raise_exception('no system role') }}\"}");
  const ChatRenderer renderer = load_renderer(temp.path());
  ChatInput input;
  input.messages_json = "[]";
  Result<std::string> raised = renderer.render(input);
  ASSERT_FALSE(raised.ok());
  EXPECT_EQ(raised.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(contains(raised.status().message(), "tokenizer_config.json:3"))
      << raised.status().message();
  EXPECT_TRUE(contains(raised.status().message(), "no system role"));
}

TEST(ChatRenderer, BuiltInRefusesTools) {
  const ChatRenderer renderer = ChatRenderer::builtin(ChatTemplate::kChatML);
  ChatInput input;
  input.messages_json = R"([{"role": "user", "content": "Hi"}])";
  input.tools_json = R"([{"type": "function", "function": {"name": "f"}}])";
  for (const std::string& messages :
       {std::string(R"([{"role": "user", "content": "Hi"}])"),
        std::string(R"([{"role": "tool", "tool_call_id": "a", "content": "1"}])"),
        std::string(R"([{"role": "assistant", "content": null, "tool_calls": [{"id": "a"}]}])")}) {
    input.messages_json = messages;
    Result<std::string> text = renderer.render(input);
    ASSERT_FALSE(text.ok()) << messages;
    EXPECT_EQ(text.status().code(), StatusCode::kInvalidArgument);
    EXPECT_TRUE(contains(text.status().message(), "renders no tools")) << text.status().message();
    EXPECT_TRUE(contains(text.status().message(), "--chat-template FILE"));
    input.tools_json.clear();  // the messages alone are refused too
  }
}

TEST(ChatRenderer, BuiltInRendersPlainChatsAsBefore) {
  const ChatRenderer renderer = ChatRenderer::builtin(ChatTemplate::kQwen3);
  ChatInput input;
  input.messages_json =
      R"([{"role": "user", "content": [{"type": "text", "text": "H"}, {"type": "text", "text": "i"}]}])";
  input.kwargs_json = R"({"enable_thinking": false})";
  Result<std::string> text = renderer.render(input);
  ASSERT_TRUE(text.ok()) << text.status().to_string();
  EXPECT_EQ(*text,
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");

  const ChatRenderer chatml = ChatRenderer::builtin(ChatTemplate::kChatML);
  input.messages_json =
      R"([{"role": "user", "content": "Q"}, {"role": "assistant", "content": "A is "}])";
  input.kwargs_json.clear();
  input.add_generation_prompt = false;
  input.continue_final_message = true;
  Result<std::string> continued = chatml.render(input);
  ASSERT_TRUE(continued.ok()) << continued.status().to_string();
  EXPECT_EQ(*continued, "<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\nA is ");
}

TEST(ChatRenderer, KwargsMayNotSetTheRequestsOwnVariables) {
  const ChatRenderer renderer = load_renderer(chat_templates_dir() / "probe");
  ChatInput input;
  input.messages_json = R"([{"role": "user", "content": "Q"}])";
  for (const char* name : {"messages", "tools", "documents", "add_generation_prompt"}) {
    input.kwargs_json = std::string("{\"") + name + "\": 1}";
    Result<std::string> text = renderer.render(input);
    ASSERT_FALSE(text.ok()) << name;
    EXPECT_TRUE(contains(text.status().message(), name)) << text.status().message();
  }
  input.kwargs_json = "[1]";
  EXPECT_FALSE(renderer.render(input).ok());
  input.kwargs_json.clear();
  input.messages_json = "{}";
  EXPECT_FALSE(renderer.render(input).ok());
}

TEST(ChatRenderer, CopiesShareTheParsedTemplate) {
  const ChatRenderer renderer = load_renderer(chat_templates_dir() / "llama3_2");
  const ChatRenderer copy = renderer;  // NOLINT(performance-unnecessary-copy-initialization)
  EXPECT_EQ(&copy.source(), &renderer.source());
}

}  // namespace
}  // namespace kvvm::tokenizer
