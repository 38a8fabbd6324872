// `kvvm bench prefill`: the CUDA causal prefill attention kernel over an arena on the CUDA
// driver (bench/drivers/attention/cuda_support.h), beside PyTorch SDPA when a baseline is given.
//
// Rows (default): full causal prefills of 1024, 4096 and 16384 tokens (start 0), and a chunk of
// 512 query tokens at start 4096 (query row i at position 4096 + i reads keys [0, 4097 + i);
// the K/V of the prefix and of the chunk are appended first, as an engine does). --case T and
// --chunk P:T replace them. Heads 32/8 of 128 dims, fp16, token-major by default.
//
// Per row: the median time of one launch (events around --iterations back-to-back launches,
// --samples times, after a warm-up); TFLOP/s counting the causal work exactly: query row i sees
// P + i + 1 keys and costs two matrix products of 2 flops per multiply-add over the query heads
// and head dim, so a row costs 4 x Hq x D x (T x P + T (T + 1) / 2) flops; tokens per second
// (T over the time); and, with --baseline (bench/sdpa_baseline.py --json, its "prefill_rows"
// keyed "T@P,Hq/Hkv,D"), PyTorch's time, its TFLOP/s on the same flop count, and the ratio
// PyTorch time / ours (> 1: we are faster).
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

namespace CLI {
class App;
}  // namespace CLI

namespace kvvm::cli {

// T query tokens at positions [start, start + T) of one sequence.
struct PrefillCase {
  std::uint32_t start = 0;
  std::uint32_t tokens = 0;
};

struct BenchPrefillOptions {
  int device = 0;
  std::vector<std::uint32_t> cases;  // --case T: full prefills (start 0)
  std::vector<std::string> chunks;   // --chunk P:T; with cases empty too: the default rows
  std::string heads = "32/8";        // query heads / KV heads
  std::uint32_t head_dim = 128;
  std::string layout = "token-major";  // head-major, seq-major, token-major or all
  std::string element = "fp16";        // fp16 or bf16
  std::uint32_t layers = 2;            // the cache holds this many layers; layer 1 is read
  std::uint32_t iterations = 5;        // launches per timed sample
  std::uint32_t samples = 9;
  std::string baseline;  // JSON from bench/sdpa_baseline.py
  std::string json_out;  // write the results here as JSON too
};

// The longest sequence (start + tokens) a row may ask for.
inline constexpr std::uint64_t kMaxPrefillSequence = std::uint64_t{1} << 20;

// Adds `prefill` under the existing `bench` subcommand.
CLI::App* add_bench_prefill_command(CLI::App& bench, BenchPrefillOptions& options);

// "4096:512" -> start 4096, 512 tokens; a message naming the text in `error` when malformed
// (not two decimal numbers, no tokens, or start + tokens beyond kMaxPrefillSequence).
bool parse_prefill_chunk(const std::string& text, PrefillCase& chunk, std::string& error);

// The causal work of a row: 4 x qo_heads x head_dim x (sum over query rows of keys seen).
double prefill_flops(const PrefillCase& row, std::uint32_t qo_heads, std::uint32_t head_dim);

// "T@P,Hq/Hkv,D": the key of a row in the baseline's "prefill_rows".
std::string prefill_key(const PrefillCase& row, std::uint32_t qo_heads, std::uint32_t kv_heads,
                        std::uint32_t head_dim);

int run_bench_prefill(const BenchPrefillOptions& options, std::ostream& out, std::ostream& err);

}  // namespace kvvm::cli
