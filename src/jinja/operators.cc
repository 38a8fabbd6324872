// Python's operators and protocols on values: arithmetic, ordering, membership, iteration, and
// reading a call's arguments.
#include <algorithm>
#include <cmath>
#include <string>
#include <utility>

#include "jinja/render.h"

namespace kvvm::jinja::detail {

std::string quoted(std::string_view s) { return "'" + std::string(s) + "'"; }

namespace {

[[noreturn]] void fail_operands(std::string_view op, const Value& a, const Value& b) {
  fail("unsupported operand type(s) for " + std::string(op) + ": " + quoted(a.type_name()) +
       " and " + quoted(b.type_name()));
}

// Python's ints do not overflow; ours report it instead of wrapping.
std::int64_t checked_add(std::int64_t a, std::int64_t b) {
  std::int64_t r = 0;
  if (__builtin_add_overflow(a, b, &r)) fail("integer overflow");
  return r;
}
std::int64_t checked_sub(std::int64_t a, std::int64_t b) {
  std::int64_t r = 0;
  if (__builtin_sub_overflow(a, b, &r)) fail("integer overflow");
  return r;
}
std::int64_t checked_mul(std::int64_t a, std::int64_t b) {
  std::int64_t r = 0;
  if (__builtin_mul_overflow(a, b, &r)) fail("integer overflow");
  return r;
}

// Python's floor division and modulo (the result takes the divisor's sign).
std::int64_t floor_div(std::int64_t a, std::int64_t b) {
  if (a == INT64_MIN && b == -1) fail("integer overflow");
  std::int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}
std::int64_t floor_mod(std::int64_t a, std::int64_t b) {
  if (b == -1) return 0;
  std::int64_t r = a % b;
  if (r != 0 && ((r < 0) != (b < 0))) r += b;
  return r;
}

Value repeat(const Value& seq, std::int64_t n, Interpreter& in) {
  if (n < 0) n = 0;
  if (seq.is_string()) {
    const std::string& s = seq.as_string();
    if (n > 0 && s.size() > 0) in.check_size(s.size() * static_cast<std::size_t>(n));
    std::string out;
    for (std::int64_t i = 0; i < n; ++i) out += s;
    return Value::string(std::move(out));
  }
  const List& items = seq.as_list();
  if (n > 0 && !items.empty()) in.check_size(items.size() * static_cast<std::size_t>(n));
  List out;
  for (std::int64_t i = 0; i < n; ++i) out.insert(out.end(), items.begin(), items.end());
  return Value::list(std::move(out), seq.is_tuple());
}

}  // namespace

[[noreturn]] void fail_undefined(const Value& v) {
  fail(v.undefined_hint().empty() ? "value is undefined" : v.undefined_hint());
}

Value binary_op(BinaryOp op, const Value& a, const Value& b, Interpreter& in) {
  if (a.is_undefined() && op != BinaryOp::kConcat) fail_undefined(a);
  if (b.is_undefined() && op != BinaryOp::kConcat) fail_undefined(b);
  bool ints = (a.is_int() || a.is_bool()) && (b.is_int() || b.is_bool());
  bool nums = a.is_number() && b.is_number();
  switch (op) {
    case BinaryOp::kConcat: {
      std::string s = a.str();
      b.append_str(s);
      in.check_size(s.size());
      return Value::string(std::move(s));
    }
    case BinaryOp::kAdd:
      if (ints) return Value::integer(checked_add(a.as_int(), b.as_int()));
      if (nums) return Value::floating(a.as_float() + b.as_float());
      if (a.is_string() && b.is_string()) {
        in.check_size(a.as_string().size() + b.as_string().size());
        return Value::string(a.as_string() + b.as_string());
      }
      if (a.is_list() && b.is_list() && a.is_tuple() == b.is_tuple()) {
        in.check_size(a.as_list().size() + b.as_list().size());
        List out = a.as_list();
        out.insert(out.end(), b.as_list().begin(), b.as_list().end());
        return Value::list(std::move(out), a.is_tuple());
      }
      fail_operands("+", a, b);
    case BinaryOp::kSub:
      if (ints) return Value::integer(checked_sub(a.as_int(), b.as_int()));
      if (nums) return Value::floating(a.as_float() - b.as_float());
      fail_operands("-", a, b);
    case BinaryOp::kMul:
      if (ints) return Value::integer(checked_mul(a.as_int(), b.as_int()));
      if (nums) return Value::floating(a.as_float() * b.as_float());
      if ((a.is_string() || a.is_list()) && (b.is_int() || b.is_bool())) {
        return repeat(a, b.as_int(), in);
      }
      if ((b.is_string() || b.is_list()) && (a.is_int() || a.is_bool())) {
        return repeat(b, a.as_int(), in);
      }
      fail_operands("*", a, b);
    case BinaryOp::kDiv:
      if (!nums) fail_operands("/", a, b);
      if (b.as_float() == 0) fail("division by zero");
      return Value::floating(a.as_float() / b.as_float());
    case BinaryOp::kFloorDiv:
      if (!nums) fail_operands("//", a, b);
      if (b.as_float() == 0) fail("integer division or modulo by zero");
      if (ints) return Value::integer(floor_div(a.as_int(), b.as_int()));
      return Value::floating(std::floor(a.as_float() / b.as_float()));
    case BinaryOp::kMod:
      if (a.is_string()) return Value::string(printf_format(a.as_string(), b, in));
      if (!nums) fail_operands("%", a, b);
      if (b.as_float() == 0) fail("integer division or modulo by zero");
      if (ints) return Value::integer(floor_mod(a.as_int(), b.as_int()));
      {
        double x = std::fmod(a.as_float(), b.as_float());
        if (x != 0 && ((x < 0) != (b.as_float() < 0))) x += b.as_float();
        return Value::floating(x);
      }
    case BinaryOp::kPow:
      if (!nums) fail_operands("**", a, b);
      if (ints && b.as_int() >= 0) {
        std::int64_t base = a.as_int();
        std::int64_t result = 1;
        for (std::int64_t e = b.as_int(); e > 0; --e) {
          if (__builtin_mul_overflow(result, base, &result)) fail("integer overflow");
          if (result == 0 || result == 1) break;
          if (result == -1) {
            result = (e % 2 == 1) ? -1 : 1;
            break;
          }
        }
        return Value::integer(result);
      }
      if (a.as_float() == 0 && b.as_float() < 0) fail("zero cannot be raised to a negative power");
      return Value::floating(std::pow(a.as_float(), b.as_float()));
    case BinaryOp::kAnd:
    case BinaryOp::kOr:
      break;
  }
  fail("bad operator");
}

int compare_values(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) {
      double x = a.as_float();
      double y = b.as_float();
      return x < y ? -1 : x > y ? 1 : 0;
    }
    return a.as_int() < b.as_int() ? -1 : a.as_int() > b.as_int() ? 1 : 0;
  }
  if (a.is_string() && b.is_string()) {
    int c = a.as_string().compare(b.as_string());
    return c < 0 ? -1 : c > 0 ? 1 : 0;
  }
  if (a.is_list() && b.is_list() && a.is_tuple() == b.is_tuple()) {
    const List& x = a.as_list();
    const List& y = b.as_list();
    for (std::size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (x[i].equals(y[i])) continue;
      return compare_values(x[i], y[i]);
    }
    return x.size() < y.size() ? -1 : x.size() > y.size() ? 1 : 0;
  }
  if (a.is_undefined()) fail_undefined(a);
  if (b.is_undefined()) fail_undefined(b);
  fail("'<' not supported between instances of " + quoted(a.type_name()) + " and " +
       quoted(b.type_name()));
}

