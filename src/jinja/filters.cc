// The built-in filters, with the arguments and results Jinja 3.1's have.
#include "jinja/filters.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>

#include "jinja/render.h"
#include "jinja/text.h"

namespace kvvm::jinja::detail {

bool bool_arg(const CallArgs& args, std::size_t i, std::string_view name, bool fallback) {
  const Value* v = find_arg(args, i, name);
  return v != nullptr ? v->truthy() : fallback;
}

namespace {

Value f_length(Interpreter&, const Value& v, CallArgs&) {
  switch (v.kind()) {
    case Kind::kString:
      return Value::integer(static_cast<std::int64_t>(utf8_length(v.as_string())));
    case Kind::kList:
      return Value::integer(static_cast<std::int64_t>(v.as_list().size()));
    case Kind::kDict:
      return Value::integer(static_cast<std::int64_t>(v.as_dict().size()));
    case Kind::kUndefined:
      return Value::integer(0);
    default:
      fail("object of type '" + std::string(v.type_name()) + "' has no len()");
  }
}

Value f_tojson(Interpreter& in, const Value& v, CallArgs& args) {
  // transformers: tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False).
  bool ensure_ascii = bool_arg(args, 0, "ensure_ascii", false);
  Value indent = arg_or(args, 1, "indent", Value::none());
  const Value* separators = find_arg(args, 2, "separators");
  bool sort_keys = bool_arg(args, 3, "sort_keys", false);
  std::string item_sep = indent.is_none() ? ", " : ",";
  std::string key_sep = ": ";
  if (separators != nullptr && !separators->is_none()) {
    List seps = iterate(in, *separators);
    if (seps.size() != 2 || !seps[0].is_string() || !seps[1].is_string()) {
      fail("tojson: separators must be a pair of strings");
    }
    item_sep = seps[0].as_string();
    key_sep = seps[1].as_string();
  }
  return Value::string(
      to_json(v, indent, item_sep, key_sep, sort_keys, ensure_ascii, in.max_output_bytes()));
}

Value f_trim(Interpreter&, const Value& v, CallArgs& args) {
  const Value* chars = find_arg(args, 0, "chars");
  std::string s = soft_str(v);
  if (chars != nullptr && !chars->is_none()) {
    std::string c = chars->str();
    return Value::string(py_strip(s, &c, true, true));
  }
  return Value::string(py_strip(s, nullptr, true, true));
}

Value f_default(Interpreter&, const Value& v, CallArgs& args) {
  Value fallback = arg_or(args, 0, "default_value", Value::string(""));
  bool boolean = bool_arg(args, 1, "boolean", false);
  if (v.is_undefined() || (boolean && !v.truthy())) return fallback;
  return v;
}
Value f_string(Interpreter&, const Value& v, CallArgs&) {
  return v.is_string() ? v : Value::string(v.str());
}
Value f_safe(Interpreter&, const Value& v, CallArgs&) { return v; }

// Python's int(str): optional sign, digits with single underscores, surrounding whitespace.
bool parse_int(std::string s, std::int64_t base, std::int64_t& out) {
  s = py_strip(s, nullptr, true, true);
  std::string clean;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '_' && i > 0 && i + 1 < s.size() &&
        std::isalnum(static_cast<unsigned char>(s[i - 1])))
      continue;
    clean.push_back(s[i]);
  }
  if (clean.empty()) return false;
  char* end = nullptr;
  errno = 0;
  long long v = std::strtoll(clean.c_str(), &end, static_cast<int>(base));
  if (errno != 0 || end != clean.c_str() + clean.size()) return false;
  out = v;
  return true;
}

bool parse_float(std::string s, double& out) {
  s = py_strip(s, nullptr, true, true);
  if (s.empty()) return false;
  char* end = nullptr;
  double v = std::strtod(s.c_str(), &end);
  if (end != s.c_str() + s.size()) return false;
  out = v;
  return true;
}

