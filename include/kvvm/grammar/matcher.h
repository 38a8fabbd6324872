// Matcher: one sequence's place in a compiled grammar. It takes the tokens the sequence draws,
// says which tokens may come next as a bitmask over the vocabulary, rolls back (speculative
// decoding's refused drafts), and names the bytes every continuation must start with (a forced
// run, emitted without sampling). Not thread-safe: one sequence, one thread at a time (many
// matchers of one grammar may run on many threads).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kvvm/grammar/compiled_grammar.h"

namespace kvvm::grammar {

namespace detail {
class Stacks;
struct State;
}  // namespace detail

class Matcher {
 public:
  explicit Matcher(std::shared_ptr<const CompiledGrammar> grammar);
  ~Matcher();
  Matcher(Matcher&&) noexcept;
  Matcher& operator=(Matcher&&) noexcept;

  // Whether `token` may come next; when it may, the matcher moves past it. An end token may
  // come where the grammar has matched, and ends the matcher (ended()).
  bool accept_token(TokenId token);
  // The same for bytes (all or nothing), outside the vocabulary: tests, forced runs.
  bool accept_bytes(std::string_view bytes);
  // Bit t of `words` (a mask_words() span) set when token t may come next: the text tokens the
  // grammar allows, the end tokens where it has matched. Nothing once ended().
  void fill_mask(std::span<std::uint32_t> words);
  // Undoes the last `tokens` accepted tokens (accept_bytes calls count as one each). False,
  // and nothing undone, when fewer were accepted.
  bool rollback(std::uint32_t tokens);

  // The grammar has matched the output so far (an end token may come).
  bool can_end() const;
  // Nothing but an end token may come (the grammar matched and allows no more bytes).
  bool must_end() const;
  // An end token was accepted.
  bool ended() const { return ended_; }
  // The bytes every continuation starts with, up to the first place that offers a choice (or
  // where the grammar could end), at most `max_bytes`.
  std::string forced_bytes(std::size_t max_bytes = 256);
  // Tokens (and byte runs) accepted and not rolled back.
  std::uint32_t accepted() const;
  const CompiledGrammar& grammar() const { return *grammar_; }

 private:
  const detail::State& state() const;
  std::shared_ptr<const CompiledGrammar> grammar_;
  std::unique_ptr<detail::Stacks> stacks_;
  std::vector<detail::State> history_;  // [0]: before any token
  bool ended_ = false;
  std::uint32_t ended_at_ = 0;  // history size when the end token came
};

}  // namespace kvvm::grammar
