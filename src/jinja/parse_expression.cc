// Expressions, lowest precedence first: conditional, or, and, not, comparisons, + -, ~, * / // %,
// **, unary, then primaries with their postfix attribute, item, call, filter and test parts.
#include <string>
#include <utility>

#include "jinja/parser_impl.h"

namespace kvvm::jinja::detail {

// `a, b` makes a tuple where Jinja allows one (print, if, for's iterable, set's value).
ExprPtr Parser::parse_tuple_or_expr(bool with_condexpr) {
  SourcePos pos = peek().pos;
  ExprPtr first = with_condexpr ? parse_expression() : parse_or();
  if (!is_op(",")) return first;
  auto tuple = std::make_unique<ListExpr>(pos);
  tuple->tuple = true;
  tuple->items.push_back(std::move(first));
  while (accept_op(",")) {
    if (peek().kind == TokenKind::kBlockEnd || peek().kind == TokenKind::kVariableEnd ||
        is_name("if") || is_name("recursive")) {
      break;
    }
    tuple->items.push_back(with_condexpr ? parse_expression() : parse_or());
  }
  return tuple;
}

ExprPtr Parser::parse_expression() {
  DepthGuard guard(*this);
  SourcePos pos = peek().pos;
  ExprPtr e = parse_or();
  while (is_name("if")) {
    next();
    auto cond = std::make_unique<ConditionalExpr>(pos);
    cond->then_expr = std::move(e);
    cond->condition = parse_or();
    if (accept_name("else")) cond->else_expr = parse_expression();
    e = std::move(cond);
  }
  return e;
}

ExprPtr Parser::parse_or() {
  ExprPtr left = parse_and();
  while (is_name("or")) {
    SourcePos pos = next().pos;
    left = std::make_unique<BinaryExpr>(pos, BinaryOp::kOr, std::move(left), parse_and());
  }
  return left;
}

ExprPtr Parser::parse_and() {
  ExprPtr left = parse_not();
  while (is_name("and")) {
    SourcePos pos = next().pos;
    left = std::make_unique<BinaryExpr>(pos, BinaryOp::kAnd, std::move(left), parse_not());
  }
  return left;
}

ExprPtr Parser::parse_not() {
  if (is_name("not")) {
    DepthGuard guard(*this);
    SourcePos pos = next().pos;
    return std::make_unique<UnaryExpr>(pos, UnaryOp::kNot, parse_not());
  }
  return parse_compare();
}

ExprPtr Parser::parse_compare() {
  SourcePos pos = peek().pos;
  ExprPtr left = parse_math1();
  std::unique_ptr<CompareExpr> cmp;
  while (true) {
    CompareOp op;
    const Token& t = peek();
    if (t.kind == TokenKind::kOperator && t.text == "==") {
      op = CompareOp::kEq;
    } else if (t.kind == TokenKind::kOperator && t.text == "!=") {
      op = CompareOp::kNe;
    } else if (t.kind == TokenKind::kOperator && t.text == "<") {
      op = CompareOp::kLt;
    } else if (t.kind == TokenKind::kOperator && t.text == "<=") {
      op = CompareOp::kLe;
    } else if (t.kind == TokenKind::kOperator && t.text == ">") {
      op = CompareOp::kGt;
    } else if (t.kind == TokenKind::kOperator && t.text == ">=") {
      op = CompareOp::kGe;
    } else if (is_name("in")) {
      op = CompareOp::kIn;
    } else if (is_name("not") && is_name("in", 1)) {
      next();
      op = CompareOp::kNotIn;
    } else {
      break;
    }
    next();
    if (!cmp) cmp = std::make_unique<CompareExpr>(pos, std::move(left));
    cmp->rest.emplace_back(op, parse_math1());
  }
  if (cmp) return cmp;
  return left;
}

ExprPtr Parser::parse_math1() {
  ExprPtr left = parse_concat();
  while (is_op("+") || is_op("-")) {
    const Token& t = next();
    BinaryOp op = t.text == "+" ? BinaryOp::kAdd : BinaryOp::kSub;
    left = std::make_unique<BinaryExpr>(t.pos, op, std::move(left), parse_concat());
  }
  return left;
}

ExprPtr Parser::parse_concat() {
  ExprPtr left = parse_math2();
  while (is_op("~")) {
    SourcePos pos = next().pos;
    left = std::make_unique<BinaryExpr>(pos, BinaryOp::kConcat, std::move(left), parse_math2());
  }
  return left;
}

ExprPtr Parser::parse_math2() {
  ExprPtr left = parse_pow();
  while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
    const Token& t = next();
    BinaryOp op = t.text == "*"    ? BinaryOp::kMul
                  : t.text == "/"  ? BinaryOp::kDiv
                  : t.text == "//" ? BinaryOp::kFloorDiv
                                   : BinaryOp::kMod;
    left = std::make_unique<BinaryExpr>(t.pos, op, std::move(left), parse_pow());
  }
  return left;
}

