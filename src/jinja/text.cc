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

// Simple (one to one) case mappings of the scripts chat text is mostly written in: Latin,
// Greek, Cyrillic, Armenian, fullwidth Latin. Other characters have no case here.
char32_t to_upper_cp(char32_t c) {
  if (c >= 'a' && c <= 'z') return c - 32;
  if (c < 0x80) return c;
  if (c >= 0xe0 && c <= 0xfe && c != 0xf7) return c - 0x20;
  if (c == 0xff) return 0x178;
  if (c >= 0x100 && c <= 0x17f) {
    bool odd = (c & 1) != 0;
    if ((c <= 0x12f || (c >= 0x132 && c <= 0x137) || (c >= 0x14a && c <= 0x177)) && odd)
      return c - 1;
    if (((c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17e)) && !odd) return c - 1;
    if (c == 0x131) return 'I';
    if (c == 0x17f) return 'S';
    return c;
  }
  if (c >= 0x3b1 && c <= 0x3c9) return c == 0x3c2 ? 0x3a3 : c - 0x20;
  if (c == 0x3ac) return 0x386;
  if (c >= 0x3ad && c <= 0x3af) return c - 0x25;
  if (c == 0x3cc) return 0x38c;
  if (c == 0x3cd || c == 0x3ce) return c - 0x3f;
  if (c >= 0x430 && c <= 0x44f) return c - 0x20;
  if (c >= 0x450 && c <= 0x45f) return c - 0x50;
  if (((c >= 0x460 && c <= 0x481) || (c >= 0x48a && c <= 0x4bf)) && (c & 1) != 0) return c - 1;
  if (c >= 0x561 && c <= 0x586) return c - 0x30;
  if (c >= 0xff41 && c <= 0xff5a) return c - 0x20;
  return c;
}

char32_t to_lower_cp(char32_t c) {
  if (c >= 'A' && c <= 'Z') return c + 32;
  if (c < 0x80) return c;
  if (c >= 0xc0 && c <= 0xde && c != 0xd7) return c + 0x20;
  if (c == 0x178) return 0xff;
  if (c >= 0x100 && c <= 0x17f) {
    bool odd = (c & 1) != 0;
    if ((c <= 0x12f || (c >= 0x132 && c <= 0x137) || (c >= 0x14a && c <= 0x177)) && !odd)
      return c + 1;
    if (((c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17e)) && odd) return c + 1;
    return c;
  }
  if (c >= 0x391 && c <= 0x3a9 && c != 0x3a2) return c + 0x20;
  if (c == 0x386) return 0x3ac;
  if (c >= 0x388 && c <= 0x38a) return c + 0x25;
  if (c == 0x38c) return 0x3cc;
  if (c == 0x38e || c == 0x38f) return c + 0x3f;
  if (c >= 0x410 && c <= 0x42f) return c + 0x20;
  if (c >= 0x400 && c <= 0x40f) return c + 0x50;
  if (((c >= 0x460 && c <= 0x481) || (c >= 0x48a && c <= 0x4bf)) && (c & 1) == 0) return c + 1;
  if (c >= 0x531 && c <= 0x556) return c + 0x30;
  if (c >= 0xff21 && c <= 0xff3a) return c + 0x20;
  return c;
}

bool is_cased(char32_t c) { return to_upper_cp(c) != c || to_lower_cp(c) != c || c == 0xdf; }

std::string map_case(std::string_view s, bool upper) {
  std::string out;
  out.reserve(s.size());
  for (std::size_t i = 0; i < s.size();) {
    auto b = static_cast<unsigned char>(s[i]);
    if (b < 0x80) {
      char c = s[i++];
      if (upper && c >= 'a' && c <= 'z') c = static_cast<char>(c - 32);
      if (!upper && c >= 'A' && c <= 'Z') c = static_cast<char>(c + 32);
      out.push_back(c);
      continue;
    }
    std::size_t start = i;
    char32_t cp = decode_at(s, i);
    if (upper && cp == 0xdf) {
      out += "SS";  // Python's str.upper() of sharp s
      continue;
    }
    char32_t mapped = upper ? to_upper_cp(cp) : to_lower_cp(cp);
    if (mapped == cp) {
      out.append(s.substr(start, i - start));
    } else {
      append_utf8(mapped, out);
    }
  }
  return out;
}

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

std::string py_upper(std::string_view s) { return map_case(s, true); }

std::string py_lower(std::string_view s) { return map_case(s, false); }

std::string py_capitalize(std::string_view s) {
  if (s.empty()) return {};
  std::size_t first = 0;
  decode_at(s, first);
  return py_upper(s.substr(0, first)) + py_lower(s.substr(first));
}

std::string py_title(std::string_view s) {
  std::string out;
  bool previous_cased = false;
  for (const CodePoint& c : code_points(s)) {
    std::string_view piece = s.substr(c.begin, c.end - c.begin);
    out += previous_cased ? py_lower(piece) : py_upper(piece);
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
    out += py_capitalize(piece);
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
