#include "grammar/pushdown.h"

namespace kvvm::grammar::detail {

Program Program::flatten(const Grammar& grammar) {
  Program p;
  p.sets = grammar.byte_sets();
  p.root = grammar.root();
  p.starts.resize(grammar.rules().size());
  for (std::size_t r = 0; r < grammar.rules().size(); ++r) {
    for (const Sequence& alternative : grammar.rules()[r].alternatives) {
      p.starts[r].push_back(static_cast<std::uint32_t>(p.ops.size()));
      for (std::size_t i = 0; i < alternative.size(); ++i) {
        const Element& e = alternative[i];
        if (e.kind == Element::Kind::kBytes) {
          p.ops.push_back(kBytes);
        } else {
          p.ops.push_back(i + 1 == alternative.size() ? kTailCall : kCall);
        }
        p.args.push_back(e.index);
      }
      p.ops.push_back(kReturn);
      p.args.push_back(0);
    }
  }
  return p;
}

namespace {

std::uint64_t mix(std::uint32_t pos, std::uint32_t parent) {
  std::uint64_t h = (std::uint64_t{pos} << 32) | parent;
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  return h;
}

}  // namespace

std::uint32_t Stacks::node(std::uint32_t pos, std::uint32_t parent) {
  if (nodes_.size() * 2 >= slots_.size()) grow();
  const std::size_t mask = slots_.size() - 1;
  for (std::size_t i = mix(pos, parent) & mask;; i = (i + 1) & mask) {
    const std::uint32_t slot = slots_[i];
    if (slot == 0) {
      nodes_.push_back(Node{pos, parent});
      const auto id = static_cast<std::uint32_t>(nodes_.size() - 1);
      slots_[i] = id + 1;
      return id;
    }
    const Node& n = nodes_[slot - 1];
    if (n.pos == pos && n.parent == parent) return slot - 1;
  }
}

void Stacks::grow() {
  const std::size_t capacity = slots_.empty() ? 1024 : slots_.size() * 2;
  slots_.assign(capacity, 0);
  const std::size_t mask = capacity - 1;
  for (std::size_t id = 0; id < nodes_.size(); ++id) {
    std::size_t i = mix(nodes_[id].pos, nodes_[id].parent) & mask;
    while (slots_[i] != 0) i = (i + 1) & mask;
    slots_[i] = static_cast<std::uint32_t>(id + 1);
  }
}

void Stacks::clear() {
  nodes_.clear();
  slots_.clear();
}

void Runner::start(State& out) {
  const std::uint32_t root = kRoot;
  out.clear();
  work_.clear();
  for (const std::uint32_t s : program_.starts[program_.root])
    work_.push_back(stacks_.node(s, root));
  run(out);
}

void Runner::closure(const std::uint32_t* nodes, std::size_t count, State& out) {
  out.clear();
  work_.assign(nodes, nodes + count);
  run(out);
}

void Runner::advance(const State& in, std::uint8_t byte, State& out) {
  out.clear();
  work_.clear();
  for (const std::uint32_t n : in.tops) {
    const std::uint32_t pos = stacks_.pos(n);
    if (program_.sets[program_.args[pos]].has(byte)) {
      work_.push_back(stacks_.node(pos + 1, stacks_.parent(n)));
    }
  }
  run(out);
}

void Runner::run(State& out) {
  if (++generation_ == 0) {  // wrapped: forget every mark
    seen_.assign(seen_.size(), 0);
    generation_ = 1;
  }
  while (!work_.empty()) {
    const std::uint32_t n = work_.back();
    work_.pop_back();
    if (n == kRoot) {
      out.accepting = true;
      continue;
    }
    if (n == kUnknown) {
      out.unknown = true;
      continue;
    }
    if (n >= seen_.size()) seen_.resize(stacks_.size() + stacks_.size() / 2 + 64, 0);
    if (seen_[n] == generation_) continue;
    seen_[n] = generation_;
    const std::uint32_t pos = stacks_.pos(n);
    switch (program_.ops[pos]) {
      case Program::kBytes:
        out.tops.push_back(n);
        break;
      case Program::kReturn:
        work_.push_back(stacks_.parent(n));
        break;
      case Program::kCall: {
        const std::uint32_t back = stacks_.node(pos + 1, stacks_.parent(n));
        for (const std::uint32_t s : program_.starts[program_.args[pos]]) {
          work_.push_back(stacks_.node(s, back));
        }
        break;
      }
      case Program::kTailCall: {
        const std::uint32_t parent = stacks_.parent(n);
        for (const std::uint32_t s : program_.starts[program_.args[pos]]) {
          work_.push_back(stacks_.node(s, parent));
        }
        break;
      }
    }
  }
}

ByteSet Runner::next_bytes(const State& state) const {
  ByteSet out;
  for (const std::uint32_t n : state.tops) out.add(program_.sets[program_.args[stacks_.pos(n)]]);
  return out;
}

}  // namespace kvvm::grammar::detail
