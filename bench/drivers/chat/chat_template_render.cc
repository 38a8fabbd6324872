#include "bench/drivers/chat/chat_template_render.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <nlohmann/json.hpp>
#include <ostream>
#include <string>
#include <vector>

#include "kit/cli_common.h"
#include "kvvm/tokenizer/chat_renderer.h"

namespace kvvm::cli {
namespace {

using nlohmann::ordered_json;

// A tool whose parameters nest objects and arrays, as real function schemas do.
ordered_json made_tool(std::uint32_t i) {
  const ordered_json address = {
      {"type", "object"},
      {"properties",
       {{"street", {{"type", "string"}}},
        {"city", {{"type", "string"}, {"description", "The city, e.g. Paris"}}},
        {"country", {{"type", "string"}, {"enum", {"FR", "DE", "JP", "US"}}}}}},
      {"required", {"city"}}};
  return {{"type", "function"},
          {"function",
           {{"name", "tool_" + std::to_string(i)},
            {"description", "Tool number " + std::to_string(i) + ": looks a thing up for the user"},
            {"parameters",
             {{"type", "object"},
              {"properties",
               {{"query", {{"type", "string"}, {"description", "What to look up"}}},
                {"limit", {{"type", "integer"}, {"minimum", 1}, {"maximum", 50}}},
                {"where", address},
                {"tags", {{"type", "array"}, {"items", {{"type", "string"}}}}}}},
              {"required", {"query"}}}}}}};
}

// system, then user / assistant turns; every third assistant turn calls a tool, answered by a
// tool message. As the server hands them to templates: a call's content "", its arguments an
// object.
ordered_json made_messages(std::uint32_t count) {
  ordered_json messages = ordered_json::array();
  messages.push_back({{"role", "system"}, {"content", "You are a helpful assistant."}});
  std::uint32_t turn = 0;
  while (messages.size() < count) {
    messages.push_back(
        {{"role", "user"},
         {"content", "Question " + std::to_string(turn) + ": what is the weather in Paris?"}});
    if (messages.size() >= count) break;
    if (turn % 3 == 1 && messages.size() + 2 <= count) {
      const std::string id = "call_" + std::to_string(turn);
      messages.push_back(
          {{"role", "assistant"},
           {"content", ""},  // as the server hands templates a null content
           {"tool_calls",
            {{{"id", id},
              {"type", "function"},
              {"function",
               {{"name", "tool_1"},
                {"arguments", {{"query", "weather"}, {"where", {{"city", "Paris"}}}}}}}}}}});
      messages.push_back({{"role", "tool"}, {"tool_call_id", id}, {"content", "Sunny, 21 C"}});
    } else {
      messages.push_back(
          {{"role", "assistant"}, {"content", "It is sunny in Paris today, about 21 degrees."}});
    }
    ++turn;
  }
  return messages;
}

double percentile(std::vector<double> sorted, double p) {
  if (sorted.empty()) return 0;
  const std::size_t at = std::min(sorted.size() - 1, static_cast<std::size_t>(p * sorted.size()));
  return sorted[at];
}

}  // namespace

CLI::App* add_bench_chat_template_command(CLI::App& bench, BenchChatTemplateOptions& options) {
  CLI::App* cmd = bench.add_subcommand(
      "chat-template",
      "Time a model's chat template rendering a made conversation with tools (the parsed "
      "template reused, as kvvm serve reuses it)");
  cmd->add_option("--model", options.model, "Model directory (its own template)")->required();
  cmd->add_option("--chat-template", options.chat_template,
                  "A built-in (chatml, llama3, qwen3) or a Jinja file instead of the model's");
  cmd->add_option("--messages", options.messages, "Messages of the conversation (default 20)")
      ->check(CLI::Range(1u, 100000u));
  cmd->add_option("--tools", options.tools, "Tools offered (default 10; 0: none)")
      ->check(CLI::Range(0u, 10000u));
  cmd->add_option("--renders", options.renders, "Renders timed (default 2000)")
      ->check(CLI::Range(1u, 100000000u));
  cmd->add_flag("--json", options.json, "Machine-readable report on stdout");
  return cmd;
}

int run_bench_chat_template(const BenchChatTemplateOptions& options, std::ostream& out,
                            std::ostream& err) {
  constexpr const char* kBench = "kvvm bench chat-template";
  Result<tokenizer::ChatRenderer> renderer =
      tokenizer::ChatRenderer::load(options.model, options.chat_template);
  if (!renderer.ok()) {
    err << kBench << ": " << renderer.status().message() << "\n";
    return kExitFailure;
  }
  tokenizer::ChatInput input;
  input.messages_json = made_messages(options.messages).dump();
  if (options.tools > 0) {
    ordered_json tools = ordered_json::array();
    for (std::uint32_t i = 0; i < options.tools; ++i) tools.push_back(made_tool(i));
    input.tools_json = tools.dump();
  }
  Result<std::string> first = renderer->render(input);
  if (!first.ok()) {
    err << kBench << ": " << renderer->origin() << ": " << first.status().message() << "\n";
    return kExitFailure;
  }
  err << kBench << ": " << renderer->origin() << ", " << options.messages << " messages, "
      << options.tools << " tools: a prompt of " << first->size() << " bytes; " << options.renders
      << " renders\n";
  std::vector<double> micros;
  micros.reserve(options.renders);
  double total = 0;
  for (std::uint32_t i = 0; i < options.renders; ++i) {
    const auto began = std::chrono::steady_clock::now();
    Result<std::string> text = renderer->render(input);
    const double us =
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - began).count();
    if (!text.ok() || text->size() != first->size()) {
      err << kBench << ": render " << i << " differs from the first\n";
      return kExitFailure;
    }
    micros.push_back(us);
    total += us;
  }
  std::sort(micros.begin(), micros.end());
  const double mean = total / static_cast<double>(micros.size());
  if (options.json) {
    ordered_json report = {{"model", options.model},
                           {"template", renderer->origin()},
                           {"messages", options.messages},
                           {"tools", options.tools},
                           {"input_bytes", input.messages_json.size() + input.tools_json.size()},
                           {"prompt_bytes", first->size()},
                           {"renders", options.renders},
                           {"p50_us", percentile(micros, 0.5)},
                           {"p99_us", percentile(micros, 0.99)},
                           {"mean_us", mean},
                           {"max_us", micros.back()}};
    out << report.dump(2) << "\n";
  } else {
    out << "chat template " << renderer->origin() << ": " << options.messages << " messages, "
        << options.tools << " tools, prompt " << first->size() << " bytes\n"
        << "render: p50 " << percentile(micros, 0.5) << " us, p99 " << percentile(micros, 0.99)
        << " us, mean " << mean << " us, max " << micros.back() << " us over " << options.renders
        << " renders\n";
  }
  return kExitOk;
}

}  // namespace kvvm::cli
