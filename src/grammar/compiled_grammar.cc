#include "kvvm/grammar/compiled_grammar.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <deque>
#include <span>
#include <string>
#include <thread>
#include <unordered_set>

#include "grammar/mask_cache.h"
#include "grammar/pushdown.h"
#include "grammar/token_walk.h"

namespace kvvm::grammar {

namespace {

// What exploring the grammar byte by byte, breadth first, meets in at most `max_states`
// states: the partial stacks on top of its stacks, and the whole stacks (top first).
struct Explored {
  std::vector<detail::PartialKey> partial;
  std::vector<std::vector<std::uint32_t>> whole;
};

Explored explore(const detail::Program& program, std::uint32_t max_states) {
  detail::Stacks stacks;
  detail::Runner runner(program, stacks);
  std::unordered_set<detail::PartialKey, detail::PartialKeyHash> keys;
  std::unordered_set<std::uint32_t> tops_seen;  // nodes: one whole stack each
  Explored out;
  std::unordered_set<std::string> seen;
  std::deque<detail::State> queue(1);
  runner.start(queue.front());
  const auto name = [](detail::State s) {
    std::sort(s.tops.begin(), s.tops.end());
    return std::string(reinterpret_cast<const char*>(s.tops.data()), s.tops.size() * 4);
  };
  seen.insert(name(queue.front()));
  detail::State next;
  std::uint32_t visited = 0;
  while (!queue.empty() && visited < max_states) {
    const detail::State state = std::move(queue.front());
    queue.pop_front();
    ++visited;
    for (const std::uint32_t top : state.tops) {
      const detail::PartialKey key = detail::partial_key(stacks, top);
      if (keys.insert(key).second) out.partial.push_back(key);
      if (tops_seen.insert(top).second) {
        detail::whole_key(stacks, top, out.whole.emplace_back());
      }
    }
    const ByteSet bytes = runner.next_bytes(state);
    for (unsigned b = 0; b < 256; ++b) {
      if (!bytes.has(static_cast<std::uint8_t>(b))) continue;
      runner.advance(state, static_cast<std::uint8_t>(b), next);
      if (next.tops.empty()) continue;
      if (seen.insert(name(next)).second) queue.push_back(next);
    }
  }
  return out;
}

// Runs `work(i)` for i in [0, count) on `threads` threads (this one among them).
template <typename Work>
void parallel_for(std::size_t count, unsigned threads, const Work& work) {
  std::atomic<std::size_t> next{0};
  const auto loop = [&] {
    for (std::size_t i = next++; i < count; i = next++) work(i);
  };
  std::vector<std::thread> pool;
  for (unsigned t = 1; t < threads; ++t) pool.emplace_back(loop);
  loop();
  for (std::thread& t : pool) t.join();
}

// The uncertain tokens a whole stack accepts, settled and remembered.
void settle_whole(const detail::Program& program, const Vocabulary& vocabulary,
                  detail::MaskCache& masks, std::span<const std::uint32_t> positions) {
  const auto mask = masks.partial(detail::partial_key(positions));
  if (mask->uncertain.empty() || masks.whole(positions)) return;
  thread_local detail::Stacks stacks;
  stacks.clear();
  std::uint32_t node = detail::kRoot;
  for (std::size_t i = positions.size(); i-- > 0;) node = stacks.node(positions[i], node);
  detail::Runner runner(program, stacks);
  detail::State start;
  start.tops.push_back(node);
  std::vector<TokenId> accepted;
  detail::WalkOut out;
  out.accepted = &accepted;
  detail::walk_tokens(runner, start, vocabulary, mask->uncertain, {}, out);
  masks.remember_whole(positions, std::move(accepted));
}

}  // namespace

Result<std::shared_ptr<const CompiledGrammar>> CompiledGrammar::compile(
    Grammar grammar, std::shared_ptr<const Vocabulary> vocabulary, const CompileOptions& options) {
  const auto began = std::chrono::steady_clock::now();
  if (Status status = grammar.check(options.limits); !status.ok()) return status;
  std::shared_ptr<CompiledGrammar> compiled(new CompiledGrammar());
  compiled->grammar_ = std::move(grammar);
  compiled->vocabulary_ = std::move(vocabulary);
  compiled->program_ =
      std::make_unique<detail::Program>(detail::Program::flatten(compiled->grammar_));
  compiled->masks_ = std::make_unique<detail::MaskCache>(
      *compiled->program_, *compiled->vocabulary_, options.cache_bytes);
  const Explored met = explore(*compiled->program_, options.explore_states);
  const unsigned threads = options.threads != 0
                               ? options.threads
                               : std::min(8u, std::max(1u, std::thread::hardware_concurrency()));
  std::atomic<std::uint64_t> uncertain{0};
  parallel_for(met.partial.size(), threads, [&](std::size_t i) {
    uncertain += compiled->masks_->partial(met.partial[i])->uncertain.size();
  });
  // Then the uncertain tokens of the whole stacks met, so that a sequence meets them settled.
  parallel_for(met.whole.size(), threads, [&](std::size_t i) {
    settle_whole(*compiled->program_, *compiled->vocabulary_, *compiled->masks_, met.whole[i]);
  });
  compiled->stats_.positions = compiled->program_->ops.size();
  compiled->stats_.partial_stacks = met.partial.size();
  compiled->stats_.whole_stacks = met.whole.size();
  compiled->stats_.uncertain_tokens = uncertain.load();
  compiled->stats_.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count();
  return std::shared_ptr<const CompiledGrammar>(std::move(compiled));
}

CompiledGrammar::~CompiledGrammar() = default;

std::uint64_t CompiledGrammar::cache_bytes() const { return masks_->bytes(); }

}  // namespace kvvm::grammar