Value f_int(Interpreter&, const Value& v, CallArgs& args) {
  Value fallback = arg_or(args, 0, "default", Value::integer(0));
  std::int64_t base = arg_or(args, 1, "base", Value::integer(10)).as_int();
  if (v.is_int() || v.is_bool()) return Value::integer(v.as_int());
  if (v.is_float()) {
    double d = v.as_float();
    if (!std::isfinite(d) || std::fabs(d) >= 9.2e18) return fallback;
    return Value::integer(static_cast<std::int64_t>(d));
  }
  if (v.is_string()) {
    std::int64_t i = 0;
    if (parse_int(v.as_string(), base, i)) return Value::integer(i);
    double d = 0;
    if (parse_float(v.as_string(), d) && std::isfinite(d) && std::fabs(d) < 9.2e18) {
      return Value::integer(static_cast<std::int64_t>(d));
    }
  }
  return fallback;
}

Value f_float(Interpreter&, const Value& v, CallArgs& args) {
  Value fallback = arg_or(args, 0, "default", Value::floating(0.0));
  if (v.is_number()) return Value::floating(v.as_float());
  double d = 0;
  if (v.is_string() && parse_float(v.as_string(), d)) return Value::floating(d);
  return fallback;
}

Value f_lower(Interpreter&, const Value& v, CallArgs&) {
  return Value::string(py_lower(soft_str(v)));
}
Value f_upper(Interpreter&, const Value& v, CallArgs&) {
  return Value::string(py_upper(soft_str(v)));
}
Value f_capitalize(Interpreter&, const Value& v, CallArgs&) {
  return Value::string(py_capitalize(soft_str(v)));
}
Value f_title(Interpreter&, const Value& v, CallArgs&) {
  return Value::string(jinja_title(soft_str(v)));
}

Value f_replace(Interpreter& in, const Value& v, CallArgs& args) {
  const Value* old = find_arg(args, 0, "old");
  const Value* replacement = find_arg(args, 1, "new");
  if (old == nullptr || replacement == nullptr) fail("replace() needs old and new");
  Value count_arg = arg_or(args, 2, "count", Value::none());
  if (!count_arg.is_none() && !count_arg.is_int() && !count_arg.is_bool()) {
    fail("'" + std::string(count_arg.type_name()) + "' object cannot be interpreted as an integer");
  }
  long long count = count_arg.is_none() ? -1 : count_arg.as_int();
  std::string s = soft_str(v);
  std::string o = old->str();
  std::string n = replacement->str();
  if (n.size() > o.size()) {
    in.check_size(s.size() + (s.size() + 1) * (n.size() - o.size()));
  }
  return Value::string(py_replace(s, o, n, count));
}

Value f_round(Interpreter&, const Value& v, CallArgs& args) {
  std::int64_t precision = arg_or(args, 0, "precision", Value::integer(0)).as_int();
  std::string method = arg_or(args, 1, "method", Value::string("common")).str();
  if (!v.is_number()) fail("round: expected a number");
  if (method != "common" && method != "ceil" && method != "floor") {
    fail("method must be common, ceil or floor");
  }
  if (method == "common") {
    if (!v.is_float()) return precision >= 0 ? Value::integer(v.as_int()) : v;
    double d = v.as_float();
    if (precision == 0) return Value::floating(std::nearbyint(d));
    // Python rounds the exact binary value correctly, as printf does.
    char buf[512];
    if (precision > 0 && precision < 300) {
      std::snprintf(buf, sizeof(buf), "%.*f", static_cast<int>(precision), d);
      return Value::floating(std::strtod(buf, nullptr));
    }
    double scale = std::pow(10.0, static_cast<double>(precision));
    return Value::floating(std::nearbyint(d * scale) / scale);
  }
  double scale = std::pow(10.0, static_cast<double>(precision));
  double x = v.as_float() * scale;
  return Value::floating((method == "ceil" ? std::ceil(x) : std::floor(x)) / scale);
}

