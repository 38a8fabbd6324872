// Template: parse once (lexer, parser), render many times (context JSON to values, the
// interpreter), errors as Status with the template's name, line and column.
#include "kvvm/jinja/template.h"

#include <exception>
#include <new>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>

#include "jinja/ast.h"
#include "jinja/lexer.h"
#include "jinja/parser.h"
#include "jinja/render.h"

namespace kvvm::jinja {

struct Template::Parsed {
  std::string name;
  std::string source;
  TemplateOptions options;
  detail::Body body;
};

namespace {

using detail::TemplateError;
using detail::Value;

Status to_status(const TemplateError& e, std::string_view name) {
  std::string where = std::string(name) + ":" + std::to_string(e.pos.line) + ":" +
                      std::to_string(e.pos.column) + ": ";
  if (e.kind == TemplateError::Kind::kExhausted) {
    return Status::ResourceExhausted(where + e.message, Exhaustion{e.requested, 0, e.limit});
  }
  return Status::InvalidArgument(where + e.message);
}

Value from_json(const nlohmann::ordered_json& j, std::uint32_t depth, std::uint32_t max_depth) {
  if (depth > max_depth) {
    detail::exhausted("context nesting", "max_depth", depth, max_depth, {1, 1});
  }
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null:
      return Value::none();
    case nlohmann::ordered_json::value_t::boolean:
      return Value::boolean(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer:
      return Value::integer(j.get<std::int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: {
      auto u = j.get<std::uint64_t>();
      if (u > static_cast<std::uint64_t>(INT64_MAX)) return Value::floating(static_cast<double>(u));
      return Value::integer(static_cast<std::int64_t>(u));
    }
    case nlohmann::ordered_json::value_t::number_float:
      return Value::floating(j.get<double>());
    case nlohmann::ordered_json::value_t::string:
      return Value::string(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      detail::List items;
      items.reserve(j.size());
      for (const auto& item : j) items.push_back(from_json(item, depth + 1, max_depth));
      return Value::list(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      detail::Dict items;
      items.reserve(j.size());
      for (const auto& [k, v] : j.items()) {
        items.emplace_back(Value::string(k), from_json(v, depth + 1, max_depth));
      }
      return Value::dict(std::move(items));
    }
    default:
      return Value::none();
  }
}

// Unknown filters and tests are errors when the template is parsed, as Jinja reports them.
void check_names(const detail::Expr& e);
void check_body(const detail::Body& body);

void check_args(const detail::Arguments& args) {
  for (const auto& a : args.positional) check_names(*a);
  for (const auto& [_, a] : args.keywords) check_names(*a);
  if (args.star) check_names(*args.star);
  if (args.star_star) check_names(*args.star_star);
}

void check_names(const detail::Expr& e) {
  using detail::ExprKind;
  switch (e.kind) {
    case ExprKind::kFilter: {
      const auto& f = static_cast<const detail::FilterExpr&>(e);
      if (!detail::has_filter(f.name)) detail::fail_at(f.pos, "No filter named '" + f.name + "'.");
      if (f.operand) check_names(*f.operand);
      check_args(f.args);
      return;
    }
    case ExprKind::kTest: {
      const auto& t = static_cast<const detail::TestExpr&>(e);
      if (!detail::has_test(t.name)) detail::fail_at(t.pos, "No test named '" + t.name + "'.");
      check_names(*t.operand);
      check_args(t.args);
      return;
    }
    case ExprKind::kList:
      for (const auto& i : static_cast<const detail::ListExpr&>(e).items) check_names(*i);
      return;
    case ExprKind::kDict:
      for (const auto& [k, v] : static_cast<const detail::DictExpr&>(e).items) {
        check_names(*k);
        check_names(*v);
      }
      return;
    case ExprKind::kUnary:
      check_names(*static_cast<const detail::UnaryExpr&>(e).operand);
      return;
    case ExprKind::kBinary:
      check_names(*static_cast<const detail::BinaryExpr&>(e).left);
      check_names(*static_cast<const detail::BinaryExpr&>(e).right);
      return;
    case ExprKind::kCompare: {
      const auto& c = static_cast<const detail::CompareExpr&>(e);
      check_names(*c.left);
      for (const auto& [_, r] : c.rest) check_names(*r);
      return;
    }
    case ExprKind::kConditional: {
      const auto& c = static_cast<const detail::ConditionalExpr&>(e);
      check_names(*c.condition);
      check_names(*c.then_expr);
      if (c.else_expr) check_names(*c.else_expr);
      return;
    }
    case ExprKind::kGetAttr:
      check_names(*static_cast<const detail::GetAttrExpr&>(e).object);
      return;
    case ExprKind::kGetItem:
      check_names(*static_cast<const detail::GetItemExpr&>(e).object);
      check_names(*static_cast<const detail::GetItemExpr&>(e).index);
      return;
    case ExprKind::kSlice: {
      const auto& s = static_cast<const detail::SliceExpr&>(e);
      check_names(*s.object);
      if (s.start) check_names(*s.start);
      if (s.stop) check_names(*s.stop);
      if (s.step) check_names(*s.step);
      return;
    }
    case ExprKind::kCall:
      check_names(*static_cast<const detail::CallExpr&>(e).callee);
      check_args(static_cast<const detail::CallExpr&>(e).args);
      return;
    case ExprKind::kLiteral:
    case ExprKind::kName:
      return;
  }
}

void check_filters(const std::vector<std::unique_ptr<detail::FilterExpr>>& filters) {
  for (const auto& f : filters) check_names(*f);
}

void check_params(const std::vector<detail::MacroParam>& params) {
  for (const auto& p : params) {
    if (p.default_value) check_names(*p.default_value);
  }
}

void check_body(const detail::Body& body) {
  using detail::StmtKind;
  for (const auto& s : body) {
    switch (s->kind) {
      case StmtKind::kOutput:
        check_names(*static_cast<const detail::OutputStmt&>(*s).expr);
        break;
      case StmtKind::kIf: {
        const auto& i = static_cast<const detail::IfStmt&>(*s);
        for (const auto& [c, b] : i.branches) {
          check_names(*c);
          check_body(b);
        }
        check_body(i.else_body);
        break;
      }
      case StmtKind::kFor: {
        const auto& f = static_cast<const detail::ForStmt&>(*s);
        check_names(*f.iterable);
        if (f.filter) check_names(*f.filter);
        check_body(f.body);
        check_body(f.else_body);
        break;
      }
      case StmtKind::kSet:
        check_names(*static_cast<const detail::SetStmt&>(*s).value);
        break;
      case StmtKind::kBlockSet:
        check_filters(static_cast<const detail::BlockSetStmt&>(*s).filters);
        check_body(static_cast<const detail::BlockSetStmt&>(*s).body);
        break;
      case StmtKind::kMacro:
        check_params(static_cast<const detail::MacroStmt&>(*s).params);
        check_body(static_cast<const detail::MacroStmt&>(*s).body);
        break;
      case StmtKind::kCallBlock: {
        const auto& c = static_cast<const detail::CallBlockStmt&>(*s);
        check_params(c.caller_params);
        check_names(*c.call);
        check_body(c.body);
        break;
      }
      case StmtKind::kFilterBlock:
        check_filters(static_cast<const detail::FilterBlockStmt&>(*s).filters);
        check_body(static_cast<const detail::FilterBlockStmt&>(*s).body);
        break;
      case StmtKind::kScope: {
        const auto& scope = static_cast<const detail::ScopeStmt&>(*s);
        for (const auto& [_, e] : scope.assignments) check_names(*e);
        check_body(scope.body);
        break;
      }
      case StmtKind::kText:
      case StmtKind::kBreak:
      case StmtKind::kContinue:
        break;
    }
  }
}

// Loop controls outside a loop are syntax errors, as Jinja's parser reports them.
void check_loop_controls(const detail::Body& body, bool in_loop) {
  using detail::StmtKind;
  for (const auto& s : body) {
    switch (s->kind) {
      case StmtKind::kBreak:
      case StmtKind::kContinue:
        if (!in_loop) {
          detail::fail_at(s->pos, std::string("'") +
                                      (s->kind == StmtKind::kBreak ? "break" : "continue") +
                                      "' outside of a loop");
        }
        break;
      case StmtKind::kIf: {
        const auto& i = static_cast<const detail::IfStmt&>(*s);
        for (const auto& [_, b] : i.branches) check_loop_controls(b, in_loop);
        check_loop_controls(i.else_body, in_loop);
        break;
      }
      case StmtKind::kFor: {
        const auto& f = static_cast<const detail::ForStmt&>(*s);
        check_loop_controls(f.body, true);
        check_loop_controls(f.else_body, in_loop);
        break;
      }
      case StmtKind::kBlockSet:
        check_loop_controls(static_cast<const detail::BlockSetStmt&>(*s).body, in_loop);
        break;
      case StmtKind::kMacro:
        check_loop_controls(static_cast<const detail::MacroStmt&>(*s).body, false);
        break;
      case StmtKind::kCallBlock:
        check_loop_controls(static_cast<const detail::CallBlockStmt&>(*s).body, false);
        break;
      case StmtKind::kFilterBlock:
        check_loop_controls(static_cast<const detail::FilterBlockStmt&>(*s).body, in_loop);
        break;
      case StmtKind::kScope:
        check_loop_controls(static_cast<const detail::ScopeStmt&>(*s).body, in_loop);
        break;
      default:
        break;
    }
  }
}

}  // namespace

Template::Template(std::shared_ptr<const Parsed> parsed) : parsed_(std::move(parsed)) {}
Template::Template(Template&&) noexcept = default;
Template& Template::operator=(Template&&) noexcept = default;
Template::Template(const Template&) = default;
Template& Template::operator=(const Template&) = default;
Template::~Template() = default;

const std::string& Template::name() const { return parsed_->name; }
const std::string& Template::source() const { return parsed_->source; }

Result<Template> Template::parse(std::string_view source, std::string_view name,
                                 const TemplateOptions& options) {
  auto parsed = std::make_shared<Parsed>();
  parsed->name = std::string(name);
  parsed->source = std::string(source);
  parsed->options = options;
  try {
    detail::LexOptions lex{options.trim_blocks, options.lstrip_blocks,
                           options.keep_trailing_newline};
    parsed->body = detail::parse_tokens(detail::tokenize(source, lex), options.limits.max_depth);
    check_body(parsed->body);
    check_loop_controls(parsed->body, false);
  } catch (const TemplateError& e) {
    return to_status(e, name);
  } catch (const std::bad_alloc&) {
    return Status::ResourceExhausted(std::string(name) + ": out of memory while parsing",
                                     Exhaustion{});
  } catch (const std::exception& e) {
    return Status::InvalidArgument(std::string(name) + ": " + e.what());
  }
  return Template(std::move(parsed));
}

Result<std::string> Template::render(std::string_view context_json,
                                     const RenderHooks& hooks) const {
  const Parsed& p = *parsed_;
  nlohmann::ordered_json context = nlohmann::ordered_json::parse(context_json, nullptr,
                                                                 /*allow_exceptions=*/false);
  if (context.is_discarded() || !context.is_object()) {
    return Status::InvalidArgument(p.name + ": the render context must be a JSON object");
  }
  try {
    Value vars = from_json(context, 0, p.options.limits.max_depth);
    detail::Interpreter interpreter(p.options.limits, hooks);
    return interpreter.render(p.body, std::move(vars));
  } catch (const TemplateError& e) {
    return to_status(e, p.name);
  } catch (const std::bad_alloc&) {
    return Status::ResourceExhausted(p.name + ": out of memory while rendering", Exhaustion{});
  } catch (const std::exception& e) {
    return Status::InvalidArgument(p.name + ": " + e.what());
  }
}

}  // namespace kvvm::jinja
