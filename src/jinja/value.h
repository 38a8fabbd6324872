// The values a template computes with, modelled on the Python objects Jinja hands around: their
// truthiness, equality, ordering and str()/repr() text are Python's, so that printed output
// matches byte for byte.
//
// Strings, lists and dicts are shared, immutable once built (the sandbox refuses every mutating
// method, as transformers' ImmutableSandboxedEnvironment does), so copying a Value is cheap and
// a render never deep-copies a conversation. Namespaces are the one mutable object.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace kvvm::jinja::detail {

class Value;
class Interpreter;
struct ForStmt;
struct LoopState;

using List = std::vector<Value>;
using Dict = std::vector<std::pair<Value, Value>>;  // insertion order, as Python dicts keep it

// Positional and keyword arguments of a call.
struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keywords;
};

// A global function, a bound method, a macro, caller() or loop.cycle.
struct Callable {
  std::string name;
  std::function<Value(Interpreter&, CallArgs&)> call;
};

// namespace(): attributes a template may assign across loop scopes.
struct Namespace {
  std::vector<std::pair<std::string, Value>> attributes;
};

// The deepest a list or dict may nest. A template can build nesting in a loop
// ({% set ns.x = [ns.x] %}); printing, comparing and freeing recurse over it, so it is bounded
// well inside any thread's stack.
inline constexpr std::int64_t kMaxNesting = 1000;

enum class Kind : std::uint8_t {
  kUndefined,
  kNone,
  kBool,
  kInt,
  kFloat,
  kString,
  kList,
  kDict,
  kCallable,
  kNamespace,
  kLoop,
};

class Value {
 public:
  Value() = default;  // undefined
  static Value undefined(std::string hint = {});
  static Value none();
  static Value boolean(bool b);
  static Value integer(std::int64_t i);
  static Value floating(double d);
  static Value string(std::string s);
  static Value list(List items, bool tuple = false);
  static Value dict(Dict items);
  static Value callable(std::string name, std::function<Value(Interpreter&, CallArgs&)> fn);
  static Value ns(std::shared_ptr<Namespace> n);
  static Value loop(std::shared_ptr<const LoopState> state);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::kUndefined; }
  bool is_none() const { return kind_ == Kind::kNone; }
  bool is_bool() const { return kind_ == Kind::kBool; }
  bool is_int() const { return kind_ == Kind::kInt; }
  bool is_float() const { return kind_ == Kind::kFloat; }
  bool is_number() const { return kind_ == Kind::kInt || kind_ == Kind::kFloat || is_bool(); }
  bool is_string() const { return kind_ == Kind::kString; }
  bool is_list() const { return kind_ == Kind::kList; }
  bool is_tuple() const { return kind_ == Kind::kList && tuple_; }
  bool is_dict() const { return kind_ == Kind::kDict; }
  bool is_callable() const { return kind_ == Kind::kCallable; }
  bool is_namespace() const { return kind_ == Kind::kNamespace; }
  bool is_loop() const { return kind_ == Kind::kLoop; }

  bool as_bool() const { return int_ != 0; }
  std::int64_t nesting() const { return int_; }  // lists and dicts: 1 + their items' deepest
  std::int64_t as_int() const { return int_; }   // bools too (Python's bool is an int)
  double as_float() const { return kind_ == Kind::kFloat ? float_ : static_cast<double>(int_); }
  const std::string& as_string() const;
  const List& as_list() const;
  const Dict& as_dict() const;
  const Callable& as_callable() const;
  Namespace& as_namespace() const;
  const LoopState& as_loop() const;
  std::shared_ptr<const void> loop_state() const { return ptr_; }
  // Why an undefined value is undefined ("'x' is undefined"), for the error its use raises.
  const std::string& undefined_hint() const;

  // Python's bool(x).
  bool truthy() const;
  // Python's ==, with 1 == 1.0 == True.
  bool equals(const Value& other) const;

  // A dict's value for `key`, or nullptr.
  const Value* find(const Value& key) const;
  const Value* find(std::string_view key) const;

  // Python's str(x) and repr(x) text ("" for undefined, None, True, 1.0, ['a', 1]).
  std::string str() const;
  std::string repr() const;
  void append_str(std::string& out) const;
  void append_repr(std::string& out) const;

  // The Python type name an error message names ("str", "list", "dict", "NoneType").
  std::string_view type_name() const;

 private:
  Kind kind_ = Kind::kUndefined;
  bool tuple_ = false;
  std::int64_t int_ = 0;  // bool and int values; a list's or dict's nesting depth
  double float_ = 0;
  std::shared_ptr<const void> ptr_;  // string, list, dict, callable, namespace, loop, hint
};

// The state behind `loop` in a for body.
struct LoopState {
  Value items;  // the list iterated (after an `if` filter)
  std::int64_t index0 = 0;
  std::int64_t length = 0;
  std::int64_t depth0 = 0;             // recursive loops: how deep loop(...) calls went
  const ForStmt* recursive = nullptr;  // set when the loop is recursive
  // loop.changed(...): the arguments of its last call; written during the render that owns
  // the loop (one render's loops are never shared between threads).
  mutable std::shared_ptr<const List> last_changed;
};

// Python's float repr: shortest round-trip digits, "1.0", "0.1", "1e-05", "1e+16", "inf".
std::string format_float(double d);
// Python's repr of a str: quotes chosen as Python chooses, escapes as Python writes them.
void append_string_repr(std::string_view s, std::string& out);

// Decodes the UTF-8 sequence at s[i] and moves i past it; a malformed byte decodes as itself.
char32_t decode_at(std::string_view s, std::size_t& i);
// Appends a code point as UTF-8.
void append_utf8(char32_t cp, std::string& out);

// Number of code points of UTF-8 text (what Python's len() counts).
std::size_t utf8_length(std::string_view s);

}  // namespace kvvm::jinja::detail
