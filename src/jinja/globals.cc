// The global functions a chat template may call: range, namespace, dict, raise_exception,
// strftime_now.
#include <ctime>
#include <string>
#include <utility>

#include "jinja/render.h"

namespace kvvm::jinja::detail {

namespace {

Value int_arg(const Value& v) {
  if (!v.is_int() && !v.is_bool()) {
    fail("'" + std::string(v.type_name()) + "' object cannot be interpreted as an integer");
  }
  return v;
}

Value range(Interpreter& in, CallArgs& args) {
  if (!args.keywords.empty()) fail("range() takes no keyword arguments");
  std::size_t n = args.positional.size();
  if (n == 0 || n > 3) fail("range expected 1 to 3 arguments, got " + std::to_string(n));
  std::int64_t start = 0;
  std::int64_t stop = 0;
  std::int64_t step = 1;
  if (n == 1) {
    stop = int_arg(args.positional[0]).as_int();
  } else {
    start = int_arg(args.positional[0]).as_int();
    stop = int_arg(args.positional[1]).as_int();
    if (n == 3) step = int_arg(args.positional[2]).as_int();
  }
  if (step == 0) fail("range() arg 3 must not be zero");
  // The items count as steps up front: a huge range ends here, not after filling memory.
  std::uint64_t count = 0;
  if (step > 0 && start < stop) {
    count = (static_cast<std::uint64_t>(stop) - static_cast<std::uint64_t>(start) - 1) /
                static_cast<std::uint64_t>(step) +
            1;
  } else if (step < 0 && start > stop) {
    count = (static_cast<std::uint64_t>(start) - static_cast<std::uint64_t>(stop) - 1) /
                (static_cast<std::uint64_t>(-(step + 1)) + 1) +
            1;
  }
  in.step(count);
  // The sandbox's bound on range(), as Jinja's SandboxedEnvironment has it.
  if (count > 100'000)
    fail("Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
  List items;
  items.reserve(count);
  std::int64_t v = start;
  for (std::uint64_t i = 0; i < count; ++i, v += step) items.push_back(Value::integer(v));
  return Value::list(std::move(items));
}

Value make_namespace(Interpreter& in, CallArgs& args) {
  auto ns = std::make_shared<Namespace>();
  in.track(ns);
  for (const Value& p : args.positional) {
    if (!p.is_dict()) fail("namespace() takes a dict or keyword arguments");
    for (const auto& [k, v] : p.as_dict()) ns->attributes.emplace_back(k.str(), v);
  }
  for (auto& [k, v] : args.keywords) {
    bool replaced = false;
    for (auto& [ek, ev] : ns->attributes) {
      if (ek == k) {
        ev = v;
        replaced = true;
      }
    }
    if (!replaced) ns->attributes.emplace_back(k, v);
  }
  return Value::ns(std::move(ns));
}

Value make_dict(Interpreter& in, CallArgs& args) {
  Dict items;
  auto put = [&](Value k, Value v) {
    for (auto& [ek, ev] : items) {
      if (ek.equals(k)) {
        ev = std::move(v);
        return;
      }
    }
    items.emplace_back(std::move(k), std::move(v));
  };
  if (args.positional.size() > 1) fail("dict expected at most 1 argument");
  if (args.positional.size() == 1) {
    const Value& p = args.positional[0];
    if (p.is_dict()) {
      for (const auto& [k, v] : p.as_dict()) put(k, v);
    } else {
      for (const Value& pair : iterate(in, p)) {
        List kv = iterate(in, pair);
        if (kv.size() != 2) fail("dictionary update sequence element has wrong length");
        put(kv[0], kv[1]);
      }
    }
  }
  for (auto& [k, v] : args.keywords) put(Value::string(k), v);
  return Value::dict(std::move(items));
}

Value raise_exception(Interpreter&, CallArgs& args) {
  std::string message = args.positional.empty() ? "" : args.positional[0].str();
  throw TemplateError{TemplateError::Kind::kRaised, std::move(message), {}};
}

Value strftime_now(Interpreter& in, CallArgs& args) {
  if (args.positional.empty() || !args.positional[0].is_string()) {
    fail("strftime_now() takes a format string");
  }
  const std::string& format = args.positional[0].as_string();
  if (in.hooks().strftime_now) return Value::string(in.hooks().strftime_now(format));
  std::time_t now = std::time(nullptr);
  std::tm local{};
  localtime_r(&now, &local);
  std::string out(256, '\0');
  std::size_t n = 0;
  while (!format.empty() &&
         (n = std::strftime(out.data(), out.size(), format.c_str(), &local)) == 0) {
    if (out.size() > 4096) break;
    out.resize(out.size() * 2);
  }
  out.resize(n);
  return Value::string(std::move(out));
}

struct Globals {
  Value range = Value::callable("range", detail::range);
  Value ns = Value::callable("namespace", make_namespace);
  Value dict = Value::callable("dict", make_dict);
  Value raise = Value::callable("raise_exception", detail::raise_exception);
  Value strftime = Value::callable("strftime_now", detail::strftime_now);
};

}  // namespace

Value builtin_global(std::string_view name) {
  static const Globals* globals = new Globals();  // shared by every render; never destroyed
  if (name == "range") return globals->range;
  if (name == "namespace") return globals->ns;
  if (name == "dict") return globals->dict;
  if (name == "raise_exception") return globals->raise;
  if (name == "strftime_now") return globals->strftime;
  return Value::undefined();
}

}  // namespace kvvm::jinja::detail
