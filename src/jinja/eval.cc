// Expressions: names, operators, attribute and item access, slices, calls, filters and tests.
#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <utility>

#include "jinja/render.h"

namespace kvvm::jinja::detail {

DepthScope::DepthScope(Interpreter& in) : in_(in) {
  if (++in_.depth_ > in_.limits_.max_depth) {
    --in_.depth_;
    exhausted("render nesting", "max_depth", in_.depth_ + 1, in_.limits_.max_depth);
  }
}

void Interpreter::step(std::uint64_t n) {
  steps_ += n;
  if (steps_ > limits_.max_steps) {
    exhausted("render", "max_steps", steps_, limits_.max_steps);
  }
}

void Interpreter::charge(const Value& v) {
  switch (v.kind()) {
    case Kind::kString:
      step(v.as_string().size() / 16);
      break;
    case Kind::kList:
      step(v.as_list().size());
      break;
    case Kind::kDict:
      step(v.as_dict().size());
      break;
    default:
      break;
  }
}

void Interpreter::check_size(std::size_t size) const {
  if (size > limits_.max_output_bytes) {
    exhausted("a value of " + std::to_string(size) + " bytes", "max_output_bytes", size,
              limits_.max_output_bytes);
  }
}

Value Interpreter::get_attr(const Value& object, std::string_view name) {
  // The sandbox: no Python attribute is reachable, only a value's data (a dict's items, a
  // namespace's attributes) and the methods has_method() lists, none named with '_'. Jinja's
  // sandbox gives undefined for an unsafe attribute too; using it further is an error.
  switch (object.kind()) {
    case Kind::kUndefined:
      fail_undefined(object);
    case Kind::kNamespace:
      for (const auto& [k, v] : object.as_namespace().attributes) {
        if (k == name) return v;
      }
      break;
    case Kind::kLoop: {
      const LoopState& l = object.as_loop();
      if (name == "index") return Value::integer(l.index0 + 1);
      if (name == "index0") return Value::integer(l.index0);
      if (name == "revindex") return Value::integer(l.length - l.index0);
      if (name == "revindex0") return Value::integer(l.length - l.index0 - 1);
      if (name == "first") return Value::boolean(l.index0 == 0);
      if (name == "last") return Value::boolean(l.index0 == l.length - 1);
      if (name == "length") return Value::integer(l.length);
      if (name == "depth") return Value::integer(l.depth0 + 1);
      if (name == "depth0") return Value::integer(l.depth0);
      const List& items = l.items.as_list();
      if (name == "previtem") {
        if (l.index0 == 0) return Value::undefined("there is no previous item");
        return items[static_cast<std::size_t>(l.index0 - 1)];
      }
      if (name == "nextitem") {
        if (l.index0 + 1 >= l.length) return Value::undefined("there is no next item");
        return items[static_cast<std::size_t>(l.index0 + 1)];
      }
      if (name == "changed") {
        auto state = std::static_pointer_cast<const LoopState>(object.loop_state());
        track(state);
        return Value::callable("changed", [state](Interpreter&, CallArgs& args) {
          List now = args.positional;
          bool changed =
              !state->last_changed || !Value::list(*state->last_changed).equals(Value::list(now));
          if (changed) state->last_changed = std::make_shared<const List>(std::move(now));
          return Value::boolean(changed);
        });
      }
      if (name == "cycle") {
        std::int64_t index0 = l.index0;
        return Value::callable("cycle", [index0](Interpreter&, CallArgs& args) {
          if (args.positional.empty()) fail("no items for cycling given");
          return args.positional[static_cast<std::size_t>(index0) % args.positional.size()];
        });
      }
      break;
    }
    case Kind::kDict:
    case Kind::kString:
    case Kind::kList:
      if (has_method(object, name)) {
        Value receiver = object;
        std::string method(name);
        return Value::callable(method, [receiver, method](Interpreter& in, CallArgs& args) {
          Value result;
          call_method(in, receiver, method, args, result);
          return result;
        });
      }
      if (object.is_dict()) {
        if (const Value* v = object.find(name)) return *v;
      }
      break;
    default:
      break;
  }
  return Value::undefined(quoted(std::string(object.type_name()) + " object") +
                          " has no attribute " + quoted(name));
}

Value Interpreter::get_item(const Value& object, const Value& index) {
  switch (object.kind()) {
    case Kind::kUndefined:
      fail_undefined(object);
    case Kind::kDict:
      if (const Value* v = object.find(index)) return *v;
      break;
    case Kind::kList:
    case Kind::kString:
      if (index.is_int() || index.is_bool()) {
        std::int64_t i = index.as_int();
        if (object.is_list()) {
          auto n = static_cast<std::int64_t>(object.as_list().size());
          if (i < 0) i += n;
          if (i >= 0 && i < n) return object.as_list()[static_cast<std::size_t>(i)];
        } else {
          const std::string& s = object.as_string();
          auto n = static_cast<std::int64_t>(utf8_length(s));
          if (i < 0) i += n;
          if (i >= 0 && i < n) {
            step(static_cast<std::uint64_t>(i) / 64);
            std::size_t pos = 0;
            for (std::int64_t k = 0; k < i; ++k) decode_at(s, pos);
            std::size_t start = pos;
            decode_at(s, pos);
            return Value::string(s.substr(start, pos - start));
          }
        }
        return Value::undefined(quoted(std::string(object.type_name()) + " object") +
                                " has no element " + index.repr());
      }
      break;
    default:
      break;
  }
  if (index.is_string()) return get_attr(object, index.as_string());
  return Value::undefined(quoted(std::string(object.type_name()) + " object") + " has no element " +
                          index.repr());
}

Value Interpreter::lookup(std::string_view name) {
  for (Frame* f = frame_.get(); f != nullptr; f = f->parent.get()) {
    if (Value* v = f->find(name)) return *v;
  }
  if (const Value* v = context_.find(name)) return *v;
  Value g = builtin_global(name);
  if (!g.is_undefined()) return g;
  return Value::undefined(quoted(name) + " is undefined");
}

void Interpreter::eval_args(const Arguments& args, CallArgs& out) {
  out.positional.reserve(args.positional.size());
  for (const ExprPtr& e : args.positional) out.positional.push_back(eval(*e));
  for (const auto& [k, e] : args.keywords) out.keywords.emplace_back(k, eval(*e));
  if (args.star) {
    Value extra = eval(*args.star);
    for (Value& v : iterate(*this, extra)) out.positional.push_back(std::move(v));
  }
  if (args.star_star) {
    Value extra = eval(*args.star_star);
    if (!extra.is_dict())
      fail("argument after ** must be a mapping, not " + quoted(extra.type_name()));
    for (const auto& [k, v] : extra.as_dict()) {
      if (!k.is_string()) fail("keywords must be strings");
      out.keywords.emplace_back(k.as_string(), v);
    }
  }
}

Value Interpreter::call(const Value& callee, CallArgs& args) {
  step();
  DepthScope depth(*this);
  if (callee.is_undefined()) fail_undefined(callee);
  if (callee.is_loop()) return call_loop(callee.as_loop(), args);
  if (!callee.is_callable()) fail(quoted(callee.type_name()) + " object is not callable");
  return callee.as_callable().call(*this, args);
}

Value Interpreter::eval_call(const CallExpr& e) {
  CallArgs args;
  // obj.method(...) calls the method without building a bound method first.
  if (e.callee->kind == ExprKind::kGetAttr) {
    const auto& attr = static_cast<const GetAttrExpr&>(*e.callee);
    Value receiver = eval(*attr.object);
    if ((receiver.is_string() || receiver.is_dict() || receiver.is_list()) &&
        has_method(receiver, attr.name)) {
      eval_args(e.args, args);
      step();
      if (attr.name != "get") charge(receiver);
      Value result;
      call_method(*this, receiver, attr.name, args, result);
      if (result.is_string()) check_size(result.as_string().size());
      charge(result);
      return result;
    }
    Value callee = get_attr(receiver, attr.name);
    eval_args(e.args, args);
    return call(callee, args);
  }
  Value callee = eval(*e.callee);
  eval_args(e.args, args);
  return call(callee, args);
}

Value Interpreter::eval_binary(const BinaryExpr& e) {
  if (e.op == BinaryOp::kAnd) {
    Value left = eval(*e.left);
    return left.truthy() ? eval(*e.right) : left;
  }
  if (e.op == BinaryOp::kOr) {
    Value left = eval(*e.left);
    return left.truthy() ? left : eval(*e.right);
  }
  Value left = eval(*e.left);
  Value right = eval(*e.right);
  Value result = binary_op(e.op, left, right, *this);
  charge(result);
  return result;
}

Value Interpreter::eval_compare(const CompareExpr& e) {
  Value left = eval(*e.left);
  for (const auto& [op, expr] : e.rest) {
    Value right = eval(*expr);
    // Membership scans the container, equality walks both sides.
    charge(op == CompareOp::kIn || op == CompareOp::kNotIn ? right : left);
    bool ok = false;
    switch (op) {
      case CompareOp::kEq:
        ok = left.equals(right);
        break;
      case CompareOp::kNe:
        ok = !left.equals(right);
        break;
      case CompareOp::kLt:
        ok = compare_values(left, right) < 0;
        break;
      case CompareOp::kLe:
        ok = compare_values(left, right) <= 0;
        break;
      case CompareOp::kGt:
        ok = compare_values(left, right) > 0;
        break;
      case CompareOp::kGe:
        ok = compare_values(left, right) >= 0;
        break;
      case CompareOp::kIn:
        ok = contains(right, left);
        break;
      case CompareOp::kNotIn:
        ok = !contains(right, left);
        break;
    }
    if (!ok) return Value::boolean(false);
    left = std::move(right);
  }
  return Value::boolean(true);
}

Value Interpreter::eval_slice(const SliceExpr& e) {
  Value object = eval(*e.object);
  auto bound = [&](const ExprPtr& x) -> std::optional<std::int64_t> {
    if (!x) return std::nullopt;
    Value v = eval(*x);
    if (v.is_none()) return std::nullopt;
    if (!v.is_int() && !v.is_bool()) fail("slice indices must be integers or None");
    return v.as_int();
  };
  std::optional<std::int64_t> start = bound(e.start);
  std::optional<std::int64_t> stop = bound(e.stop);
  std::int64_t step_by = bound(e.step).value_or(1);
  if (step_by == 0) fail("slice step cannot be zero");
  if (object.is_undefined()) fail_undefined(object);
  // Strings slice by code point, as Python's do.
  std::int64_t n = 0;
  if (object.is_list()) {
    n = static_cast<std::int64_t>(object.as_list().size());
  } else if (object.is_string()) {
    n = static_cast<std::int64_t>(utf8_length(object.as_string()));
  } else {
    fail(quoted(object.type_name()) + " object is not subscriptable");
  }
  charge(object);
  auto clamp = [&](std::optional<std::int64_t> v, std::int64_t dflt) {
    if (!v) return dflt;
    std::int64_t x = *v;
    if (x < 0) x += n;
    if (step_by > 0) return std::clamp<std::int64_t>(x, 0, n);
    return std::clamp<std::int64_t>(x, -1, n - 1);
  };
  std::int64_t lo = clamp(start, step_by > 0 ? 0 : n - 1);
  std::int64_t hi = clamp(stop, step_by > 0 ? n : -1);
  auto picked = [&](auto&& visit) {
    if (step_by > 0) {
      for (std::int64_t i = lo; i < hi; i += step_by) visit(i);
    } else {
      for (std::int64_t i = lo; i > hi; i += step_by) visit(i);
    }
  };
  if (object.is_list()) {
    const List& items = object.as_list();
    List out;
    picked([&](std::int64_t i) { out.push_back(items[static_cast<std::size_t>(i)]); });
    return Value::list(std::move(out), object.is_tuple());
  }
  const std::string& s = object.as_string();
  auto offset_of = [&](std::int64_t cp) {  // byte offset of code point `cp`
    std::size_t pos = 0;
    for (std::int64_t k = 0; k < cp && pos < s.size(); ++k) decode_at(s, pos);
    return pos;
  };
  if (step_by == 1) {
    if (lo >= hi) return Value::string("");
    std::size_t a = offset_of(lo);
    std::size_t b = a;
    for (std::int64_t k = lo; k < hi && b < s.size(); ++k) decode_at(s, b);
    return Value::string(s.substr(a, b - a));
  }
  // Other steps: the code points' offsets once, then pick.
  std::vector<std::size_t> offsets;
  offsets.reserve(static_cast<std::size_t>(n) + 1);
  for (std::size_t i = 0; i < s.size();) {
    offsets.push_back(i);
    decode_at(s, i);
  }
  offsets.push_back(s.size());
  std::string out;
  picked([&](std::int64_t i) {
    auto a = offsets[static_cast<std::size_t>(i)];
    out.append(s, a, offsets[static_cast<std::size_t>(i) + 1] - a);
  });
  return Value::string(std::move(out));
}

Value Interpreter::eval(const Expr& e) {
  DepthScope depth(*this);
  try {
    switch (e.kind) {
      case ExprKind::kLiteral:
        return static_cast<const LiteralExpr&>(e).value;
      case ExprKind::kName:
        return lookup(static_cast<const NameExpr&>(e).name);
      case ExprKind::kList: {
        const auto& l = static_cast<const ListExpr&>(e);
        List items;
        items.reserve(l.items.size());
        for (const ExprPtr& item : l.items) items.push_back(eval(*item));
        return Value::list(std::move(items), l.tuple);
      }
      case ExprKind::kDict: {
        const auto& d = static_cast<const DictExpr&>(e);
        Dict items;
        for (const auto& [k, v] : d.items) {
          Value key = eval(*k);
          Value value = eval(*v);
          bool replaced = false;
          for (auto& [ek, ev] : items) {
            if (ek.equals(key)) {
              ev = value;
              replaced = true;
            }
          }
          if (!replaced) items.emplace_back(std::move(key), std::move(value));
        }
        return Value::dict(std::move(items));
      }
      case ExprKind::kUnary: {
        const auto& u = static_cast<const UnaryExpr&>(e);
        Value v = eval(*u.operand);
        if (u.op == UnaryOp::kNot) return Value::boolean(!v.truthy());
        if (v.is_undefined()) fail_undefined(v);
        if (!v.is_number()) fail("bad operand type for unary -: " + quoted(v.type_name()));
        if (u.op == UnaryOp::kPos) return v.is_float() ? v : Value::integer(v.as_int());
        if (v.is_float()) return Value::floating(-v.as_float());
        if (v.as_int() == INT64_MIN) fail("integer overflow");
        return Value::integer(-v.as_int());
      }
      case ExprKind::kBinary:
        return eval_binary(static_cast<const BinaryExpr&>(e));
      case ExprKind::kCompare:
        return eval_compare(static_cast<const CompareExpr&>(e));
      case ExprKind::kConditional: {
        const auto& c = static_cast<const ConditionalExpr&>(e);
        if (eval(*c.condition).truthy()) return eval(*c.then_expr);
        if (c.else_expr) return eval(*c.else_expr);
        return Value::undefined(
            "the inline if-expression evaluated to false and no else "
            "section was defined.");
      }
      case ExprKind::kGetAttr: {
        const auto& a = static_cast<const GetAttrExpr&>(e);
        return get_attr(eval(*a.object), a.name);
      }
      case ExprKind::kGetItem: {
        const auto& g = static_cast<const GetItemExpr&>(e);
        Value object = eval(*g.object);
        return get_item(object, eval(*g.index));
      }
      case ExprKind::kSlice:
        return eval_slice(static_cast<const SliceExpr&>(e));
      case ExprKind::kCall:
        return eval_call(static_cast<const CallExpr&>(e));
      case ExprKind::kFilter: {
        const auto& f = static_cast<const FilterExpr&>(e);
        Value operand = eval(*f.operand);
        CallArgs args;
        eval_args(f.args, args);
        step();
        // Filters that read no more than a value's first or last item cost one step.
        if (f.name != "length" && f.name != "count" && f.name != "default" && f.name != "d" &&
            f.name != "first" && f.name != "last" && f.name != "safe") {
          charge(operand);
        }
        Value result = apply_filter(*this, f.name, operand, args);
        if (result.is_string()) check_size(result.as_string().size());
        charge(result);
        return result;
      }
      case ExprKind::kTest: {
        const auto& t = static_cast<const TestExpr&>(e);
        Value operand = eval(*t.operand);
        CallArgs args;
        eval_args(t.args, args);
        step();
        return Value::boolean(apply_test(*this, t.name, operand, args) != t.negated);
      }
    }
  } catch (TemplateError& error) {
    if (error.pos.line == 0) error.pos = e.pos;
    throw;
  }
  fail("bad expression");
}

}  // namespace kvvm::jinja::detail
