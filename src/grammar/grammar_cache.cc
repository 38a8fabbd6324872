#include "kvvm/grammar/grammar_cache.h"

#include <algorithm>
#include <chrono>

namespace kvvm::grammar {

namespace {

// The constraint's content, unambiguously: each part with its length.
std::string content_key(const Constraint& c) {
  std::string key;
  const auto add = [&key](std::string_view part) {
    key += std::to_string(part.size());
    key += ':';
    key += part;
  };
  add(to_string(c.kind));
  add(c.text);
  for (const std::string& choice : c.choices) add(choice);
  add(c.whitespace.flexible ? "ws" + std::to_string(c.whitespace.max_run) : "compact");
  add(c.strict ? "strict" : "loose");
  if (c.kind == Constraint::Kind::kToolCalls) {
    const ToolCallsSpec& spec = c.tool_calls;
    add(std::to_string(spec.tools.size()));
    for (const ToolSchema& tool : spec.tools) {
      add(tool.name);
      add(tool.parameters_json);
    }
    add(spec.open);
    add(spec.close);
    add(spec.between);
    add(spec.arguments_key);
    add(std::to_string(spec.min_calls) + "-" + std::to_string(spec.max_calls));
    add(spec.after_open ? "after_open" : "whole");
    add(spec.whitespace.flexible ? "ws" + std::to_string(spec.whitespace.max_run) : "compact");
  }
  return key;
}

}  // namespace

struct GrammarCache::Entry {
  bool done = false;
  std::shared_ptr<const CompiledGrammar> grammar;
};

GrammarCache::GrammarCache(std::shared_ptr<const Vocabulary> vocabulary,
                           GrammarCacheOptions options)
    : vocabulary_(std::move(vocabulary)), options_(options) {
  options_.entries = std::max<std::uint32_t>(options_.entries, 1);
}

Result<std::shared_ptr<const CompiledGrammar>> GrammarCache::get(const Constraint& constraint) {
  const std::string key = content_key(constraint);
  std::shared_ptr<Entry> entry;
  {
    std::unique_lock lock(mutex_);
    for (;;) {
      const auto found = entries_.find(key);
      if (found == entries_.end()) break;
      if (found->second->done) {
        ++stats_.hits;
        recent_.remove(key);
        recent_.push_front(key);
        return found->second->grammar;
      }
      compiled_.wait(lock);  // another request compiles it; its failure erases the entry
    }
    entry = std::make_shared<Entry>();
    entries_.emplace(key, entry);
  }
  const auto began = std::chrono::steady_clock::now();
  Result<std::shared_ptr<const CompiledGrammar>> compiled =
      [&]() -> Result<std::shared_ptr<const CompiledGrammar>> {
    Result<Grammar> grammar = grammar_of(constraint, options_.compile.limits);
    if (!grammar.ok()) return grammar.status();
    return CompiledGrammar::compile(std::move(*grammar), vocabulary_, options_.compile);
  }();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count();
  std::unique_lock lock(mutex_);
  stats_.compile_seconds += seconds;
  if (!compiled.ok()) {
    ++stats_.refused;
    entries_.erase(key);
    compiled_.notify_all();
    return compiled.status();
  }
  ++stats_.compiled;
  entry->done = true;
  entry->grammar = *compiled;
  recent_.push_front(key);
  while (recent_.size() > options_.entries) {
    entries_.erase(recent_.back());
    recent_.pop_back();
  }
  compiled_.notify_all();
  return *compiled;
}

GrammarCacheStats GrammarCache::stats() const {
  std::unique_lock lock(mutex_);
  GrammarCacheStats out = stats_;
  out.entries = static_cast<std::uint32_t>(recent_.size());
  out.bytes = 0;
  for (const auto& [key, entry] : entries_) {
    if (entry->done) out.bytes += entry->grammar->cache_bytes();
  }
  return out;
}

}  // namespace kvvm::grammar
