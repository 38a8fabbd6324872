// The pushdown run of a grammar over bytes: the grammar flattened into a program of positions,
// stacks of return positions shared between alternatives (hash-consed nodes: a stack is a node
// id, two equal stacks are one id), and the step from one set of stacks to the next on a byte.
//
// Every stack in a state has its top at a byte set (the closure has entered every rule and
// returned from every finished one), so the next byte is matched against the tops only. A
// reference in last place replaces its caller's frame: repetition (R ::= x R | "") keeps the
// stack's depth, and a repetition of something that can be empty comes back to the same node,
// which the closure has already seen.
#pragma once

#include <cstdint>
#include <vector>

#include "kvvm/grammar/grammar.h"

namespace kvvm::grammar::detail {

// Below the bottom of a stack: the grammar's root was called from here (popping to it means the
// whole grammar matched).
inline constexpr std::uint32_t kRoot = 0xFFFFFFFFu;
// Below a partial stack (a mask cache's key): what lies under it is not known, so popping to it
// means the rest depends on the context.
inline constexpr std::uint32_t kUnknown = 0xFFFFFFFEu;

struct Program {
  enum Op : std::uint8_t { kBytes, kCall, kTailCall, kReturn };
  std::vector<std::uint8_t> ops;
  std::vector<std::uint32_t> args;                 // byte set (kBytes) or rule (calls)
  std::vector<std::vector<std::uint32_t>> starts;  // per rule, its alternatives' first positions
  std::vector<ByteSet> sets;
  RuleId root = 0;

  // REQUIRES: grammar.check() passed.
  static Program flatten(const Grammar& grammar);
};

// Hash-consed stack nodes: (position, parent) -> id.
class Stacks {
 public:
  std::uint32_t node(std::uint32_t pos, std::uint32_t parent);
  std::uint32_t pos(std::uint32_t node) const { return nodes_[node].pos; }
  std::uint32_t parent(std::uint32_t node) const { return nodes_[node].parent; }
  std::size_t size() const { return nodes_.size(); }
  void clear();

 private:
  struct Node {
    std::uint32_t pos;
    std::uint32_t parent;
  };
  void grow();
  std::vector<Node> nodes_;
  std::vector<std::uint32_t> slots_;  // node + 1; 0 empty; a power of two long
};

struct State {
  std::vector<std::uint32_t> tops;  // stack nodes, each at a byte set
  bool accepting = false;           // a stack popped to kRoot: the grammar matched
  bool unknown = false;             // a stack popped to kUnknown
  bool alive() const { return accepting || !tops.empty(); }
  void clear() {
    tops.clear();
    accepting = unknown = false;
  }
};

class Runner {
 public:
  Runner(const Program& program, Stacks& stacks) : program_(program), stacks_(stacks) {}

  // The state of the grammar before any byte.
  void start(State& out);
  // The closure of the stacks `nodes` (each a node or kRoot / kUnknown) into `out` (cleared).
  void closure(const std::uint32_t* nodes, std::size_t count, State& out);
  // `out` (cleared) after `byte` from `in`.
  void advance(const State& in, std::uint8_t byte, State& out);
  // The bytes some stack of `state` takes next.
  ByteSet next_bytes(const State& state) const;

 private:
  void run(State& out);
  const Program& program_;
  Stacks& stacks_;
  std::vector<std::uint32_t> work_;
  std::vector<std::uint32_t> seen_;  // per node: the generation that last visited it
  std::uint32_t generation_ = 0;
};

}  // namespace kvvm::grammar::detail