Value f_abs(Interpreter&, const Value& v, CallArgs&) {
  if (v.is_float()) return Value::floating(std::fabs(v.as_float()));
  if (v.is_int() || v.is_bool()) {
    if (v.as_int() == INT64_MIN) fail("integer overflow");
    return Value::integer(std::llabs(v.as_int()));
  }
  fail("bad operand type for abs(): '" + std::string(v.type_name()) + "'");
}

Value f_indent(Interpreter& in, const Value& v, CallArgs& args) {
  Value width = arg_or(args, 0, "width", Value::integer(4));
  bool first = bool_arg(args, 1, "first", false);
  bool blank = bool_arg(args, 2, "blank", false);
  std::string indention =
      width.is_string()
          ? width.as_string()
          : std::string(static_cast<std::size_t>(std::max<std::int64_t>(0, width.as_int())), ' ');
  std::string s = soft_str(v) + "\n";
  std::vector<std::string> lines = py_splitlines(s);
  in.check_size(s.size() + lines.size() * indention.size());
  std::string out;
  for (std::size_t i = 0; i < lines.size(); ++i) {
    if (i > 0) {
      out += "\n";
      if (blank || !lines[i].empty()) out += indention;
    }
    out += lines[i];
  }
  if (first) out = indention + out;
  return Value::string(std::move(out));
}

Value f_wordcount(Interpreter&, const Value& v, CallArgs&) {
  std::string s = soft_str(v);
  std::int64_t words = 0;
  bool in_word = false;
  for (char c : s) {
    auto u = static_cast<unsigned char>(c);
    bool word = std::isalnum(u) || c == '_' || u >= 0x80;
    if (word && !in_word) ++words;
    in_word = word;
  }
  return Value::integer(words);
}

Value f_escape(Interpreter&, const Value& v, CallArgs&) {
  return Value::string(html_escape(soft_str(v)));
}

Value f_center(Interpreter& in, const Value& v, CallArgs& args) {
  std::int64_t width = arg_or(args, 0, "width", Value::integer(80)).as_int();
  std::string s = soft_str(v);
  auto len = static_cast<std::int64_t>(utf8_length(s));
  if (width <= len) return Value::string(s);
  in.check_size(static_cast<std::size_t>(width));
  std::int64_t margin = width - len;
  std::int64_t left = margin / 2 + (margin & width & 1);
  return Value::string(std::string(static_cast<std::size_t>(left), ' ') + s +
                       std::string(static_cast<std::size_t>(margin - left), ' '));
}

Value f_attr(Interpreter& in, const Value& v, CallArgs& args) {
  const Value* name = find_arg(args, 0, "name");
  if (name == nullptr) fail("attr() needs a name");
  // getattr without the item fallback: a dict's keys are not its attributes.
  std::string n = name->str();
  if (v.is_dict() || v.is_string() || v.is_list()) {
    if (!has_method(v, n)) return Value::undefined("no attribute '" + n + "'");
  }
  return in.get_attr(v, n);
}

Value f_format(Interpreter& in, const Value& v, CallArgs& args) {
  if (!args.positional.empty() && !args.keywords.empty()) {
    fail("can't handle positional and keyword arguments at the same time");
  }
  Value packed;
  if (!args.keywords.empty()) {
    Dict kw;
    for (auto& [k, val] : args.keywords) kw.emplace_back(Value::string(k), val);
    packed = Value::dict(std::move(kw));
  } else {
    packed = Value::list(args.positional, /*tuple=*/true);
  }
  return Value::string(printf_format(soft_str(v), packed, in));
}

// A filter's parameters after the value, as Jinja 3.1 (and transformers, for tojson) declares
// them: calls are checked against them as Python checks a call. kAnyArgs: *args, **kwargs.
struct FilterEntry {
  std::string_view name;
  FilterFn fn;
  std::array<std::string_view, 4> params;
  std::size_t required = 0;
};

constexpr std::string_view kAnyArgs = "*";

