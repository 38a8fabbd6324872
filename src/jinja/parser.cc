#include "jinja/parser.h"

#include <string>
#include <utility>

namespace kvvm::jinja::detail {

namespace {

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
        throw TemplateError{
            TemplateError::Kind::kExhausted,
            "template nesting exceeds max_depth (" + std::to_string(p_.max_depth_) + ")",
            p_.peek().pos};
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
  Body parse_body(std::initializer_list<std::string_view> ends) {
    DepthGuard guard(*this);
    Body body;
    while (true) {
      const Token& t = peek();
      switch (t.kind) {
        case TokenKind::kEnd:
          if (ends.size() != 0) {
            std::string expected;
            for (std::string_view end : ends) {
              expected += (expected.empty() ? "'" : " or '") + std::string(end) + "'";
            }
            fail_at(t.pos, "unexpected end of template, expected " + expected);
          }
          return body;
        case TokenKind::kText:
          body.push_back(std::make_unique<TextStmt>(t.pos, t.text));
          next();
          break;
        case TokenKind::kVariableBegin: {
          SourcePos pos = next().pos;
          ExprPtr e = parse_tuple_or_expr();
          if (peek().kind != TokenKind::kVariableEnd) unexpected("end of print statement");
          next();
          body.push_back(std::make_unique<OutputStmt>(pos, std::move(e)));
          break;
        }
        case TokenKind::kBlockBegin: {
          const Token& keyword = peek(1);
          if (keyword.kind != TokenKind::kName) {
            next();
            unexpected("a statement name");
          }
          for (std::string_view end : ends) {
            if (keyword.text == end) return body;
          }
          if (ends.size() == 0 && is_end_keyword(keyword.text)) {
            fail_at(keyword.pos, "unexpected '" + keyword.text + "'");
          }
          if (ends.size() != 0 && is_end_keyword(keyword.text)) {
            fail_at(keyword.pos, "unexpected '" + keyword.text + "', expected '" +
                                     std::string(*ends.begin()) + "'");
          }
          next();
          body.push_back(parse_statement());
          break;
        }
        default:
          unexpected("template data");
      }
    }
  }

  static bool is_end_keyword(std::string_view k) {
    return k.starts_with("end") || k == "else" || k == "elif";
  }

  // Consumes `{% keyword`.
  void expect_tag(std::string_view keyword) {
    if (peek().kind != TokenKind::kBlockBegin || !is_name(keyword, 1)) unexpected(keyword);
    next();
    next();
  }

  StmtPtr parse_statement() {
    DepthGuard guard(*this);
    const Token& keyword = next();
    SourcePos pos = keyword.pos;
    const std::string& k = keyword.text;
    if (k == "if") return parse_if(pos);
    if (k == "for") return parse_for(pos);
    if (k == "set") return parse_set(pos);
    if (k == "macro") return parse_macro(pos);
    if (k == "call") return parse_call_block(pos);
    if (k == "filter") return parse_filter_block(pos);
    if (k == "break" || k == "continue") {
      expect_block_end();
      return std::make_unique<LoopControlStmt>(
          pos, k == "break" ? StmtKind::kBreak : StmtKind::kContinue);
    }
    if (k == "generation" || k == "with") {
      auto scope = std::make_unique<ScopeStmt>(pos);
      scope->new_scope = k == "with";
      while (k == "with" && peek().kind != TokenKind::kBlockEnd) {
        if (!scope->assignments.empty()) expect_op(",");
        std::string name = expect_name();
        expect_op("=");
        scope->assignments.emplace_back(std::move(name), parse_expression());
      }
      expect_block_end();
      std::string end = "end" + k;
      scope->body = parse_body({end});
      expect_tag(end);
      expect_block_end();
      return scope;
    }
    fail_at(pos, "unknown tag '" + k + "'");
  }

  StmtPtr parse_if(SourcePos pos) {
    auto stmt = std::make_unique<IfStmt>(pos);
    ExprPtr cond = parse_tuple_or_expr();
    expect_block_end();
    while (true) {
      Body body = parse_body({"elif", "else", "endif"});
      stmt->branches.emplace_back(std::move(cond), std::move(body));
      next();  // {%
      std::string keyword = next().text;
      if (keyword == "elif") {
        cond = parse_tuple_or_expr();
        expect_block_end();
        continue;
      }
      if (keyword == "else") {
        expect_block_end();
        stmt->else_body = parse_body({"endif"});
        expect_tag("endif");
      }
      expect_block_end();
      return stmt;
    }
  }

