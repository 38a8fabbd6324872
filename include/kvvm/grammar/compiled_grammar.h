// CompiledGrammar: a checked grammar bound to a vocabulary, with what makes a token mask cheap:
// for each partial stack a sequence's state can have on top (its top few frames), the tokens it
// accepts whatever lies below, the tokens it refuses whatever lies below, and the few that depend
// on what lies below ("uncertain": their bytes run off the partial stack's bottom). A mask is then
// the union of the accepted sets of the state's partial stacks, plus those of the uncertain
// tokens that its whole stacks accept (remembered per whole stack too). Shared by every
// sequence that uses the grammar; safe to use from several threads.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kvvm/base/status.h"
#include "kvvm/grammar/grammar.h"
#include "kvvm/grammar/vocabulary.h"

namespace kvvm::grammar {

namespace detail {
struct Program;
class MaskCache;
}  // namespace detail

struct CompileOptions {
  GrammarLimits limits;
  // Stacks found by exploring the grammar byte by byte at compile time, at most this many states
  // visited: the masks of their partial stacks, and which uncertain tokens each whole stack
  // accepts, are computed then (on `threads` threads), so that the first sequence does not pay
  // for them. The rest are computed when first met.
  std::uint32_t explore_states = 4096;
  unsigned threads = 0;  // 0: the hardware's, at most 8
  // Bytes the masks of one grammar may hold; past it, a mask is computed and not kept.
  std::uint64_t cache_bytes = std::uint64_t{256} << 20;
};

struct CompileStats {
  double seconds = 0;                  // check, flattening, exploration and the masks computed then
  std::uint64_t positions = 0;         // the flattened grammar's positions
  std::uint64_t partial_stacks = 0;    // masks computed at compile time
  std::uint64_t whole_stacks = 0;      // whole stacks met, their uncertain tokens settled then
  std::uint64_t uncertain_tokens = 0;  // summed over those masks
};

class CompiledGrammar {
 public:
  // InvalidArgument or ResourceExhausted from Grammar::check(options.limits).
  static Result<std::shared_ptr<const CompiledGrammar>> compile(
      Grammar grammar, std::shared_ptr<const Vocabulary> vocabulary,
      const CompileOptions& options = {});
  ~CompiledGrammar();
  CompiledGrammar(const CompiledGrammar&) = delete;
  CompiledGrammar& operator=(const CompiledGrammar&) = delete;

  const Grammar& grammar() const { return grammar_; }
  const Vocabulary& vocabulary() const { return *vocabulary_; }
  const CompileStats& stats() const { return stats_; }
  // Bytes the mask caches hold now.
  std::uint64_t cache_bytes() const;

  // For the matcher (matcher.cc).
  const detail::Program& program() const { return *program_; }
  detail::MaskCache& masks() const { return *masks_; }

 private:
  CompiledGrammar() = default;
  Grammar grammar_;
  std::shared_ptr<const Vocabulary> vocabulary_;
  std::unique_ptr<detail::Program> program_;
  std::unique_ptr<detail::MaskCache> masks_;
  CompileStats stats_;
};

}  // namespace kvvm::grammar
