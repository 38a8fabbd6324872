// The str, dict and list methods a template may call. None mutates: the sandbox refuses
// list.append, dict.update and the like, as transformers' ImmutableSandboxedEnvironment does.
#include <algorithm>
#include <string>
#include <utility>

#include "jinja/render.h"
#include "jinja/text.h"

namespace kvvm::jinja::detail {

namespace {

constexpr std::string_view kStringMethods[] = {
    "capitalize", "count",   "endswith", "find",    "format",  "index", "isalnum",
    "isalpha",    "isdigit", "islower",  "isspace", "isupper", "join",  "lower",
    "lstrip",     "replace", "rfind",    "rsplit",  "rstrip",  "split", "splitlines",
    "startswith", "strip",   "title",    "upper",
};
constexpr std::string_view kDictMethods[] = {"get", "items", "keys", "values"};
constexpr std::string_view kListMethods[] = {"count", "index"};

template <std::size_t N>
bool listed(const std::string_view (&names)[N], std::string_view name) {
  return std::find(std::begin(names), std::end(names), name) != std::end(names);
}

const std::string* string_arg(const CallArgs& args, std::size_t i, std::string_view name,
                              std::string_view method) {
  const Value* v = find_arg(args, i, name);
  if (v == nullptr || v->is_none()) return nullptr;
  if (!v->is_string()) {
    fail(std::string(method) + "() argument must be str or None, not " +
         std::string(v->type_name()));
  }
  return &v->as_string();
}

std::int64_t int_arg(const CallArgs& args, std::size_t i, std::string_view name,
                     std::int64_t fallback) {
  const Value* v = find_arg(args, i, name);
  if (v == nullptr || v->is_none()) return fallback;
  if (!v->is_int() && !v->is_bool()) fail("an integer is required");
  return v->as_int();
}

// Byte offsets of code point positions [start, end) as Python's str.find clamps them.
std::pair<std::size_t, std::size_t> byte_range(const std::string& s, const CallArgs& args,
                                               std::size_t first) {
  auto n = static_cast<std::int64_t>(utf8_length(s));
  std::int64_t start = int_arg(args, first, "start", 0);
  std::int64_t end = int_arg(args, first + 1, "end", n);
  if (start < 0) start = std::max<std::int64_t>(0, start + n);
  if (end < 0) end = std::max<std::int64_t>(0, end + n);
  start = std::min(start, n);
  end = std::min(end, n);
  auto offset = [&](std::int64_t cp) {
    std::size_t pos = 0;
    for (std::int64_t k = 0; k < cp; ++k) decode_at(s, pos);
    return pos;
  };
  std::size_t b = offset(start);
  std::size_t e = offset(end);
  return {b, std::max(b, e)};
}

bool affix_match(const std::string& s, const Value& affix, bool prefix, const CallArgs& args) {
  auto [b, e] = byte_range(s, args, 1);
  std::string_view view = std::string_view(s).substr(b, e - b);
  auto one = [&](const Value& a) {
    if (!a.is_string()) fail("startswith first arg must be str or a tuple of str");
    return prefix ? view.starts_with(a.as_string()) : view.ends_with(a.as_string());
  };
  if (affix.is_list()) {
    return std::any_of(affix.as_list().begin(), affix.as_list().end(), one);
  }
  return one(affix);
}

Value string_method(Interpreter& in, const std::string& s, std::string_view name, CallArgs& args) {
  if (name == "startswith" || name == "endswith") {
    const Value* affix = find_arg(args, 0, "prefix");
    if (affix == nullptr) fail(std::string(name) + "() takes at least 1 argument");
    return Value::boolean(affix_match(s, *affix, name == "startswith", args));
  }
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    const std::string* chars = string_arg(args, 0, "chars", name);
    return Value::string(py_strip(s, chars, name != "rstrip", name != "lstrip"));
  }
  if (name == "split" || name == "rsplit") {
    const std::string* sep = string_arg(args, 0, "sep", name);
    std::int64_t maxsplit = int_arg(args, 1, "maxsplit", -1);
    // The parts' count bounds the list's memory: counted before any is built.
    std::size_t parts = 1;
    if (sep != nullptr && !sep->empty()) {
      for (std::size_t pos = s.find(*sep); pos != std::string::npos;
           pos = s.find(*sep, pos + sep->size())) {
        ++parts;
      }
    } else {
      parts += s.size() / 2;
    }
    in.check_size(parts * sizeof(Value));
    in.step(parts);
    List out;
    for (std::string& part : py_split(s, sep, maxsplit, name == "rsplit")) {
      out.push_back(Value::string(std::move(part)));
    }
    return Value::list(std::move(out));
  }
  if (name == "splitlines") {
    List out;
    for (std::string& line : py_splitlines(s)) out.push_back(Value::string(std::move(line)));
    return Value::list(std::move(out));
  }
  if (name == "upper") return Value::string(py_upper(s));
  if (name == "lower") return Value::string(py_lower(s));
  if (name == "title") return Value::string(py_title(s));
  if (name == "capitalize") return Value::string(py_capitalize(s));
  if (name == "replace") {
    const std::string* old = string_arg(args, 0, "old", name);
    const std::string* replacement = string_arg(args, 1, "new", name);
    if (old == nullptr || replacement == nullptr) fail("replace() takes at least 2 arguments");
    if (replacement->size() > old->size()) {
      in.check_size(s.size() + (s.size() + 1) * (replacement->size() - old->size()));
    }
    return Value::string(py_replace(s, *old, *replacement, int_arg(args, 2, "count", -1)));
  }
  if (name == "find" || name == "rfind" || name == "index" || name == "count") {
    const std::string* sub = string_arg(args, 0, "sub", name);
    if (sub == nullptr) fail(std::string(name) + "() takes at least 1 argument");
    auto [b, e] = byte_range(s, args, 1);
    std::string_view view = std::string_view(s).substr(b, e - b);
    if (name == "count") {
      if (sub->empty()) return Value::integer(static_cast<std::int64_t>(utf8_length(view)) + 1);
      std::int64_t n = 0;
      for (std::size_t pos = view.find(*sub); pos != std::string_view::npos;
           pos = view.find(*sub, pos + sub->size())) {
        ++n;
      }
      return Value::integer(n);
    }
    std::size_t hit = name == "rfind" ? view.rfind(*sub) : view.find(*sub);
    if (hit == std::string_view::npos) {
      if (name == "index") fail("substring not found");
      return Value::integer(-1);
    }
    return Value::integer(static_cast<std::int64_t>(utf8_length(s.substr(0, b + hit))));
  }
  if (name == "join") {
    const Value* items = find_arg(args, 0, "iterable");
    if (items == nullptr) fail("join() takes exactly one argument");
    std::string out;
    bool first = true;
    for (const Value& item : iterate(in, *items)) {
      if (!item.is_string())
        fail("sequence item: expected str instance, " + std::string(item.type_name()) + " found");
      if (!first) out += s;
      first = false;
      out += item.as_string();
      in.check_size(out.size());
    }
    return Value::string(std::move(out));
  }
  if (name == "isdigit" || name == "isalpha" || name == "isalnum" || name == "isspace") {
    if (s.empty()) return Value::boolean(false);
    for (char c : s) {
      auto u = static_cast<unsigned char>(c);
      bool ok = name == "isdigit"   ? std::isdigit(u) != 0
                : name == "isalpha" ? std::isalpha(u) != 0 || u >= 0x80
                : name == "isalnum" ? std::isalnum(u) != 0 || u >= 0x80
                                    : std::isspace(u) != 0;
      if (!ok) return Value::boolean(false);
    }
    return Value::boolean(true);
  }
  if (name == "islower" || name == "isupper") {
    std::string lower = py_lower(s);
    std::string upper = py_upper(s);
    return Value::boolean(name == "islower" ? lower == s && upper != s : upper == s && lower != s);
  }
  if (name == "format") {
    // "{}" and "{0}"-style fields with positional and keyword arguments, no format specs.
    std::string out;
    std::size_t auto_index = 0;
    for (std::size_t i = 0; i < s.size(); ++i) {
      char c = s[i];
      if (c == '{' && i + 1 < s.size() && s[i + 1] == '{') {
        out.push_back('{');
        ++i;
      } else if (c == '}' && i + 1 < s.size() && s[i + 1] == '}') {
        out.push_back('}');
        ++i;
      } else if (c == '{') {
        std::size_t close = s.find('}', i);
        if (close == std::string::npos) fail("Single '{' encountered in format string");
        std::string field = s.substr(i + 1, close - i - 1);
        if (field.find_first_of(":!.[") != std::string::npos) {
          fail("format: conversions and format specs are not supported");
        }
        const Value* v = nullptr;
        if (field.empty()) {
          if (auto_index < args.positional.size()) v = &args.positional[auto_index++];
        } else if (std::all_of(field.begin(), field.end(),
                               [](char d) { return d >= '0' && d <= '9'; })) {
          std::size_t k = std::stoul(field);
          if (k < args.positional.size()) v = &args.positional[k];
        } else {
          for (const auto& [kw, val] : args.keywords) {
            if (kw == field) v = &val;
          }
        }
        if (v == nullptr) fail("format: no argument for field '{" + field + "}'");
        v->append_str(out);
        in.check_size(out.size());
        i = close;
      } else if (c == '}') {
        fail("Single '}' encountered in format string");
      } else {
        out.push_back(c);
      }
    }
    return Value::string(std::move(out));
  }
  fail("'str' object has no attribute '" + std::string(name) + "'");
}

Value dict_method(const Value& d, std::string_view name, CallArgs& args) {
  if (name == "get") {
    const Value* key = find_arg(args, 0, "key");
    if (key == nullptr) fail("get expected at least 1 argument, got 0");
    const Value* v = d.find(*key);
    if (v != nullptr) return *v;
    return arg_or(args, 1, "default", Value::none());
  }
  List out;
  for (const auto& [k, v] : d.as_dict()) {
    if (name == "items") {
      out.push_back(Value::list({k, v}, true));
    } else {
      out.push_back(name == "keys" ? k : v);
    }
  }
  return Value::list(std::move(out));
}

Value list_method(const Value& l, std::string_view name, CallArgs& args) {
  const Value* x = find_arg(args, 0, "value");
  if (x == nullptr) fail(std::string(name) + "() takes exactly one argument");
  const List& items = l.as_list();
  if (name == "count") {
    return Value::integer(
        std::count_if(items.begin(), items.end(), [&](const Value& v) { return v.equals(*x); }));
  }
  for (std::size_t i = 0; i < items.size(); ++i) {
    if (items[i].equals(*x)) return Value::integer(static_cast<std::int64_t>(i));
  }
  fail(x->repr() + " is not in list");
}

}  // namespace

bool has_method(const Value& receiver, std::string_view name) {
  switch (receiver.kind()) {
    case Kind::kString:
      return listed(kStringMethods, name);
    case Kind::kDict:
      return listed(kDictMethods, name);
    case Kind::kList:
      return listed(kListMethods, name);
    default:
      return false;
  }
}

bool call_method(Interpreter& in, const Value& receiver, std::string_view name, CallArgs& args,
                 Value& result) {
  if (!has_method(receiver, name)) return false;
  switch (receiver.kind()) {
    case Kind::kString:
      result = string_method(in, receiver.as_string(), name, args);
      return true;
    case Kind::kDict:
      result = dict_method(receiver, name, args);
      return true;
    case Kind::kList:
      result = list_method(receiver, name, args);
      return true;
    default:
      return false;
  }
}

}  // namespace kvvm::jinja::detail
