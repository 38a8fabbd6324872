#include "jinja/text.h"

#include <algorithm>

#include "jinja/error.h"
#include "jinja/value.h"

namespace kvvm::jinja::detail {

namespace {

struct CodePoint {
  char32_t cp;
  std::size_t begin;
  std::size_t end;
};

std::vector<CodePoint> code_points(std::string_view s) {
  std::vector<CodePoint> out;
  out.reserve(s.size());
  for (std::size_t i = 0; i < s.size();) {
    std::size_t begin = i;
    char32_t cp = decode_at(s, i);
    out.push_back({cp, begin, i});
  }
  return out;
}

bool is_ascii_upper(char32_t c) { return c >= 'A' && c <= 'Z'; }
bool is_ascii_lower(char32_t c) { return c >= 'a' && c <= 'z'; }
bool is_cased(char32_t c) { return is_ascii_upper(c) || is_ascii_lower(c) || c >= 0xc0; }

char to_upper(char c) { return c >= 'a' && c <= 'z' ? static_cast<char>(c - 32) : c; }
char to_lower(char c) { return c >= 'A' && c <= 'Z' ? static_cast<char>(c + 32) : c; }

}  // namespace

bool is_unicode_space(char32_t cp) {
  return (cp >= 0x09 && cp <= 0x0d) || (cp >= 0x1c && cp <= 0x20) || cp == 0x85 || cp == 0xa0 ||
         cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200a) || cp == 0x2028 || cp == 0x2029 ||
         cp == 0x202f || cp == 0x205f || cp == 0x3000;
}

std::string py_strip(std::string_view s, const std::string* chars, bool left, bool right) {
  std::vector<char32_t> set;
  if (chars != nullptr) {
    for (const CodePoint& c : code_points(*chars)) set.push_back(c.cp);
  }
  auto strip_it = [&](char32_t cp) {
    return chars == nullptr ? is_unicode_space(cp)
                            : std::find(set.begin(), set.end(), cp) != set.end();
  };
  std::vector<CodePoint> cps = code_points(s);
  std::size_t b = 0;
  std::size_t e = cps.size();
  if (left) {
    while (b < e && strip_it(cps[b].cp)) ++b;
  }
  if (right) {
    while (e > b && strip_it(cps[e - 1].cp)) --e;
  }
  if (b == e) return {};
  return std::string(s.substr(cps[b].begin, cps[e - 1].end - cps[b].begin));
}

std::vector<std::string> py_split(std::string_view s, const std::string* sep, long long maxsplit,
                                  bool from_right) {
  std::vector<std::string> out;
  if (sep != nullptr) {
    if (sep->empty()) fail("empty separator");
    if (!from_right) {
      std::size_t pos = 0;
      while (maxsplit < 0 || static_cast<long long>(out.size()) < maxsplit) {
        std::size_t hit = s.find(*sep, pos);
        if (hit == std::string_view::npos) break;
        out.emplace_back(s.substr(pos, hit - pos));
        pos = hit + sep->size();
      }
      out.emplace_back(s.substr(pos));
      return out;
    }
    std::size_t end = s.size();
    while (maxsplit < 0 || static_cast<long long>(out.size()) < maxsplit) {
      if (end < sep->size()) break;
      std::size_t hit = s.rfind(*sep, end - sep->size());
      if (hit == std::string_view::npos) break;
      out.emplace_back(s.substr(hit + sep->size(), end - hit - sep->size()));
      end = hit;
    }
    out.emplace_back(s.substr(0, end));
    std::reverse(out.begin(), out.end());
    return out;
  }
  std::vector<CodePoint> cps = code_points(s);
  if (!from_right) {
    std::size_t i = 0;
    while (true) {
      while (i < cps.size() && is_unicode_space(cps[i].cp)) ++i;
      if (i == cps.size()) break;
      if (maxsplit >= 0 && static_cast<long long>(out.size()) == maxsplit) {
        out.emplace_back(s.substr(cps[i].begin));  // the rest keeps its trailing blanks
        break;
      }
      std::size_t j = i;
      while (j < cps.size() && !is_unicode_space(cps[j].cp)) ++j;
      out.emplace_back(s.substr(cps[i].begin, cps[j - 1].end - cps[i].begin));
      i = j;
    }
    return out;
  }
  std::size_t i = cps.size();
  while (true) {
    while (i > 0 && is_unicode_space(cps[i - 1].cp)) --i;
    if (i == 0) break;
    if (maxsplit >= 0 && static_cast<long long>(out.size()) == maxsplit) {
      out.emplace_back(s.substr(0, cps[i - 1].end));  // the rest keeps its leading blanks
      break;
    }
    std::size_t j = i;
    while (j > 0 && !is_unicode_space(cps[j - 1].cp)) --j;
    out.emplace_back(s.substr(cps[j].begin, cps[i - 1].end - cps[j].begin));
    i = j;
  }
  std::reverse(out.begin(), out.end());
  return out;
}

