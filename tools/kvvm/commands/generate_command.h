// `kvvm generate`: one prompt through a Hugging Face checkpoint on the CPU or a GPU, the text
// streamed to stdout as tokens arrive (or one JSON object at the end with --json). With
// --json-schema, --json-object, --regex, --grammar or --choice the text is constrained to match
// (the server's grammars: kvvm/grammar/constraint.h), compiled before the model runs. It runs the
// batched engine (through engine::generate) like `kvvm serve`: CUDA graphs, the same checks.
//
// Why the checks before the loaders: a user who mistyped a directory should hear which path
// is missing, not a parser's complaint about the first file it tried, so the directory,
// config.json, tokenizer.json and the weights are each looked for and named first.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <optional>
#include <string>
#include <vector>

#include "kit/weight_flags.h"
#include "kvvm/base/dtype.h"

namespace CLI {
class App;
}  // namespace CLI

namespace kvvm::cli {

struct GenerateOptions {
  std::string model_dir;              // --model DIR (required)
  std::optional<std::string> prompt;  // --prompt TEXT: encoded with the special tokens
  std::optional<std::string> chat;    // --chat TEXT: one user message through the template
  std::optional<std::string> system;  // --system TEXT: a system message before it
  std::string chat_template;          // --chat-template NAME|FILE; empty: the directory's template
  std::optional<std::string> prompt_ids;    // hidden --prompt-ids 1,2,3: exact ids (tests)
  std::optional<std::uint64_t> max_tokens;  // unset: 128, cut to the context with a note
  double temperature = 0;
  std::uint64_t top_k = 0;
  double top_p = 1;
  double min_p = 0;
  std::uint64_t seed = 0;
  std::string backend = "auto";  // auto | cpu | cuda
  std::string layout = "token-major";
  std::uint64_t max_context = 0;  // 0: the config's max_position_embeddings
  bool json = false;
  bool ignore_eos = false;  // benchmarks: generate exactly --max-tokens tokens
  bool no_graphs = false;   // CUDA: decode steps run kernel by kernel (graphs are the default)
  std::string speculative_config;        // --speculative-config JSON; empty: off
  WeightFlags weights;                   // --weight-budget, --ring-slots, --load-format
  DType kv_dtype = DType::kUnset;        // --kv-dtype; kUnset: the KV space's default
  std::string kv_scales = "checkpoint";  // --kv-scales: checkpoint or calibrate
  // Structured output, one at most: the generated text must match it.
  std::optional<std::string> json_schema_file;  // --json-schema FILE
  bool json_object = false;                     // --json-object
  std::optional<std::string> regex;             // --regex R
  std::optional<std::string> grammar_file;      // --grammar FILE (GBNF)
  std::vector<std::string> choices;             // --choice A,B,...
  std::string json_whitespace = "compact";      // --json-whitespace compact|flexible
};

inline constexpr std::uint64_t kDefaultMaxTokens = 128;

// Adds the `generate` subcommand to `app`, bound to `options` (which must outlive the parse).
CLI::App* add_generate_command(CLI::App& app, GenerateOptions& options);

// The whole subcommand: generated text (or the JSON object) to `out`, notes and errors to
// `err`. kExitUsage for what the command line got wrong (a missing directory or file, a
// prompt beyond the context, an unknown template), kExitFailure for a failure at run time.
int run_generate(const GenerateOptions& options, std::ostream& out, std::ostream& err);

}  // namespace kvvm::cli
