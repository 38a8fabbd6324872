// `kvvm bench tokenizer-load`: how long Tokenizer::load takes on a large tokenizer.json and
// where the time goes (reading, JSON with the vocabulary's table, merges, components and their
// regexes, by-id tables, added tokens, tokenizer_config.json, freeing). By default the file is
// made here, deterministically: a byte-level BPE the size of Qwen2's (150,000 tokens beyond the
// 256 byte characters, one merge per token, 22 special tokens, NFC and Qwen2's split pattern;
// about 9 MB), so no large file is committed; --file loads a real one instead.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>

namespace CLI {
class App;
}  // namespace CLI

namespace kvvm::cli {

struct BenchTokenizerLoadOptions {
  std::string file;                // --file: load this tokenizer.json instead of a made one
  std::uint32_t tokens = 150'000;  // --tokens: made tokens beyond the byte alphabet (and merges)
  std::uint32_t loads = 5;         // --loads: loads timed
  std::string keep;                // --keep PATH: write the made file there and keep it
  bool json = false;
};

// Adds `tokenizer-load` under the existing `bench` subcommand.
CLI::App* add_bench_tokenizer_load_command(CLI::App& bench, BenchTokenizerLoadOptions& options);

// The report (text or --json) on `out`, progress on `err`; kExitFailure when a load failed.
int run_bench_tokenizer_load(const BenchTokenizerLoadOptions& options, std::ostream& out,
                             std::ostream& err);

}  // namespace kvvm::cli
