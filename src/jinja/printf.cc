// Python's printf-style formatting ("%s, %d" % args), behind the `%` operator on strings and
// the format filter.
#include <cmath>
#include <cstdio>
#include <string>

#include "jinja/render.h"

namespace kvvm::jinja::detail {

namespace {

struct Spec {
  std::string flags;
  int width = -1;
  int precision = -1;
  char type = 's';
};

std::string pad(std::string body, const Spec& spec, bool numeric) {
  if (spec.width < 0 || static_cast<int>(utf8_length(body)) >= spec.width) return body;
  auto missing = static_cast<std::size_t>(spec.width) - utf8_length(body);
  if (spec.flags.find('-') != std::string::npos) return body + std::string(missing, ' ');
  if (numeric && spec.flags.find('0') != std::string::npos) {
    std::size_t sign =
        !body.empty() && (body[0] == '-' || body[0] == '+' || body[0] == ' ') ? 1 : 0;
    return body.substr(0, sign) + std::string(missing, '0') + body.substr(sign);
  }
  return std::string(missing, ' ') + body;
}

std::string sign_prefix(bool negative, const Spec& spec) {
  if (negative) return "-";
  if (spec.flags.find('+') != std::string::npos) return "+";
  if (spec.flags.find(' ') != std::string::npos) return " ";
  return "";
}

std::string format_one(const Value& v, const Spec& spec) {
  switch (spec.type) {
    case 's':
    case 'r':
    case 'a': {
      std::string s = spec.type == 's' ? v.str() : v.repr();
      if (spec.precision >= 0) {
        std::size_t pos = 0;
        for (int i = 0; i < spec.precision && pos < s.size(); ++i) decode_at(s, pos);
        s.resize(pos);
      }
      return pad(std::move(s), spec, false);
    }
    case 'd':
    case 'i':
    case 'u':
    case 'x':
    case 'X':
    case 'o': {
      if (!v.is_number()) {
        fail("%" + std::string(1, spec.type) + " format: a real number is required, not " +
             std::string(v.type_name()));
      }
      if (v.is_float() && (spec.type == 'x' || spec.type == 'X' || spec.type == 'o')) {
        fail("%" + std::string(1, spec.type) + " format: an integer is required, not float");
      }
      double d = v.as_float();
      if (v.is_float() && (!std::isfinite(d) || std::fabs(d) >= 9.2e18)) {
        fail("cannot convert float to integer");
      }
      std::int64_t i = v.is_float() ? static_cast<std::int64_t>(d) : v.as_int();
      bool negative = i < 0;
      std::uint64_t magnitude =
          negative ? 0 - static_cast<std::uint64_t>(i) : static_cast<std::uint64_t>(i);
      char buf[32];
      const char* f = spec.type == 'x'   ? "%llx"
                      : spec.type == 'X' ? "%llX"
                      : spec.type == 'o' ? "%llo"
                                         : "%llu";
      std::snprintf(buf, sizeof(buf), f, static_cast<unsigned long long>(magnitude));
      std::string digits = buf;
      if (spec.precision >= 0 && static_cast<int>(digits.size()) < spec.precision) {
        digits.insert(0, static_cast<std::size_t>(spec.precision) - digits.size(), '0');
      }
      std::string prefix;
      if (spec.flags.find('#') != std::string::npos) {
        prefix = spec.type == 'x' ? "0x" : spec.type == 'X' ? "0X" : spec.type == 'o' ? "0o" : "";
      }
      return pad(sign_prefix(negative, spec) + prefix + digits, spec, true);
    }
    case 'f':
    case 'F':
    case 'e':
    case 'E':
    case 'g':
    case 'G': {
      if (!v.is_number()) {
        fail("must be real number, not " + std::string(v.type_name()));
      }
      double d = v.as_float();
      std::string f = "%";
      if (spec.flags.find('#') != std::string::npos) f += '#';
      f += '.' + std::to_string(spec.precision < 0 ? 6 : std::min(spec.precision, 300)) + spec.type;
      char buf[512];
      std::snprintf(buf, sizeof(buf), f.c_str(), std::fabs(d));
      std::string body = buf;
      if (std::isinf(d)) body = (spec.type >= 'a') ? "inf" : "INF";
      if (std::isnan(d)) body = (spec.type >= 'a') ? "nan" : "NAN";
      return pad(sign_prefix(std::signbit(d) && !std::isnan(d), spec) + body, spec, true);
    }
    case 'c': {
      if (v.is_string() && utf8_length(v.as_string()) == 1) return pad(v.as_string(), spec, false);
      if (v.is_int() && v.as_int() >= 0 && v.as_int() <= 0x10ffff) {
        std::string s;
        append_utf8(static_cast<char32_t>(v.as_int()), s);
        return pad(std::move(s), spec, false);
      }
      fail("%c requires an int or a unicode character");
    }
    default:
      fail(std::string("unsupported format character '") + spec.type + "'");
  }
}

}  // namespace

std::string printf_format(std::string_view format, const Value& args, Interpreter& in) {
  std::vector<Value> positional;
  const Value* mapping = nullptr;
  if (args.is_tuple()) {
    positional = args.as_list();
  } else if (args.is_dict()) {
    mapping = &args;
  } else {
    positional.push_back(args);
  }
  std::size_t next = 0;
  bool used_mapping = false;
  std::string out;
  for (std::size_t i = 0; i < format.size(); ++i) {
    char c = format[i];
    if (c != '%') {
      out.push_back(c);
      continue;
    }
    if (++i >= format.size()) fail("incomplete format");
    const Value* value = nullptr;
    if (format[i] == '(') {
      std::size_t close = format.find(')', i);
      if (close == std::string_view::npos) fail("incomplete format key");
      if (mapping == nullptr) fail("format requires a mapping");
      value = mapping->find(format.substr(i + 1, close - i - 1));
      if (value == nullptr)
        fail("format key '" + std::string(format.substr(i + 1, close - i - 1)) + "' not found");
      used_mapping = true;
      i = close + 1;
    }
    Spec spec;
    while (i < format.size() &&
           std::string_view("-+ #0").find(format[i]) != std::string_view::npos) {
      spec.flags.push_back(format[i++]);
    }
    auto number = [&](int& target) {
      if (i < format.size() && format[i] == '*') {
        if (next >= positional.size()) fail("not enough arguments for format string");
        target = static_cast<int>(positional[next++].as_int());
        ++i;
        return;
      }
      int n = -1;
      while (i < format.size() && format[i] >= '0' && format[i] <= '9') {
        n = (n < 0 ? 0 : n) * 10 + (format[i++] - '0');
        if (n > 1'000'000) fail("format width too big");
      }
      target = n;
    };
    number(spec.width);
    if (i < format.size() && format[i] == '.') {
      ++i;
      number(spec.precision);
      if (spec.precision < 0) spec.precision = 0;
    }
    while (i < format.size() && (format[i] == 'l' || format[i] == 'h' || format[i] == 'L')) ++i;
    if (i >= format.size()) fail("incomplete format");
    spec.type = format[i];
    if (spec.type == '%' && value == nullptr) {
      out.push_back('%');
      continue;
    }
    if (value == nullptr) {
      if (mapping != nullptr) {
        value = mapping;  // '%s' % {'a': 1} formats the dict itself
      } else {
        if (next >= positional.size()) fail("not enough arguments for format string");
        value = &positional[next++];
      }
    }
    if (spec.width > 0) in.check_size(out.size() + static_cast<std::size_t>(spec.width));
    out += format_one(*value, spec);
    in.check_size(out.size());
  }
  if (mapping == nullptr && next < positional.size()) {
    fail("not all arguments converted during string formatting");
  }
  (void)used_mapping;
  return out;
}

}  // namespace kvvm::jinja::detail
