#include "kvvm/grammar/grammar.h"

#include <algorithm>
#include <bit>
#include <optional>
#include <string>

#include "grammar/text.h"

namespace kvvm::grammar {

int ByteSet::count() const {
  int n = 0;
  for (std::uint64_t w : words) n += std::popcount(w);
  return n;
}

ByteSet ByteSet::complement() const {
  ByteSet out;
  for (int i = 0; i < 4; ++i) out.words[i] = ~words[i];
  return out;
}

RuleId Grammar::declare(std::string_view name) {
  std::string unique(name.empty() ? "rule" : name);
  // Names are unique so that messages and to_string() can name a rule; a taken name gets the
  // rule's number (cheaper than searching for the lowest free suffix), and more numbers in the
  // rare case that one is taken too. Looked up in a set: front ends name rules after places in
  // user text, tens of thousands of them for a long pattern, and a scan per name was quadratic.
  if (names_.contains(unique)) {
    const std::string base = unique;
    std::size_t suffix = rules_.size();
    do {
      unique = base + "-" + std::to_string(suffix++);
    } while (names_.contains(unique));
  }
  names_.insert(unique);
  rules_.push_back(Rule{std::move(unique), {}, false});
  return static_cast<RuleId>(rules_.size() - 1);
}

void Grammar::define(RuleId rule, std::vector<Sequence> alternatives) {
  KVVM_CHECK(rule < rules_.size(), "no such rule");
  KVVM_CHECK(!rules_[rule].defined, "a rule is defined once");
  // Counted here so that element_count(), which the builder asks before every repetition, is
  // not a walk of every rule (quadratic in a pattern's repetitions).
  for (const Sequence& alternative : alternatives) elements_ += alternative.size();
  rules_[rule].alternatives = std::move(alternatives);
  rules_[rule].defined = true;
}

std::uint32_t Grammar::intern(const ByteSet& set) {
  const auto [it, added] =
      set_index_.emplace(set.words, static_cast<std::uint32_t>(byte_sets_.size()));
  if (added) byte_sets_.push_back(set);
  return it->second;
}

std::size_t Grammar::element_count() const { return elements_; }

namespace {

// The rules with an alternative whose every element qualifies: a byte set when `bytes_qualify`
// says so of it (never, for nullable; when not empty, for productive), a rule when already
// found. A worklist over the references, so a long chain of rules costs its length, not its
// square.
std::vector<bool> closure(const Grammar& g, bool (*bytes_qualify)(const ByteSet&)) {
  const auto& rules = g.rules();
  std::vector<bool> out(rules.size(), false);
  std::vector<std::vector<std::uint32_t>> pending(rules.size());
  // users[s]: (rule, alternative) of each reference to s, once per occurrence.
  std::vector<std::vector<std::pair<RuleId, std::uint32_t>>> users(rules.size());
  std::vector<RuleId> work;
  for (std::size_t r = 0; r < rules.size(); ++r) {
    pending[r].assign(rules[r].alternatives.size(), 0);
    for (std::uint32_t a = 0; a < rules[r].alternatives.size(); ++a) {
      bool possible = true;
      std::uint32_t references = 0;
      for (const Element& e : rules[r].alternatives[a]) {
        if (e.kind == Element::Kind::kBytes) {
          possible = possible && bytes_qualify(g.byte_sets()[e.index]);
        } else {
          ++references;
        }
      }
      if (!possible) {
        pending[r][a] = ~std::uint32_t{0};  // never
        continue;
      }
      pending[r][a] = references;
      for (const Element& e : rules[r].alternatives[a]) {
        if (e.kind == Element::Kind::kRule) users[e.index].emplace_back(static_cast<RuleId>(r), a);
      }
      if (references == 0 && !out[r]) {
        out[r] = true;
        work.push_back(static_cast<RuleId>(r));
      }
    }
  }
  while (!work.empty()) {
    const RuleId s = work.back();
    work.pop_back();
    for (const auto& [r, a] : users[s]) {
      if (--pending[r][a] == 0 && !out[r]) {
        out[r] = true;
        work.push_back(r);
      }
    }
  }
  return out;
}

// Which rules match at least one string.
std::vector<bool> productive(const Grammar& g) {
  return closure(g, [](const ByteSet& set) { return !set.empty(); });
}

}  // namespace

std::vector<bool> Grammar::nullable() const {
  return closure(*this, [](const ByteSet&) { return false; });
}

Status Grammar::check(const GrammarLimits& limits) const {
  if (rules_.size() > limits.max_rules) {
    return Status::ResourceExhausted(
        concat("the grammar has ", rules_.size(), " rules; at most ", limits.max_rules),
        {rules_.size(), limits.max_rules, limits.max_rules});
  }
  const std::size_t elements = element_count();
  if (elements > limits.max_elements) {
    return Status::ResourceExhausted(
        concat("the grammar has ", elements, " elements; at most ", limits.max_elements),
        {elements, limits.max_elements, limits.max_elements});
  }
  if (root_ >= rules_.size()) return Status::InvalidArgument("the grammar has no root rule");
  for (const Rule& rule : rules_) {
    if (!rule.defined)
      return Status::InvalidArgument(concat("rule '", rule.name, "' is not defined"));
    for (const Sequence& alternative : rule.alternatives) {
      for (const Element& e : alternative) {
        const std::size_t bound =
            e.kind == Element::Kind::kBytes ? byte_sets_.size() : rules_.size();
        if (e.index >= bound) {
          return Status::InvalidArgument(
              concat("rule '", rule.name, "' names element ", e.index, " of ", bound));
        }
      }
    }
  }
  const std::vector<bool> live = productive(*this);
  // Only what the root reaches matters: an unused helper rule may be empty.
  std::vector<bool> reached(rules_.size(), false);
  std::vector<RuleId> work{root_};
  reached[root_] = true;
  std::optional<RuleId> dead;  // the first reached rule that matches nothing; one of none
                               // alternatives preferred, as the place to name
  while (!work.empty()) {
    const RuleId r = work.back();
    work.pop_back();
    if (!live[r] &&
        (!dead || (rules_[r].alternatives.empty() && !rules_[*dead].alternatives.empty()))) {
      dead = r;
    }
    for (const Sequence& alternative : rules_[r].alternatives) {
      for (const Element& e : alternative) {
        if (e.kind == Element::Kind::kRule && !reached[e.index]) {
          reached[e.index] = true;
          work.push_back(e.index);
        }
      }
    }
  }
  if (dead) {
    return Status::InvalidArgument(
        concat("rule '", rules_[*dead].name, "' matches no string (nothing can satisfy it)"));
  }
  // Left recursion: a cycle of references each made after only nullable elements, one of them
  // at least not in last place (a reference in last place replaces its caller's frame, so it
  // does not grow the stack, but a cycle through any other reference does, however many last
  // places it also passes: a ::= b, b ::= a "x"). Such a cycle has no pushdown run.
  struct Edge {
    RuleId to;
    bool last;
  };
  const std::vector<bool> empty_ok = nullable();
  std::vector<std::vector<Edge>> edges(rules_.size());
  for (std::size_t r = 0; r < rules_.size(); ++r) {
    for (const Sequence& alternative : rules_[r].alternatives) {
      for (std::size_t i = 0; i < alternative.size(); ++i) {
        const Element& e = alternative[i];
        if (e.kind == Element::Kind::kBytes) break;
        edges[r].push_back(Edge{e.index, i + 1 == alternative.size()});
        if (!empty_ok[e.index]) break;
      }
    }
  }
  // Tarjan's strongly connected components, iteratively; then an edge not in last place
  // within one component is a cycle that grows the stack.
  constexpr std::uint32_t kUnseen = ~std::uint32_t{0};
  std::vector<std::uint32_t> order(rules_.size(), kUnseen), low(rules_.size(), 0),
      component(rules_.size(), kUnseen);
  std::vector<RuleId> open;
  std::vector<bool> is_open(rules_.size(), false);
  std::uint32_t next_order = 0, components = 0;
  const auto visit = [&](RuleId r) {
    order[r] = low[r] = next_order++;
    open.push_back(r);
    is_open[r] = true;
  };
  for (std::size_t start = 0; start < rules_.size(); ++start) {
    if (order[start] != kUnseen || !reached[start]) continue;
    std::vector<std::pair<RuleId, std::size_t>> path{{static_cast<RuleId>(start), 0}};
    visit(static_cast<RuleId>(start));
    while (!path.empty()) {
      auto& [r, next] = path.back();
      if (next < edges[r].size()) {
        const RuleId s = edges[r][next++].to;
        if (order[s] == kUnseen) {
          visit(s);
          path.emplace_back(s, 0);
        } else if (is_open[s]) {
          low[r] = std::min(low[r], order[s]);
        }
        continue;
      }
      const RuleId done = r;
      if (low[done] == order[done]) {
        RuleId member;
        do {
          member = open.back();
          open.pop_back();
          is_open[member] = false;
          component[member] = components;
        } while (member != done);
        ++components;
      }
      path.pop_back();
      if (!path.empty()) low[path.back().first] = std::min(low[path.back().first], low[done]);
    }
  }
  for (std::size_t r = 0; r < rules_.size(); ++r) {
    if (!reached[r]) continue;
    for (const Edge& e : edges[r]) {
      if (!e.last && component[r] == component[e.to]) {
        return Status::InvalidArgument(concat("rule '", rules_[e.to].name,
                                              "' is left-recursive (it reaches itself before "
                                              "consuming a byte); write the repetition on the "
                                              "right"));
      }
    }
  }
  return Status::Ok();
}

namespace {

void append_byte(std::string& out, unsigned b) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  if (b >= 0x20 && b < 0x7f && b != '\\' && b != ']' && b != '[' && b != '^' && b != '-' &&
      b != '"') {
    out += static_cast<char>(b);
  } else {
    out += "\\x";
    out += kHex[b >> 4];
    out += kHex[b & 15];
  }
}

std::string set_text(const ByteSet& set) {
  std::string out = "[";
  for (unsigned b = 0; b < 256;) {
    if (!set.has(static_cast<std::uint8_t>(b))) {
      ++b;
      continue;
    }
    unsigned e = b;
    while (e + 1 < 256 && set.has(static_cast<std::uint8_t>(e + 1))) ++e;
    append_byte(out, b);
    if (e > b) {
      out += '-';
      append_byte(out, e);
    }
    b = e + 1;
  }
  return out + "]";
}

}  // namespace

