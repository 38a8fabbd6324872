// grammar_from_regex, and embed_regex for other front ends (a JSON Schema "pattern"): a
// pattern's tree (regex_parser.h) compiled with the Builder. Rules are named "regex@N" after the
// pattern's byte N where their construct starts, so a grammar refused for its size names the
// repetition that made it so.
//
// Repetition shares rather than multiplies: a repeated body of more than one element, and any
// result longer than a few elements, become a rule of their own that copies refer to. So
// (a{1000}){1000} is two rules of a thousand elements each, not a million elements, and what
// remains to refuse (ResourceExhausted, from the Builder's bounds) is a single count too large.
#include <algorithm>
#include <map>
#include <string>
#include <utility>

#include "grammar/builder.h"
#include "grammar/regex_embed.h"
#include "grammar/regex_parser.h"
#include "grammar/text.h"
#include "kvvm/grammar/constraint.h"

namespace kvvm::grammar {
namespace {

// A sequence longer than this is moved into a rule of its own (one reference in its place).
constexpr std::size_t kInlineElements = 64;

class RegexCompiler {
 public:
  // `max_elements`: the most elements held in sequences not yet in a rule.
  RegexCompiler(Builder& builder, std::uint64_t max_elements)
      : builder_(builder), max_elements_(max_elements) {}

  Result<Sequence> compile(const RegexNode& node) {
    const std::string name = concat("regex@", node.offset);
    switch (node.kind) {
      case RegexNode::Kind::kLiteral:
        if (node.text.size() > max_elements_) return too_long(name, node.text.size());
        return shared(name, builder_.literal(node.text));
      case RegexNode::Kind::kClass:
        return char_class(name, node.ranges);
      case RegexNode::Kind::kSequence: {
        Sequence out;
        for (const RegexNode& child : node.children) {
          KVVM_ASSIGN_OR_RETURN(const Sequence part, compile(child));
          Builder::append(out, part);
          // Parts are at most a rule's worth each, so this bounds what is held outside rules.
          if (out.size() > max_elements_) return too_long(name, out.size());
        }
        return shared(name, std::move(out));
      }
      case RegexNode::Kind::kAlternation: {
        std::vector<Sequence> options;
        for (const RegexNode& child : node.children) {
          KVVM_ASSIGN_OR_RETURN(Sequence option, compile(child));
          options.push_back(std::move(option));
        }
        return builder_.any_of(name, std::move(options));
      }
      case RegexNode::Kind::kRepeat: {
        KVVM_ASSIGN_OR_RETURN(Sequence body, compile(node.children[0]));
        if (body.empty()) return body;  // any number of empty strings is one
        if (node.min == 0 && node.max == 1) return builder_.optional(name, body);
        // * and + make one rule of a body's size: no bound to check before building them.
        if (node.min == 0 && !node.max) return builder_.star(name, body);
        // A body copied more than once is written once, in a rule the copies refer to.
        // (min copies, then max - min optional ones or one starred.)
        const std::uint64_t extra = node.max ? *node.max - node.min : 1;
        const bool copied = node.min > 1 || node.min + std::min<std::uint64_t>(extra, 2) > 1;
        if (body.size() > 1 && copied) body = builder_.ref(builder_.grammar().add(name, {body}));
        if (node.min == 1 && !node.max) return builder_.plus(name, body);
        KVVM_ASSIGN_OR_RETURN(Sequence out, builder_.repeat(name, body, node.min, node.max));
        return shared(name, std::move(out));
      }
    }
    return Status::Internal("regex: a node of no known kind");
  }

 private:
  // A class is one rule however often the pattern names it (\d, ., [a-z] in many places).
  Sequence char_class(const std::string& name, const std::vector<CodepointRange>& ranges) {
    std::vector<std::pair<std::uint32_t, std::uint32_t>> key;
    for (const CodepointRange& r : ranges) key.emplace_back(r.lo, r.hi);
    const auto found = classes_.find(key);
    if (found != classes_.end()) return found->second;
    Sequence seq = builder_.codepoints(name, ranges);
    classes_.emplace(std::move(key), seq);
    return seq;
  }

  Sequence shared(const std::string& name, Sequence seq) {
    if (seq.size() <= kInlineElements) return seq;
    return builder_.ref(builder_.grammar().add(name, {std::move(seq)}));
  }

  Status too_long(const std::string& name, std::size_t elements) const {
    return Status::ResourceExhausted(
        concat(name, ": a sequence of ", elements, " elements passes the grammar's bound of ",
               max_elements_, " elements"),
        {elements, max_elements_, max_elements_});
  }

  Builder& builder_;
  std::uint64_t max_elements_;
  std::map<std::vector<std::pair<std::uint32_t, std::uint32_t>>, Sequence> classes_;
};

}  // namespace

Result<Grammar> grammar_from_regex(std::string_view pattern, const GrammarLimits& limits) {
  KVVM_ASSIGN_OR_RETURN(const RegexNode tree, parse_regex(pattern));
  Grammar grammar;
  Builder builder(grammar, limits);
  RegexCompiler compiler(builder, limits.max_elements);
  KVVM_ASSIGN_OR_RETURN(const Sequence body, compiler.compile(tree));
  grammar.set_root(grammar.add("regex", {body}));
  KVVM_RETURN_IF_ERROR(grammar.check(limits));
  return grammar;
}

Result<Sequence> embed_regex(Builder& builder, std::string_view pattern, std::string_view where) {
  Result<RegexNode> tree = parse_regex(pattern, where);
  if (!tree.ok()) return tree.status();
  // The builder holds the caller's limits for what it builds; sequences outside rules are held
  // to the default bound (the caller's check() of its grammar has the last word).
  RegexCompiler compiler(builder, GrammarLimits{}.max_elements);
  Result<Sequence> body = compiler.compile(*tree);
  if (!body.ok()) return body.status().with_context(where);
  return body;
}

}  // namespace kvvm::grammar