constexpr FilterEntry kFilters[] = {
    {"abs", f_abs, {}},
    {"attr", f_attr, {"name"}, 1},
    {"batch", f_batch, {"linecount", "fill_with"}, 1},
    {"capitalize", f_capitalize, {}},
    {"center", f_center, {"width"}},
    {"count", f_length, {}},
    {"d", f_default, {"default_value", "boolean"}},
    {"default", f_default, {"default_value", "boolean"}},
    {"dictsort", f_dictsort, {"case_sensitive", "by", "reverse"}},
    {"e", f_escape, {}},
    {"escape", f_escape, {}},
    {"first", f_first, {}},
    {"float", f_float, {"default"}},
    {"forceescape", f_escape, {}},
    {"format", f_format, {kAnyArgs}},
    {"indent", f_indent, {"width", "first", "blank"}},
    {"int", f_int, {"default", "base"}},
    {"items", f_items, {}},
    {"join", f_join, {"d", "attribute"}},
    {"last", f_last, {}},
    {"length", f_length, {}},
    {"list", f_list, {}},
    {"lower", f_lower, {}},
    {"map", f_map, {kAnyArgs}},
    {"max", f_max, {"case_sensitive", "attribute"}},
    {"min", f_min, {"case_sensitive", "attribute"}},
    {"reject", f_reject, {kAnyArgs}},
    {"rejectattr", f_rejectattr, {kAnyArgs}},
    {"replace", f_replace, {"old", "new", "count"}, 2},
    {"reverse", f_reverse, {}},
    {"round", f_round, {"precision", "method"}},
    {"safe", f_safe, {}},
    {"select", f_select, {kAnyArgs}},
    {"selectattr", f_selectattr, {kAnyArgs}},
    {"sort", f_sort, {"reverse", "case_sensitive", "attribute"}},
    {"string", f_string, {}},
    {"sum", f_sum, {"attribute", "start"}},
    {"title", f_title, {}},
    {"tojson", f_tojson, {"ensure_ascii", "indent", "separators", "sort_keys"}},
    {"trim", f_trim, {"chars"}},
    {"unique", f_unique, {"case_sensitive", "attribute"}},
    {"upper", f_upper, {}},
    {"wordcount", f_wordcount, {}},
};

// Python's checks of a call against a signature.
void check_call(const FilterEntry& e, const CallArgs& args) {
  if (e.params[0] == kAnyArgs) return;
  std::size_t count = 0;
  while (count < e.params.size() && !e.params[count].empty()) ++count;
  if (args.positional.size() > count) {
    fail("filter '" + std::string(e.name) + "' takes at most " + std::to_string(count) +
         " argument(s), " + std::to_string(args.positional.size()) + " given");
  }
  for (const auto& [k, v] : args.keywords) {
    auto it = std::find(e.params.begin(), e.params.begin() + static_cast<std::ptrdiff_t>(count), k);
    if (it == e.params.begin() + static_cast<std::ptrdiff_t>(count)) {
      fail("filter '" + std::string(e.name) + "' got an unexpected keyword argument '" + k + "'");
    }
    if (static_cast<std::size_t>(it - e.params.begin()) < args.positional.size()) {
      fail("filter '" + std::string(e.name) + "' got multiple values for argument '" + k + "'");
    }
  }
  for (std::size_t i = args.positional.size(); i < e.required; ++i) {
    bool given = false;
    for (const auto& [k, v] : args.keywords) given = given || k == e.params[i];
    if (!given) {
      fail("filter '" + std::string(e.name) + "' is missing required argument '" +
           std::string(e.params[i]) + "'");
    }
  }
}

const FilterEntry* find_filter(std::string_view name) {
  for (const FilterEntry& e : kFilters) {
    if (e.name == name) return &e;
  }
  return nullptr;
}

}  // namespace

bool has_filter(std::string_view name) { return find_filter(name) != nullptr; }

Value apply_filter(Interpreter& in, std::string_view name, const Value& operand, CallArgs& args) {
  const FilterEntry* e = find_filter(name);
  if (e == nullptr) fail("No filter named '" + std::string(name) + "'");
  check_call(*e, args);
  return e->fn(in, operand, args);
}

}  // namespace kvvm::jinja::detail
