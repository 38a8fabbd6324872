// Python's str operations on UTF-8 text, shared by the filters and the str methods.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace kvvm::jinja::detail {

// str.isspace() for one code point.
bool is_unicode_space(char32_t cp);
// str.strip(chars) / lstrip / rstrip; `chars` null: whitespace.
std::string py_strip(std::string_view s, const std::string* chars, bool left, bool right);
// str.split(sep, maxsplit) and rsplit; `sep` null: runs of whitespace.
std::vector<std::string> py_split(std::string_view s, const std::string* sep, long long maxsplit,
                                  bool from_right);
std::string py_replace(std::string_view s, std::string_view old, std::string_view replacement,
                       long long count);
// str.upper() and str.lower() for Latin, Greek, Cyrillic, Armenian and fullwidth Latin letters
// (other characters are kept).
std::string py_upper(std::string_view s);
std::string py_lower(std::string_view s);
// str.capitalize(), str.title() and Jinja's title filter.
std::string py_capitalize(std::string_view s);
std::string py_title(std::string_view s);
std::string jinja_title(std::string_view s);
// str.splitlines() (without line ends).
std::vector<std::string> py_splitlines(std::string_view s);
// html-escape: & < > " '.
std::string html_escape(std::string_view s);

}  // namespace kvvm::jinja::detail
