// Statements: output, if, for, set, macros, call and filter blocks, loop controls.
#include "jinja/render.h"

#include <string>
#include <utility>

namespace kvvm::jinja::detail {

namespace {

// Restores the interpreter's frame when a scope ends, normally or by an error.
class FrameSwap {
 public:
  FrameSwap(std::shared_ptr<Frame>& slot, std::shared_ptr<Frame> next)
      : slot_(slot), saved_(std::exchange(slot, std::move(next))) {}
  ~FrameSwap() { slot_ = std::move(saved_); }
  FrameSwap(const FrameSwap&) = delete;
  FrameSwap& operator=(const FrameSwap&) = delete;

 private:
  std::shared_ptr<Frame>& slot_;
  std::shared_ptr<Frame> saved_;
};

}  // namespace

Interpreter::~Interpreter() {
  // Break the cycles; the values' own destructors then free the rest.
  for (const auto& frame : frames_) frame->vars.clear();
  for (const auto& ns : namespaces_) ns->attributes.clear();
  for (const auto& loop : loops_) loop->last_changed.reset();
  if (frame_) frame_->vars.clear();
}

std::string Interpreter::render(const Body& body, Value context) {
  context_ = std::move(context);
  frame_ = std::make_shared<Frame>();
  track(frame_);
  std::string out;
  out_ = &out;
  exec(body);
  return out;
}

void Interpreter::write(std::string_view text) {
  step();
  if (out_->size() + text.size() > limits_.max_output_bytes) {
    exhausted("output", "max_output_bytes", out_->size() + text.size(), limits_.max_output_bytes);
  }
  out_->append(text);
}

void Interpreter::write_value(const Value& v) {
  if (v.is_string()) {
    write(v.as_string());
  } else {
    write(v.str());
  }
}

std::string Interpreter::capture(const Body& body) {
  std::string buffer;
  std::string* saved = std::exchange(out_, &buffer);
  try {
    exec(body);
  } catch (...) {
    out_ = saved;
    throw;
  }
  out_ = saved;
  return buffer;
}

Interpreter::Flow Interpreter::exec(const Body& body) {
  DepthScope depth(*this);
  for (const StmtPtr& s : body) {
    Flow flow = exec_stmt(*s);
    if (flow != Flow::kNormal) return flow;
  }
  return Flow::kNormal;
}

void Interpreter::assign(const std::vector<std::string>& targets, bool unpack,
                         const std::string& attribute, Value v) {
  if (!attribute.empty()) {
    Value object = lookup(targets[0]);
    if (!object.is_namespace()) fail("can only assign attributes on namespace objects");
    auto& attrs = object.as_namespace().attributes;
    for (auto& [k, slot] : attrs) {
      if (k == attribute) {
        slot = std::move(v);
        return;
      }
    }
    attrs.emplace_back(attribute, std::move(v));
    return;
  }
  if (!unpack) {
    frame_->set(targets[0], std::move(v));
    return;
  }
  List items = iterate(*this, v);
  if (items.size() != targets.size()) {
    fail(items.size() < targets.size()
             ? "not enough values to unpack (expected " + std::to_string(targets.size()) +
                   ", got " + std::to_string(items.size()) + ")"
             : "too many values to unpack (expected " + std::to_string(targets.size()) + ")");
  }
  for (std::size_t i = 0; i < targets.size(); ++i) frame_->set(targets[i], std::move(items[i]));
}

Interpreter::Flow Interpreter::exec_for(const ForStmt& s) {
  Value iterable = eval(*s.iterable);
  return run_loop(s, iterate(*this, iterable), 0);
}

Value Interpreter::call_loop(const LoopState& loop, CallArgs& args) {
  if (loop.recursive == nullptr)
    fail("'LoopContext' object is not callable (the loop is not recursive)");
  if (args.positional.size() != 1 || !args.keywords.empty()) fail("loop() takes one iterable");
  List items = iterate(*this, args.positional[0]);
  std::string buffer;
  std::string* saved = std::exchange(out_, &buffer);
  try {
    run_loop(*loop.recursive, std::move(items), loop.depth0 + 1);
  } catch (...) {
    out_ = saved;
    throw;
  }
  out_ = saved;
  return Value::string(std::move(buffer));
}

Interpreter::Flow Interpreter::run_loop(const ForStmt& s, List items, std::int64_t depth0) {
  auto state = std::make_shared<LoopState>();
  state->depth0 = depth0;
  if (s.recursive) state->recursive = &s;
  auto frame = std::make_shared<Frame>();
  frame->parent = frame_;
  FrameSwap swap(frame_, frame);
  if (s.filter) {
    // `for x in xs if cond`: the condition sees the loop variable, and loop.* counts only the
    // items it keeps.
    List kept;
    for (Value& item : items) {
      step();
      frame->vars.clear();
      assign(s.targets, s.unpack, {}, item);
      if (eval(*s.filter).truthy()) kept.push_back(std::move(item));
    }
    items = std::move(kept);
  }
  state->length = static_cast<std::int64_t>(items.size());
  state->items = Value::list(std::move(items));
  Value loop = Value::loop(state);
  const List& list = state->items.as_list();
  for (std::size_t i = 0; i < list.size(); ++i) {
    step();
    state->index0 = static_cast<std::int64_t>(i);
    frame->vars.clear();
    frame->vars.emplace_back("loop", loop);
    assign(s.targets, s.unpack, {}, list[i]);
    if (exec(s.body) == Flow::kBreak) break;
  }
  if (list.empty()) {
    frame->vars.clear();
    return exec(s.else_body);
  }
  return Flow::kNormal;
}

Value Interpreter::call_macro(const MacroStmt& m, const std::shared_ptr<Frame>& closure,
                              CallArgs& args) {
  auto frame = std::make_shared<Frame>();
  frame->parent = closure;
  FrameSwap swap(frame_, frame);
  std::size_t n = m.params.size();
  List varargs;
  if (args.positional.size() > n && !m.uses_varargs) {
    fail("macro '" + m.name + "' takes not more than " + std::to_string(n) + " argument(s)");
  }
  for (std::size_t i = 0; i < args.positional.size(); ++i) {
    if (i < n) {
      frame->set(m.params[i].name, args.positional[i]);
    } else {
      varargs.push_back(args.positional[i]);
    }
  }
  Dict kwargs;
  for (auto& [k, v] : args.keywords) {
    bool is_param = false;
    for (std::size_t i = 0; i < n; ++i) {
      if (m.params[i].name == k) {
        if (i < args.positional.size())
          fail("macro '" + m.name + "' got multiple values for '" + k + "'");
        is_param = true;
      }
    }
    if (is_param) {
      frame->set(k, v);
    } else if (k == "caller") {  // from a call block
      frame->set(k, v);
    } else if (m.uses_kwargs) {
      kwargs.emplace_back(Value::string(k), v);
    } else {
      fail("macro '" + m.name + "' takes no keyword argument '" + k + "'");
    }
  }
  for (std::size_t i = 0; i < n; ++i) {
    if (frame->find(m.params[i].name) != nullptr) continue;
    frame->set(m.params[i].name,
               m.params[i].default_value
                   ? eval(*m.params[i].default_value)
                   : Value::undefined("parameter '" + m.params[i].name + "' was not provided"));
  }
  frame->set("varargs", Value::list(std::move(varargs), /*tuple=*/true));
  frame->set("kwargs", Value::dict(std::move(kwargs)));
  return Value::string(capture(m.body));
}

Value Interpreter::make_macro(const MacroStmt& m) {
  std::shared_ptr<Frame> closure = frame_;
  track(closure);
  const MacroStmt* macro = &m;
  return Value::callable(m.name, [macro, closure](Interpreter& in, CallArgs& args) {
    return in.call_macro(*macro, closure, args);
  });
}

Interpreter::Flow Interpreter::exec_stmt(const Stmt& s) {
  step();
  try {
    switch (s.kind) {
      case StmtKind::kText:
        write(static_cast<const TextStmt&>(s).text);
        return Flow::kNormal;
      case StmtKind::kOutput:
        write_value(eval(*static_cast<const OutputStmt&>(s).expr));
        return Flow::kNormal;
      case StmtKind::kIf: {
        const auto& i = static_cast<const IfStmt&>(s);
        for (const auto& [cond, body] : i.branches) {
          if (eval(*cond).truthy()) return exec(body);
        }
        return exec(i.else_body);
      }
      case StmtKind::kFor:
        return exec_for(static_cast<const ForStmt&>(s));
      case StmtKind::kSet: {
        const auto& set = static_cast<const SetStmt&>(s);
        assign(set.targets, set.unpack, set.attribute, eval(*set.value));
        return Flow::kNormal;
      }
      case StmtKind::kBlockSet: {
        const auto& set = static_cast<const BlockSetStmt&>(s);
        Value v = Value::string(capture(set.body));
        for (const auto& f : set.filters) {
          CallArgs args;
          eval_args(f->args, args);
          v = apply_filter(*this, f->name, v, args);
        }
        assign({set.target}, false, set.attribute, std::move(v));
        return Flow::kNormal;
      }
      case StmtKind::kMacro: {
        const auto& m = static_cast<const MacroStmt&>(s);
        frame_->set(m.name, make_macro(m));
        return Flow::kNormal;
      }
      case StmtKind::kCallBlock: {
        const auto& c = static_cast<const CallBlockStmt&>(s);
        std::shared_ptr<Frame> closure = frame_;
        track(closure);
        // caller(): renders the call block's body with the block's own parameters.
        const CallBlockStmt* block = &c;
        Value caller = Value::callable("caller", [block, closure](Interpreter& in, CallArgs& args) {
          auto frame = std::make_shared<Frame>();
          frame->parent = closure;
          std::vector<Value> values;
          for (std::size_t i = 0; i < block->caller_params.size(); ++i) {
            const MacroParam& p = block->caller_params[i];
            const Value* v = find_arg(args, i, p.name);
            values.push_back(v != nullptr ? *v
                             : p.default_value
                                 ? in.eval(*p.default_value)
                                 : Value::undefined("parameter '" + p.name + "' was not provided"));
          }
          FrameSwap swap(in.frame_, frame);
          for (std::size_t i = 0; i < values.size(); ++i) {
            frame->set(block->caller_params[i].name, std::move(values[i]));
          }
          return Value::string(in.capture(block->body));
        });
        Value callee = eval(*c.call->callee);
        CallArgs args;
        eval_args(c.call->args, args);
        args.keywords.emplace_back("caller", caller);
        write_value(call(callee, args));
        return Flow::kNormal;
      }
      case StmtKind::kFilterBlock: {
        const auto& f = static_cast<const FilterBlockStmt&>(s);
        Value v = Value::string(capture(f.body));
        for (const auto& filter : f.filters) {
          CallArgs args;
          eval_args(filter->args, args);
          v = apply_filter(*this, filter->name, v, args);
        }
        write_value(v);
        return Flow::kNormal;
      }
      case StmtKind::kBreak:
        return Flow::kBreak;
      case StmtKind::kContinue:
        return Flow::kContinue;
      case StmtKind::kScope: {
        const auto& scope = static_cast<const ScopeStmt&>(s);
        if (!scope.new_scope) return exec(scope.body);
        auto frame = std::make_shared<Frame>();
        frame->parent = frame_;
        std::vector<Value> values;
        for (const auto& [name, expr] : scope.assignments) values.push_back(eval(*expr));
        FrameSwap swap(frame_, frame);
        for (std::size_t i = 0; i < values.size(); ++i) {
          frame->set(scope.assignments[i].first, std::move(values[i]));
        }
        exec(scope.body);
        return Flow::kNormal;
      }
    }
  } catch (TemplateError& error) {
    if (error.pos.line == 0) error.pos = s.pos;
    throw;
  }
  return Flow::kNormal;
}

}  // namespace kvvm::jinja::detail
