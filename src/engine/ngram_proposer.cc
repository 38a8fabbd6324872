// The n-gram proposer: one Knuth-Morris-Pratt scan of the reversed sequence (ngram_proposer.h).
#include "ngram_proposer.h"

#include <algorithm>
#include <array>
#include <string>

namespace kvvm::engine {

Status check_ngram_options(const NgramOptions& o) {
  if (o.num_speculative_tokens == 0 || o.num_speculative_tokens > kNgramMaxSpeculativeTokens) {
    return Status::InvalidArgument("ngram num_speculative_tokens " +
                                   std::to_string(o.num_speculative_tokens) + ": outside [1, " +
                                   std::to_string(kNgramMaxSpeculativeTokens) + "]");
  }
  if (o.prompt_lookup_min == 0) {
    return Status::InvalidArgument("ngram prompt_lookup_min 0: an n-gram has at least one token");
  }
  if (o.prompt_lookup_max > kNgramMaxLookup) {
    return Status::InvalidArgument("ngram prompt_lookup_max " +
                                   std::to_string(o.prompt_lookup_max) + ": over " +
                                   std::to_string(kNgramMaxLookup));
  }
  if (o.prompt_lookup_min > o.prompt_lookup_max) {
    return Status::InvalidArgument("ngram prompt_lookup_min " +
                                   std::to_string(o.prompt_lookup_min) + " > prompt_lookup_max " +
                                   std::to_string(o.prompt_lookup_max));
  }
  return Status::Ok();
}

std::size_t propose_ngram(std::span<const std::int32_t> tokens, const NgramOptions& options,
                          std::span<std::int32_t> out) {
  const std::size_t len = tokens.size();
  const std::size_t k = std::min<std::size_t>(options.num_speculative_tokens, out.size());
  // A match of min tokens must end before the last token: at least min + 1 tokens.
  if (k == 0 || len <= options.prompt_lookup_min) return 0;
  const auto r = [&](std::size_t j) { return tokens[len - 1 - j]; };  // the sequence reversed
  // The pattern r[0, m): no match is longer than the text r[1, len).
  const std::size_t m = std::min<std::size_t>(options.prompt_lookup_max, len - 1);
  // fail[j]: the longest proper prefix of r[0, j] that is also its suffix (KMP's failure
  // function), where a scan goes on after a mismatch or a full match without moving back.
  std::array<std::uint32_t, kNgramMaxLookup> fail;
  fail[0] = 0;
  std::size_t q = 0;
  for (std::size_t j = 1; j < m; ++j) {
    while (q > 0 && r(j) != r(q)) q = fail[q - 1];
    if (r(j) == r(q)) ++q;
    fail[j] = static_cast<std::uint32_t>(q);
  }
  // The text: after r[i], q is the longest prefix of the pattern ending at r[i], so the sequence's
  // last q tokens (q <= max) occur ending just before tokens[len - 1 - i + q].
  std::size_t best = 0, best_at = 0;
  q = 0;
  for (std::size_t i = 1; i < len; ++i) {
    if (q == m) q = fail[m - 1];  // a full match: go on from its longest border
    while (q > 0 && r(i) != r(q)) q = fail[q - 1];
    if (r(i) == r(q)) ++q;
    // Ties go to the larger i, the occurrence furthest back in r: the earliest in the sequence.
    if (q > 0 && q >= best) {
      best = q;
      best_at = i;
    }
  }
  if (best < options.prompt_lookup_min) return 0;
  const std::size_t start = len - 1 - best_at + best;  // the token after the occurrence
  const std::size_t count = std::min(k, len - start);
  std::copy_n(tokens.begin() + static_cast<std::ptrdiff_t>(start), count, out.begin());
  return count;
}

}  // namespace kvvm::engine
