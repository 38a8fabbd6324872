// tojson: Python's json.dumps as transformers calls it (ensure_ascii=False unless asked, no HTML
// escaping).
#include <algorithm>
#include <cstdio>
#include <string>

#include "jinja/render.h"

namespace kvvm::jinja::detail {

namespace {

void append_json_string(std::string_view s, bool ensure_ascii, std::string& out) {
  out.push_back('"');
  for (std::size_t i = 0; i < s.size();) {
    char c = s[i];
    switch (c) {
      case '"':
        out += "\\\"";
        ++i;
        continue;
      case '\\':
        out += "\\\\";
        ++i;
        continue;
      case '\n':
        out += "\\n";
        ++i;
        continue;
      case '\r':
        out += "\\r";
        ++i;
        continue;
      case '\t':
        out += "\\t";
        ++i;
        continue;
      case '\b':
        out += "\\b";
        ++i;
        continue;
      case '\f':
        out += "\\f";
        ++i;
        continue;
      default:
        break;
    }
    auto u = static_cast<unsigned char>(c);
    char buf[16];
    if (u < 0x20) {
      std::snprintf(buf, sizeof(buf), "\\u%04x", static_cast<unsigned>(u));
      out += buf;
      ++i;
    } else if (u < 0x80 || !ensure_ascii) {
      out.push_back(c);
      ++i;
    } else {
      // ensure_ascii: every code point past ASCII as \uXXXX, UTF-16 surrogates above the BMP.
      char32_t cp = decode_at(s, i);
      if (cp >= 0x10000) {
        cp -= 0x10000;
        std::snprintf(buf, sizeof(buf), "\\u%04x\\u%04x",
                      static_cast<unsigned>(0xd800 + (cp >> 10)),
                      static_cast<unsigned>(0xdc00 + (cp & 0x3ff)));
      } else {
        std::snprintf(buf, sizeof(buf), "\\u%04x", static_cast<unsigned>(cp));
      }
      out += buf;
    }
  }
  out.push_back('"');
}

// A dict key as json.dumps writes it: strings as they are, numbers, booleans and None as text.
std::string key_text(const Value& k) {
  switch (k.kind()) {
    case Kind::kString:
      return k.as_string();
    case Kind::kBool:
      return k.as_bool() ? "true" : "false";
    case Kind::kNone:
      return "null";
    case Kind::kInt:
      return std::to_string(k.as_int());
    case Kind::kFloat:
      return format_float(k.as_float());
    default:
      fail("keys must be str, int, float, bool or None, not " + std::string(k.type_name()));
  }
}

struct JsonWriter {
  const std::string* indent;  // null: one line
  std::string_view item_sep;
  std::string_view key_sep;
  bool sort_keys;
  bool ensure_ascii;
  std::size_t max_bytes;
  std::string out;

  void newline(std::size_t level) {
    if (out.size() > max_bytes) {
      exhausted("tojson output", "max_output_bytes", out.size(), max_bytes);
    }
    out.push_back('\n');
    for (std::size_t i = 0; i < level; ++i) out += *indent;
  }

  void write(const Value& v, std::size_t level) {
    if (level > 512) fail("tojson: nesting too deep");
    switch (v.kind()) {
      case Kind::kNone:
        out += "null";
        return;
      case Kind::kBool:
        out += v.as_bool() ? "true" : "false";
        return;
      case Kind::kInt:
        out += std::to_string(v.as_int());
        return;
      case Kind::kFloat: {
        double d = v.as_float();
        out += d != d            ? "NaN"
               : d == 1.0 / 0.0  ? "Infinity"
               : d == -1.0 / 0.0 ? "-Infinity"
                                 : format_float(d);
        return;
      }
      case Kind::kString:
        append_json_string(v.as_string(), ensure_ascii, out);
        return;
      case Kind::kList: {
        const List& items = v.as_list();
        if (items.empty()) {
          out += "[]";
          return;
        }
        out.push_back('[');
        for (std::size_t i = 0; i < items.size(); ++i) {
          if (i > 0) out += item_sep;
          if (indent != nullptr) newline(level + 1);
          write(items[i], level + 1);
        }
        if (indent != nullptr) newline(level);
        out.push_back(']');
        return;
      }
      case Kind::kDict: {
        const Dict& items = v.as_dict();
        if (items.empty()) {
          out += "{}";
          return;
        }
        std::vector<std::pair<std::string, const Value*>> entries;
        entries.reserve(items.size());
        for (const auto& [k, val] : items) entries.emplace_back(key_text(k), &val);
        if (sort_keys) {
          std::stable_sort(entries.begin(), entries.end(),
                           [](const auto& a, const auto& b) { return a.first < b.first; });
        }
        out.push_back('{');
        for (std::size_t i = 0; i < entries.size(); ++i) {
          if (i > 0) out += item_sep;
          if (indent != nullptr) newline(level + 1);
          append_json_string(entries[i].first, ensure_ascii, out);
          out += key_sep;
          write(*entries[i].second, level + 1);
        }
        if (indent != nullptr) newline(level);
        out.push_back('}');
        return;
      }
      case Kind::kUndefined:
        fail("Object of type Undefined is not JSON serializable");
      default:
        fail("Object of type " + std::string(v.type_name()) + " is not JSON serializable");
    }
  }
};

}  // namespace

std::string to_json(const Value& v, const Value& indent, std::string_view item_separator,
                    std::string_view key_separator, bool sort_keys, bool ensure_ascii,
                    std::size_t max_bytes) {
  std::string indent_text;
  bool pretty = false;
  if (indent.is_string()) {
    indent_text = indent.as_string();
    pretty = true;
  } else if (indent.is_int() || indent.is_bool()) {
    indent_text.assign(static_cast<std::size_t>(std::max<std::int64_t>(0, indent.as_int())), ' ');
    pretty = true;
  } else if (!indent.is_none()) {
    fail("tojson: indent must be an integer or a string");
  }
  JsonWriter w{pretty ? &indent_text : nullptr,
               item_separator,
               key_separator,
               sort_keys,
               ensure_ascii,
               max_bytes,
               {}};
  w.write(v, 0);
  return std::move(w.out);
}

}  // namespace kvvm::jinja::detail