  // Names of a for or set target: `x`, `a, b`, `(a, b)`.
  void parse_targets(std::vector<std::string>& targets, bool& unpack) {
    bool paren = accept_op("(");
    targets.push_back(expect_name());
    while (accept_op(",")) {
      unpack = true;
      if (peek().kind != TokenKind::kName) break;
      targets.push_back(expect_name());
    }
    if (paren) {
      unpack = true;
      expect_op(")");
    }
  }

  StmtPtr parse_for(SourcePos pos) {
    auto stmt = std::make_unique<ForStmt>(pos);
    parse_targets(stmt->targets, stmt->unpack);
    if (!accept_name("in")) unexpected("'in'");
    stmt->iterable = parse_tuple_or_expr(/*with_condexpr=*/false);
    if (accept_name("if")) stmt->filter = parse_expression();
    if (is_name("recursive")) fail_at(peek().pos, "recursive loops are not supported");
    expect_block_end();
    stmt->body = parse_body({"else", "endfor"});
    next();
    if (next().text == "else") {
      expect_block_end();
      stmt->else_body = parse_body({"endfor"});
      expect_tag("endfor");
    }
    expect_block_end();
    return stmt;
  }

  StmtPtr parse_set(SourcePos pos) {
    std::vector<std::string> targets;
    bool unpack = false;
    std::string attribute;
    parse_targets(targets, unpack);
    if (!unpack && accept_op(".")) attribute = expect_name();
    if (accept_op("=")) {
      auto stmt = std::make_unique<SetStmt>(pos);
      stmt->targets = std::move(targets);
      stmt->unpack = unpack;
      stmt->attribute = std::move(attribute);
      stmt->value = parse_tuple_or_expr();
      expect_block_end();
      return stmt;
    }
    if (unpack) unexpected("'='");
    auto stmt = std::make_unique<BlockSetStmt>(pos);
    stmt->target = targets[0];
    stmt->attribute = std::move(attribute);
    while (accept_op("|")) stmt->filters.push_back(parse_filter(nullptr));
    expect_block_end();
    stmt->body = parse_body({"endset"});
    expect_tag("endset");
    expect_block_end();
    return stmt;
  }

  std::vector<MacroParam> parse_params() {
    std::vector<MacroParam> params;
    expect_op("(");
    while (!accept_op(")")) {
      if (!params.empty()) expect_op(",");
      if (accept_op(")")) break;
      MacroParam p;
      p.name = expect_name();
      if (accept_op("=")) {
        p.default_value = parse_expression();
      } else if (!params.empty() && params.back().default_value) {
        fail_at(peek().pos, "non-default argument follows default argument");
      }
      params.push_back(std::move(p));
    }
    return params;
  }

  StmtPtr parse_macro(SourcePos pos) {
    auto stmt = std::make_unique<MacroStmt>(pos);
    stmt->name = expect_name();
    stmt->params = parse_params();
    expect_block_end();
    std::size_t varargs_before = varargs_refs_;
    std::size_t kwargs_before = kwargs_refs_;
    stmt->body = parse_body({"endmacro"});
    stmt->uses_varargs = varargs_refs_ != varargs_before;
    stmt->uses_kwargs = kwargs_refs_ != kwargs_before;
    expect_tag("endmacro");
    expect_block_end();
    return stmt;
  }

  StmtPtr parse_call_block(SourcePos pos) {
    auto stmt = std::make_unique<CallBlockStmt>(pos);
    if (is_op("(")) stmt->caller_params = parse_params();
    ExprPtr e = parse_expression();
    if (e->kind != ExprKind::kCall) fail_at(e->pos, "expected call");
    stmt->call.reset(static_cast<CallExpr*>(e.release()));
    expect_block_end();
    stmt->body = parse_body({"endcall"});
    expect_tag("endcall");
    expect_block_end();
    return stmt;
  }

  StmtPtr parse_filter_block(SourcePos pos) {
    auto stmt = std::make_unique<FilterBlockStmt>(pos);
    stmt->filters.push_back(parse_filter(nullptr));
    while (accept_op("|")) stmt->filters.push_back(parse_filter(nullptr));
    expect_block_end();
    stmt->body = parse_body({"endfilter"});
    expect_tag("endfilter");
    expect_block_end();
    return stmt;
  }

  // ---- Expressions, lowest precedence first.

