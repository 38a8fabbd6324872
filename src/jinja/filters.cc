// The built-in filters, with the arguments and results Jinja 3.1's have.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>

#include "jinja/render.h"
#include "jinja/text.h"

namespace kvvm::jinja::detail {

namespace {

using FilterFn = Value (*)(Interpreter&, const Value&, CallArgs&);

std::string soft_str(const Value& v) { return v.str(); }

bool bool_arg(const CallArgs& args, std::size_t i, std::string_view name, bool fallback) {
  const Value* v = find_arg(args, i, name);
  return v != nullptr ? v->truthy() : fallback;
}

// Jinja's attribute getter for map/sort/sum...: "a.b.0" looks each part up as an item.
Value get_path(Interpreter& in, const Value& v, const std::string& path) {
  Value cur = v;
  std::size_t start = 0;
  while (true) {
    std::size_t dot = path.find('.', start);
    std::string part =
        path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    bool digits = !part.empty() && std::all_of(part.begin(), part.end(),
                                               [](char c) { return c >= '0' && c <= '9'; });
    if (cur.is_undefined()) return cur;
    cur = in.get_item(cur, digits ? Value::integer(std::atoll(part.c_str())) : Value::string(part));
    if (dot == std::string::npos) return cur;
    start = dot + 1;
  }
}

std::string attribute_name(const Value& v) {
  if (v.is_int()) return std::to_string(v.as_int());
  if (!v.is_string()) fail("attribute must be a string");
  return v.as_string();
}

// A sort key: lower-cased strings unless case_sensitive.
Value sort_key(const Value& v, bool case_sensitive) {
  if (!case_sensitive && v.is_string()) return Value::string(py_lower(v.as_string()));
  return v;
}

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

Value f_join(Interpreter& in, const Value& v, CallArgs& args) {
  std::string sep = arg_or(args, 0, "d", Value::string("")).str();
  const Value* attribute = find_arg(args, 1, "attribute");
  std::string out;
  bool first = true;
  for (const Value& item : iterate(in, v)) {
    if (!first) out += sep;
    first = false;
    if (attribute != nullptr && !attribute->is_none()) {
      get_path(in, item, attribute_name(*attribute)).append_str(out);
    } else {
      item.append_str(out);
    }
    in.check_size(out.size());
  }
  return Value::string(std::move(out));
}

// select/reject/selectattr/rejectattr: `args` from `first_test` on are the test and its args.
Value select_items(Interpreter& in, const Value& v, CallArgs& args, bool by_attribute, bool keep) {
  std::size_t next = 0;
  std::string attribute;
  if (by_attribute) {
    if (args.positional.empty()) fail("selectattr needs an attribute");
    attribute = attribute_name(args.positional[next++]);
  }
  std::string test;
  if (next < args.positional.size()) test = args.positional[next++].str();
  CallArgs test_args;
  test_args.positional.assign(args.positional.begin() + static_cast<std::ptrdiff_t>(next),
                              args.positional.end());
  test_args.keywords = args.keywords;
  if (!test.empty() && !has_test(test)) fail("No test named '" + test + "'");
  List out;
  for (const Value& item : iterate(in, v)) {
    in.step();
    Value subject = by_attribute ? get_path(in, item, attribute) : item;
    bool pass = test.empty() ? subject.truthy() : apply_test(in, test, subject, test_args);
    if (pass == keep) out.push_back(item);
  }
  return Value::list(std::move(out));
}

Value f_select(Interpreter& in, const Value& v, CallArgs& a) {
  return select_items(in, v, a, false, true);
}
Value f_reject(Interpreter& in, const Value& v, CallArgs& a) {
  return select_items(in, v, a, false, false);
}
Value f_selectattr(Interpreter& in, const Value& v, CallArgs& a) {
  return select_items(in, v, a, true, true);
}
Value f_rejectattr(Interpreter& in, const Value& v, CallArgs& a) {
  return select_items(in, v, a, true, false);
}

Value f_map(Interpreter& in, const Value& v, CallArgs& args) {
  List out;
  const Value* attribute = nullptr;
  for (const auto& [k, val] : args.keywords) {
    if (k == "attribute") attribute = &val;
  }
  if (attribute != nullptr) {
    Value fallback = arg_or(CallArgs{{}, args.keywords}, 99, "default", Value::undefined());
    std::string path = attribute_name(*attribute);
    for (const Value& item : iterate(in, v)) {
      in.step();
      Value got = get_path(in, item, path);
      out.push_back(got.is_undefined() && !fallback.is_undefined() ? fallback : got);
    }
    return Value::list(std::move(out));
  }
  if (args.positional.empty()) {
    return Value::list(iterate(in, v));
  }
  std::string filter = args.positional[0].str();
  if (!has_filter(filter)) fail("No filter named '" + filter + "'");
  CallArgs rest;
  rest.positional.assign(args.positional.begin() + 1, args.positional.end());
  rest.keywords = args.keywords;
  for (const Value& item : iterate(in, v)) {
    in.step();
    CallArgs copy = rest;
    out.push_back(apply_filter(in, filter, item, copy));
  }
  return Value::list(std::move(out));
}

Value f_items(Interpreter&, const Value& v, CallArgs&) {
  if (v.is_undefined()) return Value::list({});
  if (!v.is_dict()) fail("items: can only get item pairs from a mapping");
  List out;
  for (const auto& [k, val] : v.as_dict()) out.push_back(Value::list({k, val}, true));
  return Value::list(std::move(out));
}

Value f_dictsort(Interpreter&, const Value& v, CallArgs& args) {
  if (!v.is_dict()) fail("dictsort: expected a mapping");
  bool case_sensitive = bool_arg(args, 0, "case_sensitive", false);
  std::string by = arg_or(args, 1, "by", Value::string("key")).str();
  bool reverse = bool_arg(args, 2, "reverse", false);
  if (by != "key" && by != "value") fail("You can only sort by either \"key\" or \"value\"");
  std::size_t pos = by == "key" ? 0 : 1;
  List out;
  for (const auto& [k, val] : v.as_dict()) out.push_back(Value::list({k, val}, true));
  std::stable_sort(out.begin(), out.end(), [&](const Value& a, const Value& b) {
    int c = compare_values(sort_key(a.as_list()[pos], case_sensitive),
                           sort_key(b.as_list()[pos], case_sensitive));
    return reverse ? c > 0 : c < 0;
  });
  return Value::list(std::move(out));
}

Value f_default(Interpreter&, const Value& v, CallArgs& args) {
  Value fallback = arg_or(args, 0, "default_value", Value::string(""));
  bool boolean = bool_arg(args, 1, "boolean", false);
  if (v.is_undefined() || (boolean && !v.truthy())) return fallback;
  return v;
}

Value f_first(Interpreter& in, const Value& v, CallArgs&) {
  if (v.is_list()) {
    if (v.as_list().empty()) return Value::undefined("No first item, sequence was empty.");
    return v.as_list().front();
  }
  if (v.is_string() && !v.as_string().empty()) {
    std::size_t end = 0;
    decode_at(v.as_string(), end);
    return Value::string(v.as_string().substr(0, end));
  }
  if (v.is_dict() && !v.as_dict().empty()) return v.as_dict().front().first;
  List items = iterate(in, v);
  if (items.empty()) return Value::undefined("No first item, sequence was empty.");
  return items.front();
}

Value f_last(Interpreter& in, const Value& v, CallArgs&) {
  if (v.is_list()) {
    if (v.as_list().empty()) return Value::undefined("No last item, sequence was empty.");
    return v.as_list().back();
  }
  if (v.is_string() && !v.as_string().empty()) {
    const std::string& s = v.as_string();
    std::size_t start = s.size() - 1;
    while (start > 0 && (static_cast<unsigned char>(s[start]) & 0xc0) == 0x80) --start;
    return Value::string(s.substr(start));
  }
  if (v.is_dict() && !v.as_dict().empty()) return v.as_dict().back().first;
  List items = iterate(in, v);
  if (items.empty()) return Value::undefined("No last item, sequence was empty.");
  return items.back();
}

Value f_list(Interpreter& in, const Value& v, CallArgs&) { return Value::list(iterate(in, v)); }
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
  long long count = arg_or(args, 2, "count", Value::none()).is_none()
                        ? -1
                        : arg_or(args, 2, "count", Value::none()).as_int();
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

Value f_unique(Interpreter& in, const Value& v, CallArgs& args) {
  bool case_sensitive = bool_arg(args, 0, "case_sensitive", false);
  const Value* attribute = find_arg(args, 1, "attribute");
  List out;
  List seen;
  for (const Value& item : iterate(in, v)) {
    in.step();
    Value key = attribute != nullptr && !attribute->is_none()
                    ? get_path(in, item, attribute_name(*attribute))
                    : item;
    key = sort_key(key, case_sensitive);
    in.step(seen.size());  // the scan below
    bool dup = false;
    for (const Value& s : seen) dup = dup || s.equals(key);
    if (dup) continue;
    seen.push_back(key);
    out.push_back(item);
  }
  return Value::list(std::move(out));
}

Value f_sort(Interpreter& in, const Value& v, CallArgs& args) {
  bool reverse = bool_arg(args, 0, "reverse", false);
  bool case_sensitive = bool_arg(args, 1, "case_sensitive", false);
  const Value* attribute = find_arg(args, 2, "attribute");
  List items = iterate(in, v);
  std::vector<std::pair<Value, std::size_t>> keyed;
  for (std::size_t i = 0; i < items.size(); ++i) {
    Value key = attribute != nullptr && !attribute->is_none()
                    ? get_path(in, items[i], attribute_name(*attribute))
                    : items[i];
    keyed.emplace_back(sort_key(key, case_sensitive), i);
  }
  in.step(items.size());
  std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& a, const auto& b) {
    int c = compare_values(a.first, b.first);
    return reverse ? c > 0 : c < 0;
  });
  List out;
  for (const auto& [_, i] : keyed) out.push_back(items[i]);
  return Value::list(std::move(out));
}

