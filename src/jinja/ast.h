// The parsed template: expression and statement nodes. Immutable after parsing; every render
// walks the same tree.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "jinja/error.h"
#include "jinja/value.h"

namespace kvvm::jinja::detail {

enum class ExprKind : std::uint8_t {
  kLiteral,
  kName,
  kList,  // list or tuple display
  kDict,
  kUnary,
  kBinary,
  kCompare,
  kConditional,
  kGetAttr,
  kGetItem,
  kSlice,
  kCall,
  kFilter,
  kTest,
};

struct Expr {
  explicit Expr(ExprKind k, SourcePos p) : kind(k), pos(p) {}
  virtual ~Expr() = default;
  ExprKind kind;
  SourcePos pos;
};
using ExprPtr = std::unique_ptr<Expr>;

struct LiteralExpr : Expr {
  LiteralExpr(SourcePos p, Value v) : Expr(ExprKind::kLiteral, p), value(std::move(v)) {}
  Value value;
};

struct NameExpr : Expr {
  NameExpr(SourcePos p, std::string n) : Expr(ExprKind::kName, p), name(std::move(n)) {}
  std::string name;
};

struct ListExpr : Expr {
  explicit ListExpr(SourcePos p) : Expr(ExprKind::kList, p) {}
  std::vector<ExprPtr> items;
  bool tuple = false;
};

struct DictExpr : Expr {
  explicit DictExpr(SourcePos p) : Expr(ExprKind::kDict, p) {}
  std::vector<std::pair<ExprPtr, ExprPtr>> items;
};

enum class UnaryOp : std::uint8_t { kNot, kNeg, kPos };
struct UnaryExpr : Expr {
  UnaryExpr(SourcePos p, UnaryOp o, ExprPtr e)
      : Expr(ExprKind::kUnary, p), op(o), operand(std::move(e)) {}
  UnaryOp op;
  ExprPtr operand;
};

enum class BinaryOp : std::uint8_t {
  kAdd,
  kSub,
  kMul,
  kDiv,
  kFloorDiv,
  kMod,
  kPow,
  kConcat,
  kAnd,
  kOr,
};
struct BinaryExpr : Expr {
  BinaryExpr(SourcePos p, BinaryOp o, ExprPtr l, ExprPtr r)
      : Expr(ExprKind::kBinary, p), op(o), left(std::move(l)), right(std::move(r)) {}
  BinaryOp op;
  ExprPtr left;
  ExprPtr right;
};

enum class CompareOp : std::uint8_t { kEq, kNe, kLt, kLe, kGt, kGe, kIn, kNotIn };
struct CompareExpr : Expr {
  CompareExpr(SourcePos p, ExprPtr first) : Expr(ExprKind::kCompare, p), left(std::move(first)) {}
  ExprPtr left;
  std::vector<std::pair<CompareOp, ExprPtr>> rest;  // a < b < c chains
};

struct ConditionalExpr : Expr {
  explicit ConditionalExpr(SourcePos p) : Expr(ExprKind::kConditional, p) {}
  ExprPtr condition;
  ExprPtr then_expr;
  ExprPtr else_expr;  // null: undefined when the condition fails
};

struct GetAttrExpr : Expr {
  GetAttrExpr(SourcePos p, ExprPtr o, std::string n)
      : Expr(ExprKind::kGetAttr, p), object(std::move(o)), name(std::move(n)) {}
  ExprPtr object;
  std::string name;
};

struct GetItemExpr : Expr {
  GetItemExpr(SourcePos p, ExprPtr o, ExprPtr i)
      : Expr(ExprKind::kGetItem, p), object(std::move(o)), index(std::move(i)) {}
  ExprPtr object;
  ExprPtr index;
};

struct SliceExpr : Expr {
  SliceExpr(SourcePos p, ExprPtr o) : Expr(ExprKind::kSlice, p), object(std::move(o)) {}
  ExprPtr object;
  ExprPtr start;  // each may be null
  ExprPtr stop;
  ExprPtr step;
};

struct Arguments {
  std::vector<ExprPtr> positional;
  std::vector<std::pair<std::string, ExprPtr>> keywords;
  ExprPtr star;       // f(*xs): more positional arguments; may be null
  ExprPtr star_star;  // f(**kw): more keyword arguments; may be null
};

struct CallExpr : Expr {
  CallExpr(SourcePos p, ExprPtr c) : Expr(ExprKind::kCall, p), callee(std::move(c)) {}
  ExprPtr callee;
  Arguments args;
};

// `operand | name(args)`; a filter block's filters have no operand.
struct FilterExpr : Expr {
  FilterExpr(SourcePos p, ExprPtr o, std::string n)
      : Expr(ExprKind::kFilter, p), operand(std::move(o)), name(std::move(n)) {}
  ExprPtr operand;
  std::string name;
  Arguments args;
};

struct TestExpr : Expr {
  TestExpr(SourcePos p, ExprPtr o, std::string n)
      : Expr(ExprKind::kTest, p), operand(std::move(o)), name(std::move(n)) {}
  ExprPtr operand;
  std::string name;
  Arguments args;
  bool negated = false;
};

enum class StmtKind : std::uint8_t {
  kText,
  kOutput,
  kIf,
  kFor,
  kSet,
  kBlockSet,
  kMacro,
  kCallBlock,
  kFilterBlock,
  kBreak,
  kContinue,
  kScope,  // a body rendered as is: {% generation %}, {% with %}
};

struct Stmt {
  explicit Stmt(StmtKind k, SourcePos p) : kind(k), pos(p) {}
  virtual ~Stmt() = default;
  StmtKind kind;
  SourcePos pos;
};
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

struct TextStmt : Stmt {
  TextStmt(SourcePos p, std::string t) : Stmt(StmtKind::kText, p), text(std::move(t)) {}
  std::string text;
};

struct OutputStmt : Stmt {
  OutputStmt(SourcePos p, ExprPtr e) : Stmt(StmtKind::kOutput, p), expr(std::move(e)) {}
  ExprPtr expr;
};

struct IfStmt : Stmt {
  explicit IfStmt(SourcePos p) : Stmt(StmtKind::kIf, p) {}
  std::vector<std::pair<ExprPtr, Body>> branches;
  Body else_body;
};

struct ForStmt : Stmt {
  explicit ForStmt(SourcePos p) : Stmt(StmtKind::kFor, p) {}
  std::vector<std::string> targets;
  bool unpack = false;  // targets written as a tuple
  ExprPtr iterable;
  ExprPtr filter;          // `for x in xs if cond`; may be null
  bool recursive = false;  // `loop(children)` renders the body again over children
  Body body;
  Body else_body;
};

// `set a = e`, `set a, b = e`, `set ns.attr = e`.
struct SetStmt : Stmt {
  explicit SetStmt(SourcePos p) : Stmt(StmtKind::kSet, p) {}
  std::vector<std::string> targets;
  bool unpack = false;
  std::string attribute;  // non-empty: assign targets[0].attribute
  ExprPtr value;
};

struct BlockSetStmt : Stmt {
  explicit BlockSetStmt(SourcePos p) : Stmt(StmtKind::kBlockSet, p) {}
  std::string target;
  std::string attribute;
  std::vector<std::unique_ptr<FilterExpr>> filters;
  Body body;
};

struct MacroParam {
  std::string name;
  ExprPtr default_value;  // may be null
};

struct MacroStmt : Stmt {
  explicit MacroStmt(SourcePos p) : Stmt(StmtKind::kMacro, p) {}
  std::string name;
  std::vector<MacroParam> params;
  // Extra positional or keyword arguments are errors unless the body reads varargs / kwargs.
  bool uses_varargs = false;
  bool uses_kwargs = false;
  Body body;
};

struct CallBlockStmt : Stmt {
  explicit CallBlockStmt(SourcePos p) : Stmt(StmtKind::kCallBlock, p) {}
  std::vector<MacroParam> caller_params;
  std::unique_ptr<CallExpr> call;
  Body body;
};

struct FilterBlockStmt : Stmt {
  explicit FilterBlockStmt(SourcePos p) : Stmt(StmtKind::kFilterBlock, p) {}
  std::vector<std::unique_ptr<FilterExpr>> filters;
  Body body;
};

struct ScopeStmt : Stmt {
  explicit ScopeStmt(SourcePos p) : Stmt(StmtKind::kScope, p) {}
  std::vector<std::pair<std::string, ExprPtr>> assignments;  // {% with a = 1 %}
  bool new_scope = false;
  Body body;
};

struct LoopControlStmt : Stmt {
  LoopControlStmt(SourcePos p, StmtKind k) : Stmt(k, p) {}
};

}  // namespace kvvm::jinja::detail