bool contains(const Value& container, const Value& item) {
  switch (container.kind()) {
    case Kind::kString:
      if (!item.is_string()) {
        fail("'in <string>' requires string as left operand, not " + std::string(item.type_name()));
      }
      return container.as_string().find(item.as_string()) != std::string::npos;
    case Kind::kList:
      for (const Value& v : container.as_list()) {
        if (v.equals(item)) return true;
      }
      return false;
    case Kind::kDict:
      return container.find(item) != nullptr;
    case Kind::kUndefined:
      return false;
    default:
      fail("argument of type " + quoted(container.type_name()) + " is not iterable");
  }
}

List iterate(Interpreter& in, const Value& v) {
  switch (v.kind()) {
    case Kind::kList:
      return v.as_list();
    case Kind::kDict: {
      List keys;
      keys.reserve(v.as_dict().size());
      for (const auto& [k, _] : v.as_dict()) keys.push_back(k);
      return keys;
    }
    case Kind::kString: {
      List chars;
      const std::string& s = v.as_string();
      std::size_t n = utf8_length(s);
      in.check_size(n * sizeof(Value));
      in.step(n);
      chars.reserve(n);
      for (std::size_t i = 0; i < s.size();) {
        std::size_t start = i;
        decode_at(s, i);
        chars.push_back(Value::string(s.substr(start, i - start)));
      }
      return chars;
    }
    case Kind::kUndefined:
      return {};
    default:
      fail(quoted(v.type_name()) + " object is not iterable");
  }
}

const Value* find_arg(const CallArgs& args, std::size_t index, std::string_view name) {
  if (index < args.positional.size()) return &args.positional[index];
  for (const auto& [k, v] : args.keywords) {
    if (k == name) return &v;
  }
  return nullptr;
}

Value arg_or(const CallArgs& args, std::size_t index, std::string_view name, Value fallback) {
  const Value* v = find_arg(args, index, name);
  return v != nullptr ? *v : std::move(fallback);
}

}  // namespace kvvm::jinja::detail
