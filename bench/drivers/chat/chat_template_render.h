// `kvvm bench chat-template`: what rendering a model's own chat template costs per request, the
// parsed template reused as the server reuses it: a made conversation (a system prompt, user
// and assistant turns, assistant tool calls and tool results; --messages in all) with --tools
// tools whose parameters are nested JSON Schemas, rendered --renders times; p50, p99, mean and
// the worst, in microseconds, and the prompt's length.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>

namespace CLI {
class App;
}  // namespace CLI

namespace kvvm::cli {

struct BenchChatTemplateOptions {
  std::string model;             // --model DIR (its own template, or --chat-template)
  std::string chat_template;     // --chat-template NAME|FILE
  std::uint32_t messages = 20;   // --messages
  std::uint32_t tools = 10;      // --tools
  std::uint32_t renders = 2000;  // --renders
  bool json = false;
};

// Adds `chat-template` under the existing `bench` subcommand.
CLI::App* add_bench_chat_template_command(CLI::App& bench, BenchChatTemplateOptions& options);

// The report (text or --json) on `out`, progress on `err`; kExitFailure when a render failed.
int run_bench_chat_template(const BenchChatTemplateOptions& options, std::ostream& out,
                            std::ostream& err);

}  // namespace kvvm::cli
