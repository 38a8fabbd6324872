// The built-in chat templates render exactly as the families' Jinja templates do, and a model
// directory's template is recognised by its markers (or refused, saying how to pick one).
#include "kvvm/tokenizer/chat_template.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace kvvm::tokenizer {
namespace {

namespace fs = std::filesystem;

const std::vector<ChatMessage> kConversation = {
    {"system", "Be brief."}, {"user", "  Hi there!\n"}, {"assistant", "Hello."}, {"user", "Bye"}};

TEST(ChatTemplate, ChatML) {
  Result<std::string> text = render_chat(ChatTemplate::kChatML, kConversation);
  ASSERT_TRUE(text.ok()) << text.status().to_string();
  EXPECT_EQ(*text,
            "<|im_start|>system\nBe brief.<|im_end|>\n"
            "<|im_start|>user\n  Hi there!\n<|im_end|>\n"
            "<|im_start|>assistant\nHello.<|im_end|>\n"
            "<|im_start|>user\nBye<|im_end|>\n"
            "<|im_start|>assistant\n");
  Result<std::string> no_prompt = render_chat(ChatTemplate::kChatML, kConversation, false);
  ASSERT_TRUE(no_prompt.ok());
  EXPECT_EQ(*no_prompt + "<|im_start|>assistant\n", *text);
}

TEST(ChatTemplate, Llama3TrimsContent) {
  Result<std::string> text = render_chat(ChatTemplate::kLlama3, kConversation);
  ASSERT_TRUE(text.ok()) << text.status().to_string();
  EXPECT_EQ(*text,
            "<|begin_of_text|>"
            "<|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nHi there!<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\nHello.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nBye<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
  // Python's strip() takes Unicode white space (an ideographic space) too, and nothing else.
  const std::vector<ChatMessage> spaced = {{"user", "\u3000\t x y \u00A0\n"}};
  Result<std::string> trimmed = render_chat(ChatTemplate::kLlama3, spaced, false);
  ASSERT_TRUE(trimmed.ok());
  EXPECT_EQ(*trimmed, "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nx y<|eot_id|>");
}

// Qwen3's template on messages without a thinking block: ChatML turns, and the generation
// prompt opens the assistant's turn (thinking on, the template's default) or closes an empty
// thinking block (enable_thinking false).
TEST(ChatTemplate, Qwen3PlainTurnsAreChatML) {
  Result<std::string> text = render_chat(ChatTemplate::kQwen3, kConversation);
  ASSERT_TRUE(text.ok()) << text.status().to_string();
  EXPECT_EQ(*text,
            "<|im_start|>system\nBe brief.<|im_end|>\n"
            "<|im_start|>user\n  Hi there!\n<|im_end|>\n"
            "<|im_start|>assistant\nHello.<|im_end|>\n"
            "<|im_start|>user\nBye<|im_end|>\n"
            "<|im_start|>assistant\n");
  Result<std::string> quiet =
      render_chat(ChatTemplate::kQwen3, kConversation, ChatRenderOptions{.enable_thinking = false});
  ASSERT_TRUE(quiet.ok());
  EXPECT_EQ(*quiet, *text + "<think>\n\n</think>\n\n");
  Result<std::string> no_prompt =
      render_chat(ChatTemplate::kQwen3, kConversation,
                  ChatRenderOptions{.add_generation_prompt = false, .enable_thinking = false});
  ASSERT_TRUE(no_prompt.ok());
  EXPECT_EQ(*no_prompt + "<|im_start|>assistant\n", *text);
  // The other templates have no thinking switch.
  EXPECT_EQ(
      render_chat(ChatTemplate::kChatML, kConversation, ChatRenderOptions{.enable_thinking = false})
          .value(),
      render_chat(ChatTemplate::kChatML, kConversation).value());
}

// An assistant turn before the last user turn loses its reasoning; one after it keeps a
// <think> block (an empty one when it is the last message and has none), with the newlines
// around reasoning and answer trimmed as the template's Python string methods trim them.
TEST(ChatTemplate, Qwen3StripsReasoningBeforeTheLastQuery) {
  const std::vector<ChatMessage> history = {{"user", "2 + 2?"},
                                            {"assistant", "<think>\nadd them\n</think>\n\n4"},
                                            {"user", "and 3 + 3?"}};
  EXPECT_EQ(render_chat(ChatTemplate::kQwen3, history).value(),
            "<|im_start|>user\n2 + 2?<|im_end|>\n"
            "<|im_start|>assistant\n4<|im_end|>\n"
            "<|im_start|>user\nand 3 + 3?<|im_end|>\n"
            "<|im_start|>assistant\n");

  const std::vector<ChatMessage> answered = {
      {"user", "hi"}, {"assistant", "\n<think>\n\nfirst\n<think>second\n\n</think>\n\nhello\n"}};
  EXPECT_EQ(render_chat(ChatTemplate::kQwen3, answered, false).value(),
            "<|im_start|>user\nhi<|im_end|>\n"
            "<|im_start|>assistant\n<think>\nsecond\n</think>\n\nhello\n<|im_end|>\n");

  const std::vector<ChatMessage> plain_last = {{"user", "hi"}, {"assistant", "\n\nhello"}};
  EXPECT_EQ(render_chat(ChatTemplate::kQwen3, plain_last, false).value(),
            "<|im_start|>user\nhi<|im_end|>\n"
            "<|im_start|>assistant\n<think>\n\n</think>\n\nhello<|im_end|>\n");

  // After the last query but not last: the block only where there is reasoning.
  const std::vector<ChatMessage> two_answers = {{"user", "hi"},
                                                {"assistant", "one"},
                                                {"assistant", "<think>r</think>two"},
                                                {"assistant", "three"}};
  EXPECT_EQ(render_chat(ChatTemplate::kQwen3, two_answers, false).value(),
            "<|im_start|>user\nhi<|im_end|>\n"
            "<|im_start|>assistant\none<|im_end|>\n"
            "<|im_start|>assistant\n<think>\nr\n</think>\n\ntwo<|im_end|>\n"
            "<|im_start|>assistant\n<think>\n\n</think>\n\nthree<|im_end|>\n");

  // A user turn that is a tool response is no query: the reasoning before it stays.
  const std::vector<ChatMessage> tool = {{"user", "q"},
                                         {"assistant", "<think>plan</think>call"},
                                         {"user", "<tool_response>\n42\n</tool_response>"}};
  EXPECT_EQ(render_chat(ChatTemplate::kQwen3, tool).value(),
            "<|im_start|>user\nq<|im_end|>\n"
            "<|im_start|>assistant\n<think>\nplan\n</think>\n\ncall<|im_end|>\n"
            "<|im_start|>user\n<tool_response>\n42\n</tool_response><|im_end|>\n"
            "<|im_start|>assistant\n");

  // No user turn at all: nothing follows a query, so no block.
  const std::vector<ChatMessage> no_user = {{"system", "s"}, {"assistant", "<think>x</think>y"}};
  EXPECT_EQ(render_chat(ChatTemplate::kQwen3, no_user, false).value(),
            "<|im_start|>system\ns<|im_end|>\n<|im_start|>assistant\ny<|im_end|>\n");
}

TEST(ChatTemplate, UnknownRoleAndNames) {
  const std::vector<ChatMessage> bad = {{"user", "a"}, {"tool", "b"}};
  Result<std::string> text = render_chat(ChatTemplate::kChatML, bad);
  ASSERT_FALSE(text.ok());
  EXPECT_NE(text.status().message().find("messages[1].role: 'tool'"), std::string::npos);
  EXPECT_EQ(parse_chat_template("chatml").value(), ChatTemplate::kChatML);
  EXPECT_EQ(parse_chat_template("llama3").value(), ChatTemplate::kLlama3);
  EXPECT_EQ(to_string(ChatTemplate::kLlama3), "llama3");
  EXPECT_EQ(parse_chat_template("qwen3").value(), ChatTemplate::kQwen3);
  EXPECT_EQ(to_string(ChatTemplate::kQwen3), "qwen3");
  Result<ChatTemplate> unknown = parse_chat_template("mistral");
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.status().message().find("chatml, llama3, qwen3"), std::string::npos);
  EXPECT_FALSE(render_chat(ChatTemplate::kQwen3, bad).ok());
}

class ChatTemplateDetect : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("kvvm_chat_template_" + std::to_string(getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  void write(const std::string& name, const std::string& text) {
    std::ofstream(dir_ / name, std::ios::binary) << text;
  }
  Result<ChatTemplate> detect() { return detect_chat_template(dir_.string()); }
  fs::path dir_;
};

TEST_F(ChatTemplateDetect, RecognisesTheMarkers) {
  write(
      "tokenizer_config.json",
      R"({"chat_template": "{% for message in messages %}{{'<|im_start|>' + message['role']}}{% endfor %}"})");
  EXPECT_EQ(detect().value(), ChatTemplate::kChatML);
  write("tokenizer_config.json",
        R"({"chat_template": "{{ bos_token }}{{ '<|start_header_id|>' + message['role'] }}"})");
  EXPECT_EQ(detect().value(), ChatTemplate::kLlama3);
  write("tokenizer_config.json",
        R"({"chat_template": [{"name": "tool_use", "template": "<|im_start|>"},
                              {"name": "default", "template": "<|start_header_id|>"}]})");
  EXPECT_EQ(detect().value(), ChatTemplate::kLlama3);
}