Value f_reverse(Interpreter& in, const Value& v, CallArgs&) {
  if (v.is_string()) {
    List chars = iterate(in, v);
    std::string out;
    for (auto it = chars.rbegin(); it != chars.rend(); ++it) out += it->as_string();
    return Value::string(std::move(out));
  }
  List items = iterate(in, v);
  std::reverse(items.begin(), items.end());
  return Value::list(std::move(items));
}

Value f_sum(Interpreter& in, const Value& v, CallArgs& args) {
  const Value* attribute = find_arg(args, 0, "attribute");
  Value total = arg_or(args, 1, "start", Value::integer(0));
  for (const Value& item : iterate(in, v)) {
    Value x = attribute != nullptr && !attribute->is_none()
                  ? get_path(in, item, attribute_name(*attribute))
                  : item;
    total = binary_op(BinaryOp::kAdd, total, x, in);
  }
  return total;
}

Value min_max(Interpreter& in, const Value& v, CallArgs& args, bool want_max) {
  bool case_sensitive = bool_arg(args, 0, "case_sensitive", false);
  const Value* attribute = find_arg(args, 1, "attribute");
  List items = iterate(in, v);
  if (items.empty()) return Value::undefined("No aggregated item, sequence was empty.");
  std::size_t best = 0;
  Value best_key;
  for (std::size_t i = 0; i < items.size(); ++i) {
    Value key = attribute != nullptr && !attribute->is_none()
                    ? get_path(in, items[i], attribute_name(*attribute))
                    : items[i];
    key = sort_key(key, case_sensitive);
    if (i == 0) {
      best_key = key;
      continue;
    }
    int c = compare_values(key, best_key);
    if (want_max ? c > 0 : c < 0) {
      best = i;
      best_key = key;
    }
  }
  return items[best];
}

