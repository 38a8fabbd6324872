// What the request-parsing tests share: the tokenizers of the demo model (ChatML, no BOS) and
// llama-tiny (a BOS added by its post-processor), the parse context of each, a parse that must
// accept or must refuse, and a refusal expected. One fixture for the suite's files, so that they
// are one test suite.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <variant>

#include "kvvm/tokenizer/chat_renderer.h"
#include "kvvm/tokenizer/chat_template.h"
#include "kvvm/tokenizer/tokenizer.h"
#include "server/openai_request.h"
#include "server/tool_call_parser.h"
#include "support/test_data.h"
#include "support/text_match.h"

namespace kvvm::server::request_test {

using tokenizer::ChatMessage;
using tokenizer::ChatTemplate;
using tokenizer::Tokenizer;

constexpr std::uint32_t kContext = 64;
constexpr std::uint32_t kDefaultMaxTokens = 16;

using test::contains;

inline std::unique_ptr<Tokenizer> load_tokenizer(const std::string& dir) {
  Result<std::unique_ptr<Tokenizer>> tok = Tokenizer::load(dir + "/tokenizer.json");
  EXPECT_TRUE(tok.ok()) << tok.status().to_string();
  return tok.ok() ? std::move(tok).value() : nullptr;
}

struct Refusal {
  Endpoint endpoint;
  std::string body;
  std::string param;    // "": null (the body itself is at fault)
  std::string mention;  // a part of the message: the bad value or the limit
};

// The demo model (ChatML, no BOS) and llama-tiny (a BOS added by its post-processor).
class ServerRequest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    adder_ = load_tokenizer(test::demo_model_dir()).release();
    llama_ = load_tokenizer(test::model_fixture_dir("llama-tiny")).release();
  }
  static void TearDownTestSuite() {
    delete adder_;
    delete llama_;
  }

  // The built-in renderer of `kind`, alive for the whole run (contexts point at it).
  static const tokenizer::ChatRenderer* renderer(ChatTemplate kind) {
    static const tokenizer::ChatRenderer chatml =
        tokenizer::ChatRenderer::builtin(ChatTemplate::kChatML);
    static const tokenizer::ChatRenderer llama3 =
        tokenizer::ChatRenderer::builtin(ChatTemplate::kLlama3);
    return kind == ChatTemplate::kChatML ? &chatml : &llama3;
  }

  static ParseContext context(const Tokenizer* tok, ChatTemplate kind) {
    ParseContext ctx;
    ctx.tokenizer = tok;
    ctx.chat_renderer = renderer(kind);
    ctx.model_name = "m";
    ctx.context_tokens = kContext;
    ctx.vocab_size = static_cast<std::uint32_t>(tok->vocab_size());
    ctx.default_max_tokens = kDefaultMaxTokens;
    return ctx;
  }
  static ParseContext adder() { return context(adder_, ChatTemplate::kChatML); }
  static ParseContext llama() { return context(llama_, ChatTemplate::kLlama3); }
  // The demo model with its own template, which shows tools and calls as Qwen2.5's does: its
  // answers are read with the hermes parser. The context holds the tools' text.
  static ParseContext adder_tools() {
    static const tokenizer::ChatRenderer own = [] {
      Result<tokenizer::ChatRenderer> loaded =
          tokenizer::ChatRenderer::load(test::demo_model_dir(), "");
      EXPECT_TRUE(loaded.ok()) << loaded.status().to_string();
      return std::move(loaded).value();
    }();
    ParseContext ctx = adder();
    ctx.chat_renderer = &own;
    ctx.context_tokens = 1024;
    ctx.tool_call_format = detect_tool_call_format(own.source());
    return ctx;
  }

  static ApiRequest accept(Endpoint endpoint, const std::string& body, const ParseContext& ctx) {
    std::variant<ApiRequest, ApiError> parsed = parse_request(endpoint, body, ctx);
    if (const ApiError* error = std::get_if<ApiError>(&parsed)) {
      ADD_FAILURE() << body << " -> " << error->message;
      return {};
    }
    return std::get<ApiRequest>(std::move(parsed));
  }
  static ApiError refuse(Endpoint endpoint, const std::string& body, const ParseContext& ctx) {
    std::variant<ApiRequest, ApiError> parsed = parse_request(endpoint, body, ctx);
    if (!std::holds_alternative<ApiError>(parsed)) {
      ADD_FAILURE() << body.substr(0, 200) << " was accepted";
      return {};
    }
    return std::get<ApiError>(std::move(parsed));
  }

  static inline Tokenizer* adder_ = nullptr;
  static inline Tokenizer* llama_ = nullptr;
};

}  // namespace kvvm::server::request_test