ExprPtr Parser::parse_pow() {
  ExprPtr left = parse_unary(true);
  while (is_op("**")) {
    SourcePos pos = next().pos;
    left = std::make_unique<BinaryExpr>(pos, BinaryOp::kPow, std::move(left), parse_unary(true));
  }
  return left;
}

ExprPtr Parser::parse_unary(bool with_filter) {
  DepthGuard guard(*this);
  ExprPtr node;
  if (is_op("-") || is_op("+")) {
    const Token& t = next();
    node = std::make_unique<UnaryExpr>(t.pos, t.text == "-" ? UnaryOp::kNeg : UnaryOp::kPos,
                                       parse_unary(false));
  } else {
    node = parse_postfix(parse_primary());
  }
  if (with_filter) node = parse_filter_expr(std::move(node));
  return node;
}

ExprPtr Parser::parse_primary() {
  const Token& t = peek();
  switch (t.kind) {
    case TokenKind::kName: {
      next();
      if (t.text == "true" || t.text == "True") {
        return std::make_unique<LiteralExpr>(t.pos, Value::boolean(true));
      }
      if (t.text == "false" || t.text == "False") {
        return std::make_unique<LiteralExpr>(t.pos, Value::boolean(false));
      }
      if (t.text == "none" || t.text == "None") {
        return std::make_unique<LiteralExpr>(t.pos, Value::none());
      }
      if (t.text == "varargs") ++varargs_refs_;
      if (t.text == "kwargs") ++kwargs_refs_;
      return std::make_unique<NameExpr>(t.pos, t.text);
    }
    case TokenKind::kString: {
      SourcePos pos = t.pos;
      std::string s;
      while (peek().kind == TokenKind::kString) s += next().text;  // 'a' 'b' is 'ab'
      return std::make_unique<LiteralExpr>(pos, Value::string(std::move(s)));
    }
    case TokenKind::kInteger:
      next();
      return std::make_unique<LiteralExpr>(t.pos, Value::integer(t.integer));
    case TokenKind::kFloat:
      next();
      return std::make_unique<LiteralExpr>(t.pos, Value::floating(t.floating));
    case TokenKind::kOperator:
      if (t.text == "(") {
        SourcePos pos = next().pos;
        if (accept_op(")")) {
          auto empty = std::make_unique<ListExpr>(pos);
          empty->tuple = true;
          return empty;
        }
        ExprPtr e = parse_expression();
        if (is_op(",")) {
          auto tuple = std::make_unique<ListExpr>(pos);
          tuple->tuple = true;
          tuple->items.push_back(std::move(e));
          while (accept_op(",")) {
            if (is_op(")")) break;
            tuple->items.push_back(parse_expression());
          }
          e = std::move(tuple);
        }
        expect_op(")");
        return e;
      }
      if (t.text == "[") {
        auto list = std::make_unique<ListExpr>(next().pos);
        while (!accept_op("]")) {
          if (!list->items.empty()) {
            expect_op(",");
            if (accept_op("]")) break;
          }
          list->items.push_back(parse_expression());
        }
        return list;
      }
      if (t.text == "{") {
        auto dict = std::make_unique<DictExpr>(next().pos);
        while (!accept_op("}")) {
          if (!dict->items.empty()) {
            expect_op(",");
            if (accept_op("}")) break;
          }
          ExprPtr key = parse_expression();
          expect_op(":");
          dict->items.emplace_back(std::move(key), parse_expression());
        }
        return dict;
      }
      break;
    default:
      break;
  }
  unexpected("an expression");
}

