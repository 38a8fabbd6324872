// `kvvm bench decode`: the CUDA decode attention kernel over an arena on the CUDA driver
// (bench/drivers/attention/cuda_support.h), for eight shapes an engine meets, in every layout, and
// the device-to-device copy bandwidth of the same run as the ceiling. Default shapes (batch,
// context, query heads / KV heads, head dim): 1,32768,32/8,128  16,4096,32/8,128
// 8,16384,32/8,128  64,4096,32/8,128  256,2048,32/8,128  64,2048,64/8,128  32,8192,14/2,64
// 128,1024,14/2,64 (one long sequence; Llama-3-8B-like batches; a 64-query-head model; Qwen-
// like 14/2 heads of 64 dims).
//
// Per shape, fp16 (or --element bf16; --kv-dtype fp8 for an e4m3 cache read with those
// activations): median time of one decode launch (events around back-to-back launches, after a
// warm-up), the effective KV bytes read per second (batch x context x 2 x KV heads x head dim x
// the cache's element bytes over that time),
// its share of the copy bandwidth, and, when a PyTorch baseline is given
// (bench/sdpa_baseline.py --json), the ratio PyTorch time / ours (> 1: we are faster).
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

namespace CLI {
class App;
}  // namespace CLI

namespace kvvm::cli {

struct DecodeShape {
  std::uint32_t batch = 0;
  std::uint32_t context = 0;
  std::uint32_t qo_heads = 0;
  std::uint32_t kv_heads = 0;
  std::uint32_t head_dim = 0;
};

struct BenchDecodeOptions {
  int device = 0;
  std::vector<std::string> shapes;  // "batch,context,qo/kv,dim"; empty: kDefaultShapes
  std::string layout = "all";       // head-major, seq-major, token-major or all
  std::uint32_t layers = 2;         // the cache holds this many layers; layer 1 is read
  std::uint32_t iterations = 20;    // launches per timed sample
  std::uint32_t samples = 15;
  std::uint32_t chunk_tokens = 0;  // decode split size; 0: planned
  std::string element = "fp16";    // fp16 or bf16: queries, outputs (and the cache unless fp8)
  std::string kv_dtype;            // "", the element's, or fp8 (e4m3 at scale 1)
  std::string baseline;            // JSON from bench/sdpa_baseline.py
  std::string json_out;            // write the results here as JSON too
};

// Adds `decode` under the existing `bench` subcommand.
CLI::App* add_bench_decode_command(CLI::App& bench, BenchDecodeOptions& options);

// "32,8192,14/2,64" -> shape; InvalidArgument-style message in `error` when malformed.
bool parse_decode_shape(const std::string& text, DecodeShape& shape, std::string& error);

int run_bench_decode(const BenchDecodeOptions& options, std::ostream& out, std::ostream& err);

}  // namespace kvvm::cli
