// The built-in tests (`x is defined`, `n is divisibleby 3`, ...).
#include <algorithm>
#include <cmath>
#include <string>

#include "jinja/render.h"
#include "jinja/text.h"

namespace kvvm::jinja::detail {

namespace {

using TestFn = bool (*)(Interpreter&, const Value&, CallArgs&);

const Value& need_arg(const CallArgs& args, std::string_view test) {
  const Value* v = find_arg(args, 0, "other");
  if (v == nullptr) v = find_arg(args, 0, "value");
  if (v == nullptr) v = find_arg(args, 0, "num");
  if (v == nullptr) fail("test '" + std::string(test) + "' needs an argument");
  return *v;
}

bool t_defined(Interpreter&, const Value& v, CallArgs&) { return !v.is_undefined(); }
bool t_undefined(Interpreter&, const Value& v, CallArgs&) { return v.is_undefined(); }
bool t_none(Interpreter&, const Value& v, CallArgs&) { return v.is_none(); }
bool t_boolean(Interpreter&, const Value& v, CallArgs&) { return v.is_bool(); }
bool t_true(Interpreter&, const Value& v, CallArgs&) { return v.is_bool() && v.as_bool(); }
bool t_false(Interpreter&, const Value& v, CallArgs&) { return v.is_bool() && !v.as_bool(); }
bool t_integer(Interpreter&, const Value& v, CallArgs&) { return v.is_int(); }
bool t_float(Interpreter&, const Value& v, CallArgs&) { return v.is_float(); }
bool t_number(Interpreter&, const Value& v, CallArgs&) { return v.is_number(); }
bool t_string(Interpreter&, const Value& v, CallArgs&) { return v.is_string(); }
bool t_mapping(Interpreter&, const Value& v, CallArgs&) { return v.is_dict(); }
bool t_iterable(Interpreter&, const Value& v, CallArgs&) {
  return v.is_string() || v.is_list() || v.is_dict() || v.is_undefined();
}
bool t_sequence(Interpreter&, const Value& v, CallArgs&) {
  return v.is_string() || v.is_list() || v.is_dict();
}
bool t_callable(Interpreter&, const Value& v, CallArgs&) { return v.is_callable(); }
bool t_escaped(Interpreter&, const Value&, CallArgs&) { return false; }

std::int64_t int_of(const Value& v, std::string_view test) {
  if (!v.is_int() && !v.is_bool()) {
    if (v.is_float() && std::floor(v.as_float()) == v.as_float())
      return static_cast<std::int64_t>(v.as_float());
    fail("test '" + std::string(test) + "' needs an integer, got " + std::string(v.type_name()));
  }
  return v.as_int();
}
bool t_odd(Interpreter&, const Value& v, CallArgs&) { return int_of(v, "odd") % 2 != 0; }
bool t_even(Interpreter&, const Value& v, CallArgs&) { return int_of(v, "even") % 2 == 0; }
bool t_divisibleby(Interpreter&, const Value& v, CallArgs& args) {
  const Value& n = need_arg(args, "divisibleby");
  if (n.is_number() && n.as_float() == 0) fail("integer division or modulo by zero");
  if (v.is_float() || n.is_float()) return std::fmod(v.as_float(), n.as_float()) == 0;
  return int_of(v, "divisibleby") % int_of(n, "divisibleby") == 0;
}
bool t_eq(Interpreter&, const Value& v, CallArgs& a) { return v.equals(need_arg(a, "eq")); }
bool t_ne(Interpreter&, const Value& v, CallArgs& a) { return !v.equals(need_arg(a, "ne")); }
bool t_lt(Interpreter&, const Value& v, CallArgs& a) {
  return compare_values(v, need_arg(a, "lt")) < 0;
}
bool t_le(Interpreter&, const Value& v, CallArgs& a) {
  return compare_values(v, need_arg(a, "le")) <= 0;
}
bool t_gt(Interpreter&, const Value& v, CallArgs& a) {
  return compare_values(v, need_arg(a, "gt")) > 0;
}
bool t_ge(Interpreter&, const Value& v, CallArgs& a) {
  return compare_values(v, need_arg(a, "ge")) >= 0;
}
bool t_in(Interpreter&, const Value& v, CallArgs& a) { return contains(need_arg(a, "in"), v); }
bool t_sameas(Interpreter&, const Value& v, CallArgs& a) {
  const Value& o = need_arg(a, "sameas");
  // `is` identity: singletons compare equal; other objects only to themselves.
  if (v.is_none() || v.is_bool() || v.is_undefined()) return v.kind() == o.kind() && v.equals(o);
  return false;
}
// str.islower() / str.isupper(): every cased character in that case, and at least one.
bool t_lower(Interpreter&, const Value& v, CallArgs&) {
  return v.is_string() && py_lower(v.as_string()) == v.as_string() &&
         py_upper(v.as_string()) != v.as_string();
}
bool t_upper(Interpreter&, const Value& v, CallArgs&) {
  return v.is_string() && py_upper(v.as_string()) == v.as_string() &&
         py_lower(v.as_string()) != v.as_string();
}
bool t_filter(Interpreter&, const Value& v, CallArgs&) {
  return v.is_string() && has_filter(v.as_string());
}
bool t_test(Interpreter&, const Value& v, CallArgs&) {
  return v.is_string() && has_test(v.as_string());
}

struct TestEntry {
  std::string_view name;
  TestFn fn;
};

constexpr TestEntry kTests[] = {
    {"!=", t_ne},
    {"<", t_lt},
    {"<=", t_le},
    {"==", t_eq},
    {">", t_gt},
    {">=", t_ge},
    {"boolean", t_boolean},
    {"callable", t_callable},
    {"defined", t_defined},
    {"divisibleby", t_divisibleby},
    {"eq", t_eq},
    {"equalto", t_eq},
    {"escaped", t_escaped},
    {"even", t_even},
    {"false", t_false},
    {"filter", t_filter},
    {"float", t_float},
    {"ge", t_ge},
    {"greaterthan", t_gt},
    {"gt", t_gt},
    {"in", t_in},
    {"integer", t_integer},
    {"iterable", t_iterable},
    {"le", t_le},
    {"lessthan", t_lt},
    {"lower", t_lower},
    {"lt", t_lt},
    {"mapping", t_mapping},
    {"ne", t_ne},
    {"none", t_none},
    {"number", t_number},
    {"odd", t_odd},
    {"sameas", t_sameas},
    {"sequence", t_sequence},
    {"string", t_string},
    {"test", t_test},
    {"true", t_true},
    {"undefined", t_undefined},
    {"upper", t_upper},
};

TestFn find_test(std::string_view name) {
  for (const TestEntry& e : kTests) {
    if (e.name == name) return e.fn;
  }
  return nullptr;
}

}  // namespace

bool has_test(std::string_view name) { return find_test(name) != nullptr; }

bool apply_test(Interpreter& in, std::string_view name, const Value& operand, CallArgs& args) {
  TestFn fn = find_test(name);
  if (fn == nullptr) fail("No test named '" + std::string(name) + "'");
  // Tests that compare take exactly one argument; the others none, as their Python
  // signatures say.
  static constexpr std::string_view kOneArgument[] = {
      "!=", "<",           "<=", "==", ">",  ">=",       "divisibleby", "eq", "equalto",
      "ge", "greaterthan", "gt", "in", "le", "lessthan", "lt",          "ne", "sameas"};
  bool one =
      std::find(std::begin(kOneArgument), std::end(kOneArgument), name) != std::end(kOneArgument);
  std::size_t given = args.positional.size() + args.keywords.size();
  if (given != (one ? 1u : 0u)) {
    fail("test '" + std::string(name) + "' takes " + (one ? "one argument" : "no arguments") +
         ", " + std::to_string(given) + " given");
  }
  return fn(in, operand, args);
}

}  // namespace kvvm::jinja::detail