ExprPtr Parser::parse_postfix(ExprPtr node) {
  while (true) {
    if (is_op(".")) {
      SourcePos pos = next().pos;
      const Token& t = peek();
      if (t.kind == TokenKind::kName) {
        node = std::make_unique<GetAttrExpr>(pos, std::move(node), next().text);
      } else if (t.kind == TokenKind::kInteger) {
        auto index = std::make_unique<LiteralExpr>(t.pos, Value::integer(next().integer));
        node = std::make_unique<GetItemExpr>(pos, std::move(node), std::move(index));
      } else {
        unexpected("an attribute name");
      }
    } else if (is_op("[")) {
      SourcePos pos = next().pos;
      node = parse_subscript(pos, std::move(node));
    } else if (is_op("(")) {
      node = parse_call(std::move(node));
    } else {
      return node;
    }
  }
}

ExprPtr Parser::parse_subscript(SourcePos pos, ExprPtr object) {
  ExprPtr first;
  if (!is_op(":")) first = parse_expression();
  if (!is_op(":")) {
    if (is_op(",")) {
      // d[a, b] indexes with a tuple.
      auto tuple = std::make_unique<ListExpr>(first->pos);
      tuple->tuple = true;
      tuple->items.push_back(std::move(first));
      while (accept_op(",")) {
        if (is_op("]")) break;
        tuple->items.push_back(parse_expression());
      }
      first = std::move(tuple);
    }
    expect_op("]");
    return std::make_unique<GetItemExpr>(pos, std::move(object), std::move(first));
  }
  auto slice = std::make_unique<SliceExpr>(pos, std::move(object));
  slice->start = std::move(first);
  next();  // :
  if (!is_op(":") && !is_op("]")) slice->stop = parse_expression();
  if (accept_op(":")) {
    if (!is_op("]")) slice->step = parse_expression();
  }
  expect_op("]");
  return slice;
}

void Parser::parse_arguments(Arguments& args) {
  expect_op("(");
  bool first = true;
  while (!accept_op(")")) {
    if (!first) {
      expect_op(",");
      if (accept_op(")")) break;
    }
    first = false;
    if (is_op("*") || is_op("**")) {
      bool two = next().text == "**";
      ExprPtr& slot = two ? args.star_star : args.star;
      if (slot) fail_at(peek().pos, two ? "repeated **kwargs" : "repeated *args");
      slot = parse_expression();
    } else if (peek().kind == TokenKind::kName && is_op("=", 1)) {
      std::string name = next().text;
      next();
      args.keywords.emplace_back(std::move(name), parse_expression());
    } else {
      if (!args.keywords.empty() || args.star || args.star_star) {
        fail_at(peek().pos, "positional argument follows keyword argument");
      }
      args.positional.push_back(parse_expression());
    }
  }
}

ExprPtr Parser::parse_call(ExprPtr callee) {
  SourcePos pos = callee->pos;  // errors in a call point at what was called
  auto call = std::make_unique<CallExpr>(pos, std::move(callee));
  parse_arguments(call->args);
  return call;
}

std::unique_ptr<FilterExpr> Parser::parse_filter(ExprPtr operand) {
  SourcePos pos = peek().pos;
  std::string name = expect_name();
  while (accept_op(".")) name += "." + expect_name();
  auto filter = std::make_unique<FilterExpr>(pos, std::move(operand), std::move(name));
  if (is_op("(")) parse_arguments(filter->args);
  return filter;
}

ExprPtr Parser::parse_filter_expr(ExprPtr node) {
  while (true) {
    if (is_op("|")) {
      next();
      node = parse_filter(std::move(node));
    } else if (is_name("is")) {
      node = parse_test(std::move(node));
    } else if (is_op("(")) {
      node = parse_call(std::move(node));
    } else {
      return node;
    }
  }
}

ExprPtr Parser::parse_test(ExprPtr operand) {
  SourcePos pos = next().pos;  // is
  bool negated = accept_name("not");
  std::string name = expect_name();
  while (accept_op(".")) name += "." + expect_name();
  auto test = std::make_unique<TestExpr>(pos, std::move(operand), std::move(name));
  test->negated = negated;
  const Token& t = peek();
  if (is_op("(")) {
    parse_arguments(test->args);
  } else if ((t.kind == TokenKind::kName || t.kind == TokenKind::kString ||
              t.kind == TokenKind::kInteger || t.kind == TokenKind::kFloat || is_op("[") ||
              is_op("{")) &&
             !(is_name("else") || is_name("or") || is_name("and") || is_name("if") ||
               is_name("in") || is_name("not") || is_name("is"))) {
    // `x is divisibleby 3`: one argument without parentheses.
    test->args.positional.push_back(parse_postfix(parse_primary()));
  }
  return test;
}

}  // namespace kvvm::jinja::detail
