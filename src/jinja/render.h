// The interpreter: walks a parsed template with a render's variables, writing its output.
// One Interpreter per render (it holds the scopes and counters); the tree it walks is shared.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "jinja/ast.h"
#include "jinja/value.h"
#include "kvvm/jinja/template.h"

namespace kvvm::jinja::detail {

// Variables set in one scope: the template's top level, a loop iteration, a macro call.
struct Frame {
  std::shared_ptr<Frame> parent;
  std::vector<std::pair<std::string, Value>> vars;

  Value* find(std::string_view name) {
    for (auto& [k, v] : vars) {
      if (k == name) return &v;
    }
    return nullptr;
  }
  void set(std::string_view name, Value v) {
    if (Value* slot = find(name)) {
      *slot = std::move(v);
    } else {
      vars.emplace_back(std::string(name), std::move(v));
    }
  }
};

class Interpreter {
 public:
  Interpreter(const TemplateLimits& limits, const RenderHooks& hooks)
      : limits_(limits), hooks_(hooks) {}
  ~Interpreter();
  Interpreter(const Interpreter&) = delete;
  Interpreter& operator=(const Interpreter&) = delete;

  // Objects that can close a reference cycle (a scope holding a macro that holds the scope, a
  // namespace holding itself, loop.changed's last arguments): emptied when the render ends so
  // that everything it built is freed.
  void track(std::shared_ptr<Frame> frame) { frames_.push_back(std::move(frame)); }
  void track(std::shared_ptr<Namespace> ns) { namespaces_.push_back(std::move(ns)); }
  void track(std::shared_ptr<const LoopState> loop) { loops_.push_back(std::move(loop)); }

  // Renders `body` with `context` (a dict) as the template's variables.
  std::string render(const Body& body, Value context);

  Value eval(const Expr& e);
  Value call(const Value& callee, CallArgs& args);

  // Jinja's getattr (attribute first, then item) and getitem (item first, then attribute).
  Value get_attr(const Value& object, std::string_view name);
  Value get_item(const Value& object, const Value& index);

  // One unit of work against max_steps (`n` units for a bulk operation such as range()).
  void step(std::uint64_t n = 1);
  // A string or list about to be built with `size` bytes or items, against max_output_bytes.
  void check_size(std::size_t size) const;
  // Work in proportion to a value's size (copying, scanning), against max_steps: a bounded
  // number of steps cannot each move megabytes. A list counts its items, a string 16 bytes a
  // step.
  void charge(const Value& v);

  const RenderHooks& hooks() const { return hooks_; }
  std::size_t max_output_bytes() const { return limits_.max_output_bytes; }

 private:
  enum class Flow { kNormal, kBreak, kContinue };

  Flow exec(const Body& body);
  Flow exec_stmt(const Stmt& s);
  Flow exec_for(const struct ForStmt& s);
  Flow run_loop(const struct ForStmt& s, List items, std::int64_t depth0);
  // loop(children) in a recursive loop: the body again over `children`, one level deeper.
  Value call_loop(const LoopState& loop, CallArgs& args);
  void exec_set(const struct SetStmt& s);
  void assign(const std::vector<std::string>& targets, bool unpack, const std::string& attribute,
              Value v);
  Value make_macro(const struct MacroStmt& m);
  Value call_macro(const struct MacroStmt& m, const std::shared_ptr<Frame>& closure,
                   CallArgs& args);
  std::string capture(const Body& body);
  void write(std::string_view text);
  void write_value(const Value& v);

  Value lookup(std::string_view name);
  Value eval_binary(const struct BinaryExpr& e);
  Value eval_compare(const struct CompareExpr& e);
  Value eval_slice(const struct SliceExpr& e);
  Value eval_call(const struct CallExpr& e);
  void eval_args(const Arguments& args, CallArgs& out);

  friend class DepthScope;

  TemplateLimits limits_;
  const RenderHooks& hooks_;
  Value context_;
  std::shared_ptr<Frame> frame_;
  std::string* out_ = nullptr;
  std::uint64_t steps_ = 0;
  std::uint32_t depth_ = 0;
  std::vector<std::shared_ptr<Frame>> frames_;
  std::vector<std::shared_ptr<Namespace>> namespaces_;
  std::vector<std::shared_ptr<const LoopState>> loops_;
};

// Counts a nesting level against max_depth while alive.
class DepthScope {
 public:
  explicit DepthScope(Interpreter& in);
  ~DepthScope() { --in_.depth_; }
  DepthScope(const DepthScope&) = delete;
  DepthScope& operator=(const DepthScope&) = delete;

 private:
  Interpreter& in_;
};

// Python-like operations shared by the interpreter, filters and tests.
Value binary_op(BinaryOp op, const Value& a, const Value& b, Interpreter& in);
// -1, 0, 1; fails for values Python cannot order.
int compare_values(const Value& a, const Value& b);
bool contains(const Value& container, const Value& item);
// The items iterating `v` yields (a dict's keys, a string's characters); fails when not
// iterable. Undefined iterates as empty. A string's characters count against the limits.
List iterate(Interpreter& in, const Value& v);
[[noreturn]] void fail_undefined(const Value& v);
// 's', quoted for an error message.
std::string quoted(std::string_view s);

// Argument `index` (positional) or `name` (keyword) of a call, or nullptr.
const Value* find_arg(const CallArgs& args, std::size_t index, std::string_view name);
Value arg_or(const CallArgs& args, std::size_t index, std::string_view name, Value fallback);

// The built-in filters, tests and methods (filters.cc, jinja_tests.cc, methods.cc).
Value apply_filter(Interpreter& in, std::string_view name, const Value& operand, CallArgs& args);
bool has_filter(std::string_view name);
bool apply_test(Interpreter& in, std::string_view name, const Value& operand, CallArgs& args);
bool has_test(std::string_view name);
// Calls `receiver.name(args)` for a str, dict or list method; false when there is none.
bool call_method(Interpreter& in, const Value& receiver, std::string_view name, CallArgs& args,
                 Value& result);
bool has_method(const Value& receiver, std::string_view name);

// Python's `format % args`: a tuple gives the arguments, a dict the %(name)s keys, any other
// value the one argument.
std::string printf_format(std::string_view format, const Value& args, Interpreter& in);

// range, namespace, dict, raise_exception, strftime_now, cycler, joiner; undefined if none.
Value builtin_global(std::string_view name);

// json.dumps(v, ensure_ascii=..., indent=indent, separators=..., sort_keys=...).
std::string to_json(const Value& v, const Value& indent, std::string_view item_separator,
                    std::string_view key_separator, bool sort_keys, bool ensure_ascii,
                    std::size_t max_bytes);

}  // namespace kvvm::jinja::detail
