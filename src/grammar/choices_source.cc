// A list of choices compiled to a Grammar: exactly one of the strings, byte for byte.
//
// The grammar is the choices' trie: a shared prefix is one path, and a rule stands only where
// the trie branches or a choice ends inside another ("yes" in "yesterday"), with one
// alternative per next byte. Every byte so continues at most one alternative, so the
// pushdown matcher never carries two parses of the same prefix.
#include <cstddef>
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "grammar/builder.h"
#include "grammar/text.h"
#include "kvvm/grammar/constraint.h"

namespace kvvm::grammar {
namespace {

// All choices' bytes together: a list past this is a document, not a set of labels.
constexpr std::size_t kMaxBytes = std::size_t{1} << 20;

struct Node {
  std::map<std::uint8_t, std::uint32_t> next;
  bool ends = false;  // a choice ends here
};

}  // namespace

Result<Grammar> grammar_from_choices(std::span<const std::string> choices,
                                     const GrammarLimits& limits) {
  if (choices.empty()) return Status::InvalidArgument("choices: an empty list; give at least one");
  std::size_t total = 0;
  for (std::size_t i = 0; i < choices.size(); ++i) {
    if (choices[i].empty()) {
      return Status::InvalidArgument(
          concat("choices: choice ", i, " is the empty string; every choice needs a byte"));
    }
    total += choices[i].size();
  }
  const std::size_t bound = std::min<std::size_t>(kMaxBytes, limits.max_elements);
  if (total > bound) {
    return Status::ResourceExhausted(concat("choices: ", total, " bytes in all; at most ", bound),
                                     {total, bound, bound});
  }

  // The trie; duplicates end at the same node.
  std::vector<Node> trie(1);
  for (const std::string& choice : choices) {
    std::uint32_t node = 0;
    for (char c : choice) {
      const auto byte = static_cast<std::uint8_t>(c);
      auto it = trie[node].next.find(byte);
      if (it == trie[node].next.end()) {
        trie.emplace_back();
        it = trie[node].next.emplace(byte, static_cast<std::uint32_t>(trie.size() - 1)).first;
      }
      node = it->second;
    }
    trie[node].ends = true;
  }

  // A rule for the root and for every node that branches or ends a choice with more after it;
  // a run of single-child nodes between them is a literal. Children have larger indices, so
  // rules are made from the last node back: each one's successors exist already (and the
  // check's fixpoints settle in one pass).
  const auto is_rule = [&](std::uint32_t n) {
    return n == 0 || trie[n].next.size() > 1 || (trie[n].ends && !trie[n].next.empty());
  };
  std::size_t rule_count = 0;
  for (std::uint32_t n = 0; n < trie.size(); ++n) rule_count += is_rule(n);
  if (rule_count > limits.max_rules) {
    return Status::ResourceExhausted(
        concat("choices: the trie needs ", rule_count, " rules; at most ", limits.max_rules),
        {rule_count, limits.max_rules, limits.max_rules});
  }
  Grammar grammar;
  Builder builder(grammar, limits);
  std::vector<RuleId> rule_of(trie.size(), 0);
  for (std::uint32_t n = static_cast<std::uint32_t>(trie.size()); n-- > 0;) {
    if (!is_rule(n)) continue;
    std::vector<Sequence> alternatives;
    if (trie[n].ends) alternatives.emplace_back();
    for (const auto& [byte, child] : trie[n].next) {
      std::string run(1, static_cast<char>(byte));
      std::uint32_t at = child;
      while (!is_rule(at) && trie[at].next.size() == 1) {
        const auto& [b, c] = *trie[at].next.begin();
        run += static_cast<char>(b);
        at = c;
      }
      Sequence alternative = builder.literal(run);
      if (is_rule(at)) Builder::append(alternative, builder.ref(rule_of[at]));
      alternatives.push_back(std::move(alternative));
    }
    // One name for all: each rule is told apart by its number ("choice-7").
    rule_of[n] = grammar.add("choice", std::move(alternatives));
  }
  grammar.set_root(rule_of[0]);
  KVVM_RETURN_IF_ERROR(grammar.check(limits));
  return grammar;
}

}  // namespace kvvm::grammar
