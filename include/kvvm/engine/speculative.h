// Speculative decoding's options, which the engine and generate() take.
#pragma once

#include <cstdint>
#include <string>

#include "kvvm/base/status.h"

namespace kvvm::model {
class Model;
}  // namespace kvvm::model

namespace kvvm::engine {

class KvSpace;

// Where the proposals come from.
enum class SpeculativeMethod : std::uint8_t {
  kNgram,       // prompt lookup (vLLM's "ngram")
  kDraftModel,  // a smaller checkpoint of the same vocabulary (vLLM's "draft_model")
};

// Speculative decoding. By n-gram prompt lookup (vLLM's "ngram" method): a decoding sequence
// whose last n tokens (prompt_lookup_min <= n <= prompt_lookup_max, the longest that matches)
// also occur earlier in it proposes the up to num_speculative_tokens tokens that followed them
// there, and the step verifies them as that many more single-token rows of the sequence at the
// next positions (the decode kernels and graphs as they are, attention causal because every
// row's K / V is appended before any row attends). Each row draws with the request's own
// sampler and output counter, so a proposal is kept while it equals the draw at its position
// and the first draw that differs is the step's last token: the output is token for token what
// decoding one token a step gives, at any temperature (for a point-mass proposal this is
// rejection sampling exactly). By a draft model ("draft_model"): the draft proposes its greedy
// next k tokens (src/engine/draft_proposer.h), verified the same way. Rejected rows are a length
// change: their K / V is overwritten by the next tokens, the windows committed for them stay with
// the sequence. A constrained request's proposals stop at the first its grammar refuses (a draft
// model draws them through the grammar's masks). Not speculated: a grammar still waiting for its
// trigger, requests opted out, steps where disable_by_batch_size or more sequences are decoding.
struct SpeculativeOptions {
  SpeculativeMethod method = SpeculativeMethod::kNgram;
  std::uint32_t num_speculative_tokens = 0;  // k, at most 64; 0: off
  std::uint32_t prompt_lookup_min = 5;       // vLLM's defaults
  std::uint32_t prompt_lookup_max = 5;
  // Decoding sequences from which a step does not speculate (its rows cost more than the
  // tokens they save once the step is no longer bound by reading the weights); 0: never off.
  std::uint32_t disable_by_batch_size = 0;
  // kDraftModel: the checkpoint's directory, as the config named it (what loads it is the
  // caller's: EngineOptions::draft takes the loaded model).
  std::string draft_model;
  bool enabled() const { return num_speculative_tokens > 0; }
};

// A loaded draft model and the KV space it runs on (not owned; both outlive the engine). The
// space is the draft's alone: its geometry is the draft's, and putting it under the target's
// governor (KvSpaceOptions::governor) makes both caches share one device budget.
struct DraftModel {
  model::Model* model = nullptr;
  KvSpace* kv = nullptr;
};

// InvalidArgument naming the field: num_speculative_tokens over 64, prompt_lookup_min of 0,
// prompt_lookup_max over 1024, or min > max (when enabled, n-gram lookup).
Status check_speculative_options(const SpeculativeOptions& options);

// vLLM's --speculative-config JSON: {"method": "ngram", "num_speculative_tokens": k,
// "prompt_lookup_max": M, "prompt_lookup_min": m, "disable_by_batch_size": B}, one of the
// lookup sizes alone setting both (vLLM's rule); or {"method": "draft_model", "model": DIR,
// "num_speculative_tokens": k, "disable_by_batch_size": B}, "model" alone implying the method
// (vLLM infers it so). InvalidArgument naming the key for another method (EAGLE heads are not
// built), an unknown key, a key of the other method or a bad value.
Result<SpeculativeOptions> parse_speculative_config(const std::string& json);

}  // namespace kvvm::engine
