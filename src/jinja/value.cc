#include "jinja/value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <string>

#include "jinja/error.h"

namespace kvvm::jinja::detail {

namespace {

const std::string kEmpty;

}  // namespace

Value Value::undefined(std::string hint) {
  Value v;
  if (!hint.empty()) v.ptr_ = std::make_shared<const std::string>(std::move(hint));
  return v;
}

Value Value::none() {
  Value v;
  v.kind_ = Kind::kNone;
  return v;
}

Value Value::boolean(bool b) {
  Value v;
  v.kind_ = Kind::kBool;
  v.int_ = b ? 1 : 0;
  return v;
}

Value Value::integer(std::int64_t i) {
  Value v;
  v.kind_ = Kind::kInt;
  v.int_ = i;
  return v;
}

Value Value::floating(double d) {
  Value v;
  v.kind_ = Kind::kFloat;
  v.float_ = d;
  return v;
}

Value Value::string(std::string s) {
  Value v;
  v.kind_ = Kind::kString;
  v.ptr_ = std::make_shared<const std::string>(std::move(s));
  return v;
}

namespace {

std::int64_t nesting_of(const Value& v) { return v.is_list() || v.is_dict() ? v.nesting() : 0; }

void check_nesting(std::int64_t depth) {
  if (depth > kMaxNesting) {
    exhausted("value nesting", "the nesting bound", static_cast<std::uint64_t>(depth), kMaxNesting);
  }
}

}  // namespace

Value Value::list(List items, bool tuple) {
  Value v;
  std::int64_t depth = 0;
  for (const Value& item : items) depth = std::max(depth, nesting_of(item));
  check_nesting(depth + 1);
  v.int_ = depth + 1;
  v.kind_ = Kind::kList;
  v.tuple_ = tuple;
  v.ptr_ = std::make_shared<const List>(std::move(items));
  return v;
}

Value Value::dict(Dict items) {
  Value v;
  std::int64_t depth = 0;
  for (const auto& [k, item] : items) depth = std::max({depth, nesting_of(k), nesting_of(item)});
  check_nesting(depth + 1);
  v.int_ = depth + 1;
  v.kind_ = Kind::kDict;
  v.ptr_ = std::make_shared<const Dict>(std::move(items));
  return v;
}

Value Value::callable(std::string name, std::function<Value(Interpreter&, CallArgs&)> fn) {
  Value v;
  v.kind_ = Kind::kCallable;
  v.ptr_ = std::make_shared<const Callable>(Callable{std::move(name), std::move(fn)});
  return v;
}

Value Value::ns(std::shared_ptr<Namespace> n) {
  Value v;
  v.kind_ = Kind::kNamespace;
  v.ptr_ = std::move(n);
  return v;
}

Value Value::loop(std::shared_ptr<const LoopState> state) {
  Value v;
  v.kind_ = Kind::kLoop;
  v.ptr_ = std::move(state);
  return v;
}

const std::string& Value::as_string() const {
  return kind_ == Kind::kString ? *static_cast<const std::string*>(ptr_.get()) : kEmpty;
}
const List& Value::as_list() const { return *static_cast<const List*>(ptr_.get()); }
const Dict& Value::as_dict() const { return *static_cast<const Dict*>(ptr_.get()); }
const Callable& Value::as_callable() const { return *static_cast<const Callable*>(ptr_.get()); }
Namespace& Value::as_namespace() const {
  // Namespaces are created mutable (Value::ns takes a non-const pointer).
  return *const_cast<Namespace*>(static_cast<const Namespace*>(ptr_.get()));
}
const LoopState& Value::as_loop() const { return *static_cast<const LoopState*>(ptr_.get()); }
const std::string& Value::undefined_hint() const {
  return kind_ == Kind::kUndefined && ptr_ ? *static_cast<const std::string*>(ptr_.get()) : kEmpty;
}

bool Value::truthy() const {
  switch (kind_) {
    case Kind::kUndefined:
    case Kind::kNone:
      return false;
    case Kind::kBool:
    case Kind::kInt:
      return int_ != 0;
    case Kind::kFloat:
      return float_ != 0.0;
    case Kind::kString:
      return !as_string().empty();
    case Kind::kList:
      return !as_list().empty();
    case Kind::kDict:
      return !as_dict().empty();
    case Kind::kNamespace:
      return true;
    case Kind::kCallable:
    case Kind::kLoop:
      return true;
  }
  return false;
}

bool Value::equals(const Value& other) const {
  if (is_number() && other.is_number()) {
    if (is_float() || other.is_float()) return as_float() == other.as_float();
    return int_ == other.int_;
  }
  if (kind_ != other.kind_) return false;
  switch (kind_) {
    case Kind::kUndefined:
    case Kind::kNone:
      return true;
    case Kind::kString:
      return as_string() == other.as_string();
    case Kind::kList: {
      // A tuple never equals a list in Python.
      if (tuple_ != other.tuple_) return false;
      const List& a = as_list();
      const List& b = other.as_list();
      if (a.size() != b.size()) return false;
      for (std::size_t i = 0; i < a.size(); ++i) {
        if (!a[i].equals(b[i])) return false;
      }
      return true;
    }
    case Kind::kDict: {
      const Dict& a = as_dict();
      const Dict& b = other.as_dict();
      if (a.size() != b.size()) return false;
      for (const auto& [k, v] : a) {
        const Value* w = other.find(k);
        if (w == nullptr || !v.equals(*w)) return false;
      }
      return true;
    }
    default:
      return ptr_ == other.ptr_;
  }
}

const Value* Value::find(const Value& key) const {
  if (kind_ != Kind::kDict) return nullptr;
  if (key.is_string()) return find(std::string_view(key.as_string()));
  for (const auto& [k, v] : as_dict()) {
    if (k.equals(key)) return &v;
  }
  return nullptr;
}

const Value* Value::find(std::string_view key) const {
  if (kind_ != Kind::kDict) return nullptr;
  for (const auto& [k, v] : as_dict()) {
    if (k.is_string() && k.as_string() == key) return &v;
  }
  return nullptr;
}

std::string format_float(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d < 0 ? "-inf" : "inf";
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof(buf), d, std::chars_format::scientific);
  std::string sci(buf, r.ptr);
  // sci is "[-]D[.DDD]e[+-]XX": split into sign, digits and exponent.
  std::size_t e = sci.find('e');
  int exponent = std::stoi(sci.substr(e + 1));
  std::string mantissa = sci.substr(0, e);
  bool negative = !mantissa.empty() && mantissa[0] == '-';
  if (negative) mantissa.erase(0, 1);
  std::string digits;
  for (char c : mantissa) {
    if (c != '.') digits.push_back(c);
  }
  std::string out = negative ? "-" : "";
  if (exponent < -4 || exponent >= 16) {
    out += digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char exp[16];
    std::snprintf(exp, sizeof(exp), "e%c%02d", exponent < 0 ? '-' : '+', std::abs(exponent));
    out += exp;
    return out;
  }
  if (exponent < 0) {
    out += "0." + std::string(static_cast<std::size_t>(-exponent - 1), '0') + digits;
    return out;
  }
  auto point = static_cast<std::size_t>(exponent) + 1;
  if (digits.size() <= point) {
    out += digits + std::string(point - digits.size(), '0') + ".0";
  } else {
    out += digits.substr(0, point) + "." + digits.substr(point);
  }
  return out;
}