  // `a, b` makes a tuple where Jinja allows one (print, if, for's iterable, set's value).
  ExprPtr parse_tuple_or_expr(bool with_condexpr = true) {
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

  ExprPtr parse_expression() {
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

  ExprPtr parse_or() {
    ExprPtr left = parse_and();
    while (is_name("or")) {
      SourcePos pos = next().pos;
      left = std::make_unique<BinaryExpr>(pos, BinaryOp::kOr, std::move(left), parse_and());
    }
    return left;
  }

  ExprPtr parse_and() {
    ExprPtr left = parse_not();
    while (is_name("and")) {
      SourcePos pos = next().pos;
      left = std::make_unique<BinaryExpr>(pos, BinaryOp::kAnd, std::move(left), parse_not());
    }
    return left;
  }

  ExprPtr parse_not() {
    if (is_name("not")) {
      DepthGuard guard(*this);
      SourcePos pos = next().pos;
      return std::make_unique<UnaryExpr>(pos, UnaryOp::kNot, parse_not());
    }
    return parse_compare();
  }

  ExprPtr parse_compare() {
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

  ExprPtr parse_math1() {
    ExprPtr left = parse_concat();
    while (is_op("+") || is_op("-")) {
      const Token& t = next();
      BinaryOp op = t.text == "+" ? BinaryOp::kAdd : BinaryOp::kSub;
      left = std::make_unique<BinaryExpr>(t.pos, op, std::move(left), parse_concat());
    }
    return left;
  }

  ExprPtr parse_concat() {
    ExprPtr left = parse_math2();
    while (is_op("~")) {
      SourcePos pos = next().pos;
      left = std::make_unique<BinaryExpr>(pos, BinaryOp::kConcat, std::move(left), parse_math2());
    }
    return left;
  }

  ExprPtr parse_math2() {
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

  ExprPtr parse_pow() {
    ExprPtr left = parse_unary(true);
    while (is_op("**")) {
      SourcePos pos = next().pos;
      left = std::make_unique<BinaryExpr>(pos, BinaryOp::kPow, std::move(left), parse_unary(true));
    }
    return left;
  }

  ExprPtr parse_unary(bool with_filter) {
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

  ExprPtr parse_primary() {
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

  ExprPtr parse_postfix(ExprPtr node) {
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

  ExprPtr parse_subscript(SourcePos pos, ExprPtr object) {
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

  void parse_arguments(Arguments& args) {
    expect_op("(");
    while (!accept_op(")")) {
      if (!args.positional.empty() || !args.keywords.empty()) {
        expect_op(",");
        if (accept_op(")")) break;
      }
      if (is_op("*") || is_op("**")) fail_at(peek().pos, "*args and **kwargs are not supported");
      if (peek().kind == TokenKind::kName && is_op("=", 1)) {
        std::string name = next().text;
        next();
        args.keywords.emplace_back(std::move(name), parse_expression());
      } else {
        if (!args.keywords.empty()) {
          fail_at(peek().pos, "positional argument follows keyword argument");
        }
        args.positional.push_back(parse_expression());
      }
    }
  }

  ExprPtr parse_call(ExprPtr callee) {
    SourcePos pos = callee->pos;  // errors in a call point at what was called
    auto call = std::make_unique<CallExpr>(pos, std::move(callee));
    parse_arguments(call->args);
    return call;
  }

  std::unique_ptr<FilterExpr> parse_filter(ExprPtr operand) {
    SourcePos pos = peek().pos;
    std::string name = expect_name();
    while (accept_op(".")) name += "." + expect_name();
    auto filter = std::make_unique<FilterExpr>(pos, std::move(operand), std::move(name));
    if (is_op("(")) parse_arguments(filter->args);
    return filter;
  }

  ExprPtr parse_filter_expr(ExprPtr node) {
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

  ExprPtr parse_test(ExprPtr operand) {
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

  std::vector<Token> tokens_;
  std::size_t pos_ = 0;
  std::uint32_t max_depth_;
  std::uint32_t depth_ = 0;
  std::size_t varargs_refs_ = 0;  // names read so far, to tell whether a macro reads them
  std::size_t kwargs_refs_ = 0;
};

}  // namespace

Body parse_tokens(std::vector<Token> tokens, std::uint32_t max_depth) {
  return Parser(std::move(tokens), max_depth).parse_template();
}

}  // namespace kvvm::jinja::detail