std::string py_replace(std::string_view s, std::string_view old, std::string_view replacement,
                       long long count) {
  std::string out;
  long long done = 0;
  if (old.empty()) {
    std::vector<CodePoint> cps = code_points(s);
    for (std::size_t i = 0; i <= cps.size(); ++i) {
      if (count < 0 || done < count) {
        out += replacement;
        ++done;
      }
      if (i < cps.size()) out.append(s.substr(cps[i].begin, cps[i].end - cps[i].begin));
    }
    return out;
  }
  std::size_t pos = 0;
  while (count < 0 || done < count) {
    std::size_t hit = s.find(old, pos);
    if (hit == std::string_view::npos) break;
    out.append(s.substr(pos, hit - pos));
    out.append(replacement);
    pos = hit + old.size();
    ++done;
  }
  out.append(s.substr(pos));
  return out;
}

std::string ascii_upper(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = to_upper(c);
  return out;
}

std::string ascii_lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = to_lower(c);
  return out;
}

std::string py_capitalize(std::string_view s) {
  std::string out = ascii_lower(s);
  if (!out.empty()) out[0] = to_upper(out[0]);
  return out;
}

std::string py_title(std::string_view s) {
  std::string out;
  bool previous_cased = false;
  for (const CodePoint& c : code_points(s)) {
    std::string_view piece = s.substr(c.begin, c.end - c.begin);
    if (c.cp < 0x80) {
      char ch = static_cast<char>(c.cp);
      out.push_back(previous_cased ? to_lower(ch) : to_upper(ch));
    } else {
      out.append(piece);
    }
    previous_cased = is_cased(c.cp);
  }
  return out;
}

std::string jinja_title(std::string_view s) {
  // Words begin after runs of whitespace, '-', '(', '{', '[' and '<'; each piece gets its first
  // character upper-cased and the rest lower-cased.
  auto separator = [](char32_t cp) {
    return is_unicode_space(cp) || cp == '-' || cp == '(' || cp == '{' || cp == '[' || cp == '<';
  };
  std::string out;
  std::vector<CodePoint> cps = code_points(s);
  std::size_t i = 0;
  while (i < cps.size()) {
    bool sep = separator(cps[i].cp);
    std::size_t j = i;
    while (j < cps.size() && separator(cps[j].cp) == sep) ++j;
    std::string piece(s.substr(cps[i].begin, cps[j - 1].end - cps[i].begin));
    std::string lowered = ascii_lower(piece);
    lowered[0] = to_upper(lowered[0]);
    out += lowered;
    i = j;
  }
  return out;
}

std::vector<std::string> py_splitlines(std::string_view s) {
  std::vector<std::string> out;
  std::vector<CodePoint> cps = code_points(s);
  std::size_t start = 0;
  for (std::size_t i = 0; i < cps.size(); ++i) {
    char32_t cp = cps[i].cp;
    bool is_break = cp == '\n' || cp == '\r' || cp == 0x0b || cp == 0x0c || cp == 0x1c ||
                    cp == 0x1d || cp == 0x1e || cp == 0x85 || cp == 0x2028 || cp == 0x2029;
    if (!is_break) continue;
    std::size_t line_begin = start;
    out.emplace_back(s.substr(line_begin, cps[i].begin - line_begin));
    if (cp == '\r' && i + 1 < cps.size() && cps[i + 1].cp == '\n') ++i;
    start = cps[i].end;
  }
  if (start < s.size()) out.emplace_back(s.substr(start));
  return out;
}

std::string html_escape(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&#34;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out.push_back(c);
    }
  }
  return out;
}

}  // namespace kvvm::jinja::detail
