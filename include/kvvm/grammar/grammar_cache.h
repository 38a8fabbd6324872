// GrammarCache: compiled grammars kept by their constraint's content, so that a schema sent with
// every request is compiled once.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "kvvm/base/status.h"
#include "kvvm/grammar/compiled_grammar.h"
#include "kvvm/grammar/constraint.h"

namespace kvvm::grammar {

struct GrammarCacheOptions {
  std::uint32_t entries = 64;  // compiled grammars kept, the least recently used dropped first
  CompileOptions compile;
};

struct GrammarCacheStats {
  std::uint64_t hits = 0, compiled = 0, refused = 0;  // refused: the constraint's error
  double compile_seconds = 0;                         // summed over every compile
  std::uint32_t entries = 0;
  std::uint64_t bytes = 0;  // the kept grammars' mask caches
};

class GrammarCache {
 public:
  GrammarCache(std::shared_ptr<const Vocabulary> vocabulary, GrammarCacheOptions options = {});

  // The constraint's compiled grammar: from the cache, or compiled on the calling thread (a
  // request's own, never the engine's step). Concurrent calls for one constraint compile it
  // once; the others wait for it. Errors are not kept.
  Result<std::shared_ptr<const CompiledGrammar>> get(const Constraint& constraint);
  GrammarCacheStats stats() const;
  const std::shared_ptr<const Vocabulary>& vocabulary() const { return vocabulary_; }

 private:
  struct Entry;
  std::shared_ptr<const Vocabulary> vocabulary_;
  GrammarCacheOptions options_;
  mutable std::mutex mutex_;
  std::condition_variable compiled_;
  std::unordered_map<std::string, std::shared_ptr<Entry>> entries_;
  std::list<std::string> recent_;  // most recent first
  GrammarCacheStats stats_;
};

}  // namespace kvvm::grammar
