// `kvvm bench engine --offline`: throughput on the terms of TensorRT-LLM's `trtllm-bench
// throughput`. Every request is submitted at once with fixed input and output lengths (or a
// dataset file's, one request a line), random prompt ids, greedy, end tokens ignored so each
// answer runs to its output length; the engine runs until the last answer ends. Reported over
// that whole run (submit of the first to the end of the last): output tokens/s, total tokens/s
// (prompts and outputs), requests/s, and per request the latency (submit to last token), the
// time to its first token and its time per output token after it. A warm-up of a few requests
// (graph capture, first-touch costs) runs first through the same engine and is excluded.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "bench/drivers/engine/engine_report.h"
#include "kvvm/base/status.h"
#include "kvvm/engine/kv_space.h"
#include "kvvm/engine/speculative.h"
#include "kvvm/model/model.h"

namespace kvvm::cli {

// One offline run's requests: (input tokens, output tokens) each.
struct OfflineSpec {
  std::string label;  // "128/128", or the dataset file's name
  std::vector<std::pair<std::uint32_t, std::uint32_t>> lengths;
};

// "128/128,1000/1000": each pair `requests` times, one spec a pair. InvalidArgument naming the
// bad entry (`flag` names the option).
Result<std::vector<OfflineSpec>> parse_offline_lengths(const std::string& text,
                                                       std::uint64_t requests,
                                                       const std::string& flag);
// A dataset file: one request a line, its input and output lengths separated by a space, a
// comma or a slash; blank lines and lines starting with '#' skipped. InvalidArgument naming the
// file and line of a bad one, or an empty file.
Result<OfflineSpec> read_offline_dataset(const std::string& path);

struct OfflineParams {
  // Sequences running at once; 0: as many as the KV budget holds at the spec's longest request
  // (input + output), at most `max_chunks` and the requests.
  std::uint32_t max_running = 0;
  std::uint32_t max_chunks = 0;  // the model's ModelLimits::max_chunks
  std::uint32_t warmup = 8;      // requests run first and excluded (at most the spec's)
  std::uint64_t seed = 1;
  bool graphs = true;                      // CUDA decode graphs
  engine::SpeculativeOptions speculative;  // off unless num_speculative_tokens > 0
  // With method kDraftModel: the draft (its KV space made per run beside the model's, as
  // kit/speculative_flag.h's draft_kv_options sizes it).
  model::Model* draft = nullptr;
};

Result<OfflineRun> measure_offline(model::Model& model, const engine::KvSpaceOptions& kv,
                                   const OfflineSpec& spec, const OfflineParams& params);

}  // namespace kvvm::cli
