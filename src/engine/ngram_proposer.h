// The n-gram proposer of speculative decoding ("prompt lookup decoding", vLLM's `ngram` method):
// no draft model, the sequence itself is the draft. If the sequence's last n tokens (prompt then
// output) also occur earlier in it, the tokens that followed them there are a good guess for what
// comes next; the engine then verifies the guesses in one forward and keeps those the model
// agrees with.
//
// Semantics, as vLLM v1 defines them (vllm/v1/spec_decode/ngram_proposer.py and
// vllm/config/speculative.py):
//   - n ranges over [prompt_lookup_min, prompt_lookup_max]; the longest n whose suffix occurs
//     earlier wins. An earlier occurrence may overlap the suffix itself but must end before the
//     last token, so at least one token follows it.
//   - Among the occurrences of that n, the FIRST one (the earliest in the sequence) is taken, not
//     the most recent. A match is measured only up to prompt_lookup_max: an earlier occurrence of
//     the last max tokens beats a later one whose match would run longer.
//   - The proposal is the up to num_speculative_tokens tokens that followed the occurrence,
//     fewer when the sequence ends first; none when no n in the range matches (always so for a
//     sequence of prompt_lookup_min tokens or fewer).
//   - vLLM's defaults: prompt_lookup_min = prompt_lookup_max = 5 when neither is given; when only
//     one is given the other takes its value (min = max). num_speculative_tokens has no default
//     there (it is required), so 0 here is refused rather than guessed.
//
// How: read backwards (r, r[0] the last token), the last n tokens are r's first n, and an earlier
// occurrence of them is an occurrence of r's first n tokens further along r. So it is one search:
// a pattern (r's first prompt_lookup_max tokens) in a text (r from position 1). One
// Knuth-Morris-Pratt scan gives, at every text position, the longest prefix of the pattern that
// ends there, i.e. the match for every n up to max at once. O(len + max) time per call, O(max)
// stack memory, no allocation: a 32k-token context is one linear pass, not one per n or per
// earlier position.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "kvvm/base/status.h"

namespace kvvm::engine {

// Refused above these: a verification forward of more than 64 guesses, or an n-gram of more than
// 1024 tokens, is a configuration mistake, not a tuning choice.
inline constexpr std::uint32_t kNgramMaxSpeculativeTokens = 64;
inline constexpr std::uint32_t kNgramMaxLookup = 1024;

struct NgramOptions {
  std::uint32_t num_speculative_tokens = 0;  // k, the most tokens proposed per step; required
  std::uint32_t prompt_lookup_min = 5;       // the shortest n-gram that counts as a match
  std::uint32_t prompt_lookup_max = 5;       // the longest n-gram looked for
};

// InvalidArgument naming the bad value: num_speculative_tokens outside [1, 64], prompt_lookup_min
// of 0, prompt_lookup_max over 1024, or min > max.
Status check_ngram_options(const NgramOptions& options);

// Writes the proposal for `tokens` (the sequence's prompt then output) to the front of `out` and
// returns how many it wrote: at most min(num_speculative_tokens, out.size()), 0 when nothing
// matches. A caller limits guesses to the room left in the context (vLLM's max_model_len cap) by
// passing a shorter `out`.
// REQUIRES: check_ngram_options(options).ok().
std::size_t propose_ngram(std::span<const std::int32_t> tokens, const NgramOptions& options,
                          std::span<std::int32_t> out);

}  // namespace kvvm::engine
