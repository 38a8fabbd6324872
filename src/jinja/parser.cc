#include "jinja/parser.h"

#include <string>
#include <utility>

#include "jinja/parser_impl.h"

namespace kvvm::jinja::detail {

// Statements until one of `ends` opens a block tag; stops before that tag's `{%`.
Body Parser::parse_body(std::initializer_list<std::string_view> ends) {
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

bool Parser::is_end_keyword(std::string_view k) {
  return k.starts_with("end") || k == "else" || k == "elif";
}

// Consumes `{% keyword`.
void Parser::expect_tag(std::string_view keyword) {
  if (peek().kind != TokenKind::kBlockBegin || !is_name(keyword, 1)) unexpected(keyword);
  next();
  next();
}

StmtPtr Parser::parse_statement() {
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
    return std::make_unique<LoopControlStmt>(pos,
                                             k == "break" ? StmtKind::kBreak : StmtKind::kContinue);
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

StmtPtr Parser::parse_if(SourcePos pos) {
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
void Parser::parse_targets(std::vector<std::string>& targets, bool& unpack) {
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

StmtPtr Parser::parse_for(SourcePos pos) {
  auto stmt = std::make_unique<ForStmt>(pos);
  parse_targets(stmt->targets, stmt->unpack);
  if (!accept_name("in")) unexpected("'in'");
  stmt->iterable = parse_tuple_or_expr(/*with_condexpr=*/false);
  if (accept_name("if")) stmt->filter = parse_expression();
  stmt->recursive = accept_name("recursive");
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

StmtPtr Parser::parse_set(SourcePos pos) {
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

std::vector<MacroParam> Parser::parse_params() {
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

StmtPtr Parser::parse_macro(SourcePos pos) {
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

StmtPtr Parser::parse_call_block(SourcePos pos) {
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

StmtPtr Parser::parse_filter_block(SourcePos pos) {
  auto stmt = std::make_unique<FilterBlockStmt>(pos);
  stmt->filters.push_back(parse_filter(nullptr));
  while (accept_op("|")) stmt->filters.push_back(parse_filter(nullptr));
  expect_block_end();
  stmt->body = parse_body({"endfilter"});
  expect_tag("endfilter");
  expect_block_end();
  return stmt;
}

Body parse_tokens(std::vector<Token> tokens, std::uint32_t max_depth) {
  return Parser(std::move(tokens), max_depth).parse_template();
}

}  // namespace kvvm::jinja::detail
