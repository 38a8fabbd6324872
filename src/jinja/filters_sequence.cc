// The filters over sequences and mappings: join, map, select and reject, sort, unique, sum,
// min, max, dictsort, items, first, last, list, reverse, batch.
#include <algorithm>
#include <cstdlib>
#include <string>
#include <utility>

#include "jinja/filters.h"
#include "jinja/render.h"
#include "jinja/text.h"

namespace kvvm::jinja::detail {

namespace {

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

}  // namespace

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
  if (args.positional.empty()) fail("map requires a filter argument");
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
    // Equal keys never reach an ordering (Python compares jinja's key lists with == first).
    if (a.first.equals(b.first)) return false;
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

Value f_min(Interpreter& in, const Value& v, CallArgs& a) { return min_max(in, v, a, false); }
Value f_max(Interpreter& in, const Value& v, CallArgs& a) { return min_max(in, v, a, true); }

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

}  // namespace kvvm::jinja::detail
