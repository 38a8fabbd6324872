// The parser's state and rules, shared by parser.cc (statements) and parse_expression.cc
// (expressions, lowest precedence first).
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "jinja/ast.h"
#include "jinja/lexer.h"

namespace kvvm::jinja::detail {

class Parser {
 public:
  Parser(std::vector<Token> tokens, std::uint32_t max_depth)
      : tokens_(std::move(tokens)), max_depth_(max_depth) {}

  Body parse_template() { return parse_body({}); }

 private:
  // Counts nesting on entry, uncounts on exit.
  class DepthGuard {
   public:
    explicit DepthGuard(Parser& p) : p_(p) {
      if (++p_.depth_ > p_.max_depth_) {
        exhausted("template nesting", "max_depth", p_.depth_, p_.max_depth_, p_.peek().pos);
      }
    }
    ~DepthGuard() { --p_.depth_; }
    DepthGuard(const DepthGuard&) = delete;
    DepthGuard& operator=(const DepthGuard&) = delete;

   private:
    Parser& p_;
  };

  const Token& peek(std::size_t ahead = 0) const {
    std::size_t i = pos_ + ahead;
    return i < tokens_.size() ? tokens_[i] : tokens_.back();
  }
  const Token& next() {
    const Token& t = tokens_[pos_];
    if (pos_ + 1 < tokens_.size()) ++pos_;
    return t;
  }
  bool is_op(std::string_view op, std::size_t ahead = 0) const {
    const Token& t = peek(ahead);
    return t.kind == TokenKind::kOperator && t.text == op;
  }
  bool is_name(std::string_view name, std::size_t ahead = 0) const {
    const Token& t = peek(ahead);
    return t.kind == TokenKind::kName && t.text == name;
  }
  bool accept_op(std::string_view op) {
    if (!is_op(op)) return false;
    next();
    return true;
  }
  bool accept_name(std::string_view name) {
    if (!is_name(name)) return false;
    next();
    return true;
  }
  static std::string describe(const Token& t) {
    switch (t.kind) {
      case TokenKind::kEnd:
        return "end of template";
      case TokenKind::kBlockEnd:
        return "end of statement block";
      case TokenKind::kVariableEnd:
        return "end of print statement";
      case TokenKind::kText:
        return "template data";
      case TokenKind::kString:
        return "string";
      case TokenKind::kInteger:
      case TokenKind::kFloat:
        return "number";
      default:
        return "'" + t.text + "'";
    }
  }
  [[noreturn]] void unexpected(std::string_view expected) const {
    fail_at(peek().pos, "expected " + std::string(expected) + ", got " + describe(peek()));
  }
  void expect_op(std::string_view op) {
    if (!accept_op(op)) unexpected("'" + std::string(op) + "'");
  }
  std::string expect_name() {
    if (peek().kind != TokenKind::kName) unexpected("a name");
    return next().text;
  }
  void expect_block_end() {
    if (peek().kind != TokenKind::kBlockEnd) unexpected("end of statement block");
    next();
  }

  // Statements until one of `ends` opens a block tag; stops before that tag's `{%`.
  Body parse_body(std::initializer_list<std::string_view> ends);

  static bool is_end_keyword(std::string_view k);

  // Consumes `{% keyword`.
  void expect_tag(std::string_view keyword);

  StmtPtr parse_statement();

  StmtPtr parse_if(SourcePos pos);

  // Names of a for or set target: `x`, `a, b`, `(a, b)`.
  void parse_targets(std::vector<std::string>& targets, bool& unpack);

  StmtPtr parse_for(SourcePos pos);

  StmtPtr parse_set(SourcePos pos);

  std::vector<MacroParam> parse_params();

  StmtPtr parse_macro(SourcePos pos);

  StmtPtr parse_call_block(SourcePos pos);

  StmtPtr parse_filter_block(SourcePos pos);

  // ---- Expressions, lowest precedence first.

  // `a, b` makes a tuple where Jinja allows one (print, if, for's iterable, set's value).
  ExprPtr parse_tuple_or_expr(bool with_condexpr = true);

  ExprPtr parse_expression();

  ExprPtr parse_or();

  ExprPtr parse_and();

  ExprPtr parse_not();

  ExprPtr parse_compare();

  ExprPtr parse_math1();

  ExprPtr parse_concat();

  ExprPtr parse_math2();

  ExprPtr parse_pow();

  ExprPtr parse_unary(bool with_filter);

  ExprPtr parse_primary();

  ExprPtr parse_postfix(ExprPtr node);

  ExprPtr parse_subscript(SourcePos pos, ExprPtr object);

  void parse_arguments(Arguments& args);

  ExprPtr parse_call(ExprPtr callee);

  std::unique_ptr<FilterExpr> parse_filter(ExprPtr operand);

  ExprPtr parse_filter_expr(ExprPtr node);

  ExprPtr parse_test(ExprPtr operand);

  std::vector<Token> tokens_;
  std::size_t pos_ = 0;
  std::uint32_t max_depth_;
  std::uint32_t depth_ = 0;
  std::size_t varargs_refs_ = 0;  // names read so far, to tell whether a macro reads them
  std::size_t kwargs_refs_ = 0;
};

}  // namespace kvvm::jinja::detail
