#include "support/grammar_oracle.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <set>
#include <tuple>
#include <vector>

namespace kvvm::grammar::testing {
namespace {

struct Item {
  RuleId rule;
  std::uint32_t alt;
  std::uint32_t dot;
  std::uint32_t origin;
  auto key() const { return std::tie(rule, alt, dot, origin); }
  bool operator<(const Item& o) const { return key() < o.key(); }
};

// Earley with Aycock and Horspool's fix for nullable rules (predicting a nullable rule also
// moves the dot past it). Returns the item sets after `text`; empty sets mean a dead prefix.
std::vector<std::set<Item>> earley(const Grammar& g, std::string_view text) {
  const std::vector<bool> nullable = g.nullable();
  std::vector<std::set<Item>> sets(text.size() + 1);
  const auto closure = [&](std::size_t k) {
    std::vector<Item> work(sets[k].begin(), sets[k].end());
    while (!work.empty()) {
      const Item item = work.back();
      work.pop_back();
      const Sequence& seq = g.rule(item.rule).alternatives[item.alt];
      const auto add = [&](Item next) {
        if (sets[k].insert(next).second) work.push_back(next);
      };
      if (item.dot == seq.size()) {
        // Complete: advance every item at the origin waiting for this rule.
        const std::vector<Item> waiting(sets[item.origin].begin(), sets[item.origin].end());
        for (const Item& w : waiting) {
          const Sequence& ws = g.rule(w.rule).alternatives[w.alt];
          if (w.dot < ws.size() && ws[w.dot].kind == Element::Kind::kRule &&
              ws[w.dot].index == item.rule) {
            add(Item{w.rule, w.alt, w.dot + 1, w.origin});
          }
        }
        continue;
      }
      const Element& e = seq[item.dot];
      if (e.kind != Element::Kind::kRule) continue;
      for (std::uint32_t a = 0; a < g.rule(e.index).alternatives.size(); ++a) {
        add(Item{e.index, a, 0, static_cast<std::uint32_t>(k)});
      }
      if (nullable[e.index]) add(Item{item.rule, item.alt, item.dot + 1, item.origin});
    }
  };
  for (std::uint32_t a = 0; a < g.rule(g.root()).alternatives.size(); ++a) {
    sets[0].insert(Item{g.root(), a, 0, 0});
  }
  closure(0);
  for (std::size_t k = 0; k < text.size(); ++k) {
    const auto byte = static_cast<std::uint8_t>(text[k]);
    for (const Item& item : sets[k]) {
      const Sequence& seq = g.rule(item.rule).alternatives[item.alt];
      if (item.dot < seq.size() && seq[item.dot].kind == Element::Kind::kBytes &&
          g.byte_sets()[seq[item.dot].index].has(byte)) {
        sets[k + 1].insert(Item{item.rule, item.alt, item.dot + 1, item.origin});
      }
    }
    if (sets[k + 1].empty()) {
      sets.resize(k + 2);
      return sets;
    }
    closure(k + 1);
  }
  return sets;
}

// The fewest nested rules a rule needs to finish (its shortest way out), per rule.
std::vector<int> heights(const Grammar& g) {
  constexpr int kInf = std::numeric_limits<int>::max() / 2;
  std::vector<int> h(g.rules().size(), kInf);
  for (bool changed = true; changed;) {
    changed = false;
    for (std::size_t r = 0; r < g.rules().size(); ++r) {
      for (const Sequence& seq : g.rules()[r].alternatives) {
        int worst = 0;
        for (const Element& e : seq) {
          if (e.kind == Element::Kind::kRule) worst = std::max(worst, h[e.index]);
        }
        if (worst + 1 < h[r]) {
          h[r] = worst + 1;
          changed = true;
        }
      }
    }
  }
  return h;
}

int alt_height(const std::vector<int>& h, const Sequence& seq) {
  int worst = 0;
  for (const Element& e : seq) {
    if (e.kind == Element::Kind::kRule) worst = std::max(worst, h[e.index]);
  }
  return worst;
}

bool sample_rule(const Grammar& g, const std::vector<int>& h, RuleId rule, int depth,
                 std::mt19937_64& rng, std::size_t max_bytes, std::string& out) {
  const auto& alts = g.rule(rule).alternatives;
  std::size_t pick = 0;
  if (depth > 0) {
    pick = std::uniform_int_distribution<std::size_t>(0, alts.size() - 1)(rng);
  } else {
    int best = std::numeric_limits<int>::max();
    for (std::size_t a = 0; a < alts.size(); ++a) {
      const int height = alt_height(h, alts[a]);
      if (height < best) {
        best = height;
        pick = a;
      }
    }
  }
  for (const Element& e : alts[pick]) {
    if (out.size() > max_bytes) return false;
    if (e.kind == Element::Kind::kBytes) {
      const ByteSet& set = g.byte_sets()[e.index];
      const int n = set.count();
      int k = std::uniform_int_distribution<int>(0, n - 1)(rng);
      for (unsigned b = 0; b < 256; ++b) {
        if (set.has(static_cast<std::uint8_t>(b)) && k-- == 0) {
          out += static_cast<char>(b);
          break;
        }
      }
    } else if (!sample_rule(g, h, e.index, depth - 1, rng, max_bytes, out)) {
      return false;
    }
  }
  return true;
}

}  // namespace

bool oracle_accepts(const Grammar& grammar, std::string_view text) {
  const auto sets = earley(grammar, text);
  if (sets.size() != text.size() + 1) return false;
  for (const Item& item : sets.back()) {
    if (item.rule == grammar.root() && item.origin == 0 &&
        item.dot == grammar.rule(item.rule).alternatives[item.alt].size()) {
      return true;
    }
  }
  return false;
}

bool oracle_viable(const Grammar& grammar, std::string_view text) {
  const auto sets = earley(grammar, text);
  return sets.size() == text.size() + 1 && !sets.back().empty();
}

std::optional<std::string> oracle_sample(const Grammar& grammar, std::mt19937_64& rng, int depth,
                                         std::size_t max_bytes) {
  const std::vector<int> h = heights(grammar);
  std::string out;
  if (!sample_rule(grammar, h, grammar.root(), depth, rng, max_bytes, out)) return std::nullopt;
  return out;
}

}  // namespace kvvm::grammar::testing