namespace {

// Python's str.isprintable(), for the characters repr() escapes.
bool printable(char32_t cp) {
  if (cp < 0x20 || cp == 0x7f) return false;
  if (cp >= 0x80 && cp <= 0xa0) return false;
  if (cp == 0xad) return false;
  if ((cp >= 0x2000 && cp <= 0x200f) || (cp >= 0x2028 && cp <= 0x202f) ||
      (cp >= 0x205f && cp <= 0x206f) || cp == 0x3000 || cp == 0xfeff) {
    return false;
  }
  if (cp >= 0xd800 && cp <= 0xdfff) return false;
  return true;
}

}  // namespace

char32_t decode_at(std::string_view s, std::size_t& i) {
  auto c = static_cast<unsigned char>(s[i]);
  std::size_t n = c < 0x80 ? 0 : (c >> 5) == 6 ? 1 : (c >> 4) == 14 ? 2 : (c >> 3) == 30 ? 3 : 9;
  if (n == 0 || n == 9 || i + n > s.size() - 1) {
    ++i;
    return c;
  }
  char32_t cp = c & (0x3fu >> n);
  for (std::size_t k = 1; k <= n; ++k) {
    auto cc = static_cast<unsigned char>(s[i + k]);
    if ((cc & 0xc0) != 0x80) {
      ++i;
      return c;
    }
    cp = (cp << 6) | (cc & 0x3fu);
  }
  i += n + 1;
  return cp;
}

void append_utf8(char32_t cp, std::string& out) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xc0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3f)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xe0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3f)));
  } else {
    out.push_back(static_cast<char>(0xf0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3f)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3f)));
  }
}

std::size_t utf8_length(std::string_view s) {
  std::size_t n = 0;
  for (char c : s) {
    if ((static_cast<unsigned char>(c) & 0xc0) != 0x80) ++n;
  }
  return n;
}

