#include "kvvm/grammar/matcher.h"

#include <algorithm>

#include "grammar/mask_cache.h"
#include "grammar/pushdown.h"
#include "grammar/token_walk.h"

namespace kvvm::grammar {

using detail::Runner;
using detail::State;

Matcher::Matcher(std::shared_ptr<const CompiledGrammar> grammar)
    : grammar_(std::move(grammar)), stacks_(std::make_unique<detail::Stacks>()) {
  history_.emplace_back();
  Runner runner(grammar_->program(), *stacks_);
  runner.start(history_.back());
}

Matcher::~Matcher() = default;

const State& Matcher::state() const { return history_.back(); }
std::uint32_t Matcher::accepted() const { return static_cast<std::uint32_t>(history_.size() - 1); }
Matcher::Matcher(Matcher&&) noexcept = default;
Matcher& Matcher::operator=(Matcher&&) noexcept = default;

bool Matcher::accept_bytes(std::string_view bytes) {
  if (ended_) return false;
  Runner runner(grammar_->program(), *stacks_);
  State current = state();
  State next;
  for (const char c : bytes) {
    runner.advance(current, static_cast<std::uint8_t>(c), next);
    if (!next.alive()) return false;
    std::swap(current, next);
  }
  history_.push_back(std::move(current));
  return true;
}

bool Matcher::accept_token(TokenId token) {
  if (ended_) return false;
  const Vocabulary& vocabulary = grammar_->vocabulary();
  if (token < 0 || static_cast<std::size_t>(token) >= vocabulary.size()) return false;
  if (vocabulary.is_end(token)) {
    if (!state().accepting) return false;
    ended_ = true;
    ended_at_ = static_cast<std::uint32_t>(history_.size());
    history_.push_back(state());
    return true;
  }
  if (!vocabulary.is_text(token)) return false;
  return accept_bytes(vocabulary.bytes(token));
}

void Matcher::fill_mask(std::span<std::uint32_t> words) {
  const Vocabulary& vocabulary = grammar_->vocabulary();
  KVVM_CHECK(words.size() >= vocabulary.mask_words(), "a mask of too few words");
  std::fill(words.begin(), words.end(), 0u);
  if (ended_) return;
  detail::MaskCache& masks = grammar_->masks();
  Runner runner(grammar_->program(), *stacks_);
  thread_local std::vector<detail::PartialKey> seen;
  thread_local std::vector<std::uint32_t> positions;
  thread_local std::vector<TokenId> accepted;
  seen.clear();
  for (const std::uint32_t top : state().tops) {
    const detail::PartialKey key = detail::partial_key(*stacks_, top);
    const auto mask = masks.partial(key);
    if (std::find(seen.begin(), seen.end(), key) == seen.end()) {
      seen.push_back(key);
      mask->or_into(words);
    }
    if (mask->uncertain.empty()) continue;
    // The uncertain tokens depend on the frames below the key: settle them on this stack.
    detail::whole_key(*stacks_, top, positions);
    auto known = masks.whole(positions);
    if (!known) {
      accepted.clear();
      State start;
      start.tops.push_back(top);
      detail::WalkOut out;
      out.accepted = &accepted;
      detail::walk_tokens(runner, start, vocabulary, mask->uncertain, {}, out);
      masks.remember_whole(positions, accepted);
      for (const TokenId t : accepted) words[static_cast<std::size_t>(t) >> 5] |= 1u << (t & 31);
      continue;
    }
    for (const TokenId t : *known) words[static_cast<std::size_t>(t) >> 5] |= 1u << (t & 31);
  }
  if (state().accepting) {
    for (const TokenId t : vocabulary.ends()) {
      words[static_cast<std::size_t>(t) >> 5] |= 1u << (t & 31);
    }
  }
}

bool Matcher::rollback(std::uint32_t tokens) {
  if (tokens > accepted()) return false;
  history_.resize(history_.size() - tokens);
  if (ended_ && history_.size() <= ended_at_) ended_ = false;
  return true;
}

bool Matcher::can_end() const { return !ended_ && state().accepting; }

bool Matcher::must_end() const { return !ended_ && state().accepting && state().tops.empty(); }

std::string Matcher::forced_bytes(std::size_t max_bytes) {
  std::string out;
  if (ended_) return out;
  Runner runner(grammar_->program(), *stacks_);
  State current = state();
  State next;
  while (out.size() < max_bytes && !current.accepting) {
    const ByteSet bytes = runner.next_bytes(current);
    if (bytes.count() != 1) break;
    std::uint8_t b = 0;
    while (!bytes.has(b)) ++b;
    runner.advance(current, b, next);
    out += static_cast<char>(b);
    std::swap(current, next);
  }
  return out;
}

}  // namespace kvvm::grammar