std::string Grammar::to_string() const {
  std::string out;
  for (std::size_t r = 0; r < rules_.size(); ++r) {
    const Rule& rule = rules_[r];
    out += (r == root_ ? std::string("root") : rule.name) + " ::= ";
    if (rule.alternatives.empty()) out += "[]";  // matches nothing
    for (std::size_t a = 0; a < rule.alternatives.size(); ++a) {
      if (a) out += " | ";
      if (rule.alternatives[a].empty()) out += "\"\"";
      for (std::size_t i = 0; i < rule.alternatives[a].size(); ++i) {
        const Element& e = rule.alternatives[a][i];
        if (i) out += ' ';
        if (e.kind == Element::Kind::kBytes) {
          out += set_text(byte_sets_[e.index]);
        } else {
          out += e.index == root_ ? std::string("root") : rules_[e.index].name;
        }
      }
    }
    out += '\n';
  }
  return out;
}

std::uint64_t Grammar::fingerprint() const {
  // FNV-1a over the structure: rules by index, byte sets by content.
  std::uint64_t h = 1469598103934665603ull;
  const auto mix = [&h](std::uint64_t v) {
    for (int i = 0; i < 8; ++i) {
      h ^= (v >> (8 * i)) & 0xff;
      h *= 1099511628211ull;
    }
  };
  mix(root_);
  mix(rules_.size());
  for (const Rule& rule : rules_) {
    mix(rule.alternatives.size());
    for (const Sequence& alternative : rule.alternatives) {
      mix(alternative.size());
      for (const Element& e : alternative) {
        if (e.kind == Element::Kind::kRule) {
          mix(e.index);
        } else {
          mix(0xB17E5E7ull);
          for (std::uint64_t w : byte_sets_[e.index].words) mix(w);
        }
      }
    }
  }
  return h;
}

}  // namespace kvvm::grammar