void append_string_repr(std::string_view s, std::string& out) {
  char quote = '\'';
  if (s.find('\'') != std::string_view::npos && s.find('"') == std::string_view::npos) {
    quote = '"';
  }
  out.push_back(quote);
  std::size_t i = 0;
  while (i < s.size()) {
    std::size_t start = i;
    char32_t cp = decode_at(s, i);
    if (cp == static_cast<char32_t>(quote) || cp == '\\') {
      out.push_back('\\');
      out.push_back(static_cast<char>(cp));
    } else if (cp == '\n') {
      out += "\\n";
    } else if (cp == '\r') {
      out += "\\r";
    } else if (cp == '\t') {
      out += "\\t";
    } else if (!printable(cp)) {
      char buf[16];
      if (cp < 0x100) {
        std::snprintf(buf, sizeof(buf), "\\x%02x", static_cast<unsigned>(cp));
      } else {
        std::snprintf(buf, sizeof(buf), "\\u%04x", static_cast<unsigned>(cp));
      }
      out += buf;
    } else {
      out.append(s.substr(start, i - start));
    }
  }
  out.push_back(quote);
}

void Value::append_str(std::string& out) const {
  switch (kind_) {
    case Kind::kUndefined:
      return;
    case Kind::kString:
      out += as_string();
      return;
    default:
      append_repr(out);
  }
}

namespace {

// The namespaces being printed on this thread: one inside itself prints as <Namespace {...}>,
// as Python prints a recursive container.
thread_local std::vector<const void*> printing_namespaces;

}  // namespace

void Value::append_repr(std::string& out) const {
  switch (kind_) {
    case Kind::kUndefined:
      out += "Undefined";  // as Jinja's Undefined reprs inside a list or tuple
      return;
    case Kind::kNone:
      out += "None";
      return;
    case Kind::kBool:
      out += int_ != 0 ? "True" : "False";
      return;
    case Kind::kInt:
      out += std::to_string(int_);
      return;
    case Kind::kFloat:
      out += format_float(float_);
      return;
    case Kind::kString:
      append_string_repr(as_string(), out);
      return;
    case Kind::kList: {
      const List& items = as_list();
      out.push_back(tuple_ ? '(' : '[');
      for (std::size_t i = 0; i < items.size(); ++i) {
        if (i > 0) out += ", ";
        items[i].append_repr(out);
      }
      if (tuple_ && items.size() == 1) out.push_back(',');
      out.push_back(tuple_ ? ')' : ']');
      return;
    }
    case Kind::kDict: {
      out.push_back('{');
      bool first = true;
      for (const auto& [k, v] : as_dict()) {
        if (!first) out += ", ";
        first = false;
        k.append_repr(out);
        out += ": ";
        v.append_repr(out);
      }
      out.push_back('}');
      return;
    }
    case Kind::kCallable:
      out += "<function " + as_callable().name + ">";
      return;
    case Kind::kNamespace: {
      if (std::find(printing_namespaces.begin(), printing_namespaces.end(), ptr_.get()) !=
          printing_namespaces.end()) {
        out += "<Namespace {...}>";
        return;
      }
      // Chains of distinct namespaces recurse too: bounded like nesting.
      if (static_cast<std::int64_t>(printing_namespaces.size()) >= kMaxNesting) {
        exhausted("value nesting", "the nesting bound", printing_namespaces.size() + 1,
                  kMaxNesting);
      }
      printing_namespaces.push_back(ptr_.get());
      struct Pop {
        ~Pop() { printing_namespaces.pop_back(); }
      } pop;
      out += "<Namespace {";
      bool first = true;
      for (const auto& [k, v] : as_namespace().attributes) {
        if (!first) out += ", ";
        first = false;
        append_string_repr(k, out);
        out += ": ";
        v.append_repr(out);
      }
      out += "}>";
      return;
    }
    case Kind::kLoop:
      out += "<LoopContext>";
      return;
  }
}

std::string Value::str() const {
  std::string out;
  append_str(out);
  return out;
}

std::string Value::repr() const {
  std::string out;
  append_repr(out);
  return out;
}

std::string_view Value::type_name() const {
  switch (kind_) {
    case Kind::kUndefined:
      return "Undefined";
    case Kind::kNone:
      return "NoneType";
    case Kind::kBool:
      return "bool";
    case Kind::kInt:
      return "int";
    case Kind::kFloat:
      return "float";
    case Kind::kString:
      return "str";
    case Kind::kList:
      return tuple_ ? "tuple" : "list";
    case Kind::kDict:
      return "dict";
    case Kind::kCallable:
      return "function";
    case Kind::kNamespace:
      return "Namespace";
    case Kind::kLoop:
      return "LoopContext";
  }
  return "object";
}

}  // namespace kvvm::jinja::detail