Value f_min(Interpreter& in, const Value& v, CallArgs& a) { return min_max(in, v, a, false); }
Value f_max(Interpreter& in, const Value& v, CallArgs& a) { return min_max(in, v, a, true); }

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

Value f_batch(Interpreter& in, const Value& v, CallArgs& args) {
  std::int64_t size = arg_or(args, 0, "linecount", Value::integer(1)).as_int();
  const Value* fill = find_arg(args, 1, "fill_with");
  if (size <= 0) fail("batch size must be positive");
  List out;
  List current;
  for (const Value& item : iterate(in, v)) {
    current.push_back(item);
    if (static_cast<std::int64_t>(current.size()) == size)
      out.push_back(Value::list(std::exchange(current, {})));
  }
  if (!current.empty()) {
    if (fill != nullptr && !fill->is_none()) {
      while (static_cast<std::int64_t>(current.size()) < size) current.push_back(*fill);
    }
    out.push_back(Value::list(std::move(current)));
  }
  return Value::list(std::move(out));
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

struct FilterEntry {
  std::string_view name;
  FilterFn fn;
};

constexpr FilterEntry kFilters[] = {
    {"abs", f_abs},
    {"attr", f_attr},
    {"batch", f_batch},
    {"capitalize", f_capitalize},
    {"center", f_center},
    {"count", f_length},
    {"d", f_default},
    {"default", f_default},
    {"dictsort", f_dictsort},
    {"e", f_escape},
    {"escape", f_escape},
    {"first", f_first},
    {"float", f_float},
    {"forceescape", f_escape},
    {"format", f_format},
    {"indent", f_indent},
    {"int", f_int},
    {"items", f_items},
    {"join", f_join},
    {"last", f_last},
    {"length", f_length},
    {"list", f_list},
    {"lower", f_lower},
    {"map", f_map},
    {"max", f_max},
    {"min", f_min},
    {"reject", f_reject},
    {"rejectattr", f_rejectattr},
    {"replace", f_replace},
    {"reverse", f_reverse},
    {"round", f_round},
    {"safe", f_safe},
    {"select", f_select},
    {"selectattr", f_selectattr},
    {"sort", f_sort},
    {"string", f_string},
    {"sum", f_sum},
    {"title", f_title},
    {"tojson", f_tojson},
    {"trim", f_trim},
    {"unique", f_unique},
    {"upper", f_upper},
    {"wordcount", f_wordcount},
};

FilterFn find_filter(std::string_view name) {
  for (const FilterEntry& e : kFilters) {
    if (e.name == name) return e.fn;
  }
  return nullptr;
}

}  // namespace

bool has_filter(std::string_view name) { return find_filter(name) != nullptr; }

Value apply_filter(Interpreter& in, std::string_view name, const Value& operand, CallArgs& args) {
  FilterFn fn = find_filter(name);
  if (fn == nullptr) fail("No filter named '" + std::string(name) + "'");
  return fn(in, operand, args);
}

}  // namespace kvvm::jinja::detail
