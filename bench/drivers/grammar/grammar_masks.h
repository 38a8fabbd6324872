// `kvvm bench grammar`: what structured output costs on the host, over a real vocabulary: each
// constraint of a ladder (JSON Schemas from a flat object to nested ones with $ref and anyOf, any
// JSON object, a regular expression, a GBNF grammar, a list of choices) compiled, then walked
// token by token (each next token drawn uniformly among those the mask allows), every mask
// timed: p50, p90, p99 and the worst; and beside them the brute-force mask (every token's bytes
// run through the automaton) on a few of the same states, to show the gain.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>

namespace CLI {
class App;
}  // namespace CLI

namespace kvvm::cli {

struct BenchGrammarOptions {
  std::string tokenizer;       // --tokenizer: a tokenizer.json (required)
  std::string end_token;       // --end-token: the end token's text; empty: found in the file
  std::uint32_t walks = 20;    // --walks: walks per constraint
  std::uint32_t tokens = 200;  // --tokens: tokens per walk at most
  std::uint32_t brute = 3;     // --brute-force: states also masked by brute force
  std::uint64_t seed = 1;      // --seed
  std::string only;            // --only NAME: one constraint of the ladder
  bool json = false;
};

// Adds `grammar` under the existing `bench` subcommand.
CLI::App* add_bench_grammar_command(CLI::App& bench, BenchGrammarOptions& options);

// The report (text or --json) on `out`, progress on `err`.
int run_bench_grammar(const BenchGrammarOptions& options, std::ostream& out, std::ostream& err);

}  // namespace kvvm::cli