// Qwen3's template (abridged: its markers and its thinking switch) is Qwen3's, not plain
// ChatML; a ChatML template that mentions <think> without the switch stays ChatML.
TEST_F(ChatTemplateDetect, RecognisesQwen3ByItsThinkingSwitch) {
  const std::string qwen3 =
      "{%- for message in messages %}{%- if message.role == \"assistant\" %}"
      "{%- if '</think>' in content %}{%- set content = content.split('</think>')[-1] %}"
      "{%- endif %}{%- endif %}{{- '<|im_start|>' + message.role }}{%- endfor %}"
      "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
      "{%- if enable_thinking is defined and enable_thinking is false %}"
      "{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}{%- endif %}";
  write("tokenizer_config.json", nlohmann::json{{"chat_template", qwen3}}.dump());
  EXPECT_EQ(detect().value(), ChatTemplate::kQwen3);
  fs::remove(dir_ / "tokenizer_config.json");
  write("chat_template.jinja", qwen3);
  EXPECT_EQ(detect().value(), ChatTemplate::kQwen3);
  write("chat_template.jinja", "{{ '<|im_start|>assistant\n<think>\n' }}");
  EXPECT_EQ(detect().value(), ChatTemplate::kChatML);
}

TEST_F(ChatTemplateDetect, UnknownOrAbsentSaysHowToPick) {
  Result<ChatTemplate> absent = detect();
  ASSERT_FALSE(absent.ok());
  EXPECT_EQ(absent.status().code(), StatusCode::kNotFound);
  EXPECT_NE(absent.status().message().find("not found"), std::string::npos);
  EXPECT_NE(absent.status().message().find("--chat-template chatml|llama3"), std::string::npos);

  write("tokenizer_config.json", R"({"bos_token": "<s>"})");
  Result<ChatTemplate> no_field = detect();
  ASSERT_FALSE(no_field.ok());
  EXPECT_EQ(no_field.status().code(), StatusCode::kNotFound);
  EXPECT_NE(no_field.status().message().find("not found"), std::string::npos);

  write("tokenizer_config.json", R"({"chat_template": "[INST] {{ message['content'] }} [/INST]"})");
  Result<ChatTemplate> unknown = detect();
  ASSERT_FALSE(unknown.ok());
  EXPECT_EQ(unknown.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(unknown.status().message().find("none of the built-in"), std::string::npos);
  EXPECT_NE(unknown.status().message().find("--chat-template chatml|llama3"), std::string::npos);

  write("tokenizer_config.json",
        R"({"chat_template": [{"name": "rag", "template": "<|im_start|>"}]})");
  EXPECT_NE(detect().status().message().find("'default'"), std::string::npos);
  write("tokenizer_config.json", R"({"chat_template": )");
  EXPECT_NE(detect().status().message().find("not valid JSON"), std::string::npos);
}

TEST_F(ChatTemplateDetect, ReadsChatTemplateJinjaBesideTheConfig) {
  write("tokenizer_config.json", R"({"bos_token": "<s>"})");
  write("chat_template.jinja", "{{ '<|im_start|>' + message['role'] }}");
  EXPECT_EQ(detect().value(), ChatTemplate::kChatML);
}

}  // namespace
}  // namespace kvvm::tokenizer
