#include "kvvm/grammar/compiled_grammar.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <deque>
#include <string>
#include <thread>
#include <unordered_set>

#include "grammar/mask_cache.h"
#include "grammar/pushdown.h"

namespace kvvm::grammar {

namespace {

// The partial stacks of the states met exploring the grammar byte by byte, breadth first, at
// most `max_states` states.
std::vector<detail::PartialKey> explore(const detail::Program& program,
                                        std::uint32_t max_states) {
  detail::Stacks stacks;
  detail::Runner runner(program, stacks);
  std::unordered_set<detail::PartialKey, detail::PartialKeyHash> keys;
  std::vector<detail::PartialKey> ordered;
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
      if (keys.insert(key).second) ordered.push_back(key);
    }
    const ByteSet bytes = runner.next_bytes(state);
    for (unsigned b = 0; b < 256; ++b) {
      if (!bytes.has(static_cast<std::uint8_t>(b))) continue;
      runner.advance(state, static_cast<std::uint8_t>(b), next);
      if (next.tops.empty()) continue;
      if (seen.insert(name(next)).second) queue.push_back(next);
    }
  }
  return ordered;
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
  const std::vector<detail::PartialKey> keys = explore(*compiled->program_, options.explore_states);
  unsigned threads = options.threads != 0 ? options.threads
                                          : std::min(8u, std::max(1u, std::thread::hardware_concurrency()));
  threads = std::max(1u, std::min<unsigned>(threads, static_cast<unsigned>(keys.size())));
  std::atomic<std::size_t> next{0};
  std::atomic<std::uint64_t> uncertain{0};
  const auto work = [&] {
    for (std::size_t i = next++; i < keys.size(); i = next++) {
      uncertain += compiled->masks_->partial(keys[i])->uncertain.size();
    }
  };
  std::vector<std::thread> pool;
  for (unsigned t = 1; t < threads; ++t) pool.emplace_back(work);
  work();
  for (std::thread& t : pool) t.join();
  compiled->stats_.positions = compiled->program_->ops.size();
  compiled->stats_.partial_stacks = keys.size();
  compiled->stats_.uncertain_tokens = uncertain.load();
  compiled->stats_.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count();
  return std::shared_ptr<const CompiledGrammar>(std::move(compiled));
}

CompiledGrammar::~CompiledGrammar() = default;

std::uint64_t CompiledGrammar::cache_bytes() const { return masks_->bytes(); }

}  // namespace kvvm::grammar
