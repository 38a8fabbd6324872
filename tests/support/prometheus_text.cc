#include "support/prometheus_text.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <limits>
#include <set>
#include <utility>

namespace kvvm::test {
namespace {

bool is_name_start(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':';
}
bool is_name_char(char c) { return is_name_start(c) || (c >= '0' && c <= '9'); }
bool is_blank(char c) { return c == ' ' || c == '\t'; }

bool valid_metric_name(std::string_view name) {
  if (name.empty() || !is_name_start(name[0])) return false;
  return std::all_of(name.begin(), name.end(), is_name_char);
}
bool valid_label_name(std::string_view name) {
  if (name.empty() || !is_name_start(name[0]) || name[0] == ':') return false;
  return std::all_of(name.begin(), name.end(), [](char c) { return c != ':' && is_name_char(c); });
}

// A sample value: a float in Go's ParseFloat syntax as Prometheus writes it, or +Inf, -Inf,
// NaN (exactly those spellings).
std::optional<double> parse_value(std::string_view token) {
  if (token == "+Inf") return std::numeric_limits<double>::infinity();
  if (token == "-Inf") return -std::numeric_limits<double>::infinity();
  if (token == "NaN") return std::numeric_limits<double>::quiet_NaN();
  std::string_view digits = token;
  if (!digits.empty() && (digits[0] == '-' || digits[0] == '+')) digits.remove_prefix(1);
  // from_chars also reads "inf" and "nan"; the format spells those only as above.
  if (digits.empty() || !((digits[0] >= '0' && digits[0] <= '9') || digits[0] == '.')) {
    return std::nullopt;
  }
  double result = 0;
  const char* begin = token.data() + (token[0] == '+' ? 1 : 0);
  const char* end = token.data() + token.size();
  auto [ptr, ec] = std::from_chars(begin, end, result);
  if (ec != std::errc() || ptr != end) return std::nullopt;
  return result;
}

bool parse_timestamp(std::string_view token) {
  if (!token.empty() && token[0] == '-') token.remove_prefix(1);
  std::int64_t ignored = 0;
  auto [ptr, ec] = std::from_chars(token.data(), token.data() + token.size(), ignored);
  return !token.empty() && ec == std::errc() && ptr == token.data() + token.size();
}

std::string_view next_token(std::string_view& rest) {
  while (!rest.empty() && is_blank(rest[0])) rest.remove_prefix(1);
  std::size_t end = 0;
  while (end < rest.size() && !is_blank(rest[end])) ++end;
  std::string_view token = rest.substr(0, end);
  rest.remove_prefix(end);
  return token;
}

class Parser {
 public:
  PromParse run(std::string_view text) {
    if (!text.empty() && text.back() != '\n') {
      return fail_at(count_lines(text), "the text does not end with a newline");
    }
    int number = 0;
    while (!text.empty()) {
      ++number;
      const std::size_t newline = text.find('\n');
      line_ = text.substr(0, newline);
      text.remove_prefix(newline + 1);
      line_number_ = number;
      std::string why = line_.empty() ? std::string() : line_[0] == '#' ? comment() : sample();
      if (!why.empty()) return fail_at(number, why, line_);
    }
    if (std::string why = close_family(); !why.empty()) return fail(why);
    return std::move(result_);
  }

 private:
  static int count_lines(std::string_view text) {
    return static_cast<int>(std::count(text.begin(), text.end(), '\n')) + 1;
  }
  PromParse fail_at(int number, const std::string& why, std::string_view line = {}) {
    PromParse failed;
    failed.error = "line " + std::to_string(number) + ": " + why;
    if (!line.empty()) failed.error += ": `" + std::string(line) + "`";
    return failed;
  }
  PromParse fail(const std::string& why) {
    PromParse failed;
    failed.error = why;
    return failed;
  }

  PromFamily* current() { return result_.families.empty() ? nullptr : &result_.families.back(); }

  // Starts or continues the family `name` for a HELP or TYPE line.
  std::string declare(std::string_view name, PromFamily*& family) {
    if (!valid_metric_name(name)) return "bad metric name '" + std::string(name) + "'";
    family = current();
    if (family != nullptr && family->name == name) {
      if (!family->samples.empty()) {
        return "family '" + family->name + "' declared a second time (after its samples)";
      }
      return {};
    }
    if (std::string why = close_family(); !why.empty()) return why;
    if (!declared_.insert(std::string(name)).second) {
      return "family '" + std::string(name) + "' declared a second time";
    }
    result_.families.push_back(PromFamily{std::string(name), "", "", {}});
    has_help_ = has_type_ = false;
    family = current();
    return {};
  }

  std::string comment() {
    std::string_view rest = line_.substr(1);
    if (rest.empty() || !is_blank(rest[0])) return {};  // a plain comment
    std::string_view keyword = next_token(rest);
    if (keyword != "HELP" && keyword != "TYPE") return {};  // a plain comment
    std::string_view name = next_token(rest);
    PromFamily* family = nullptr;
    if (std::string why = declare(name, family); !why.empty()) return why;
    if (keyword == "TYPE") {
      if (has_type_) return "a second TYPE for '" + family->name + "'";
      std::string_view type = next_token(rest);
      if (type != "counter" && type != "gauge" && type != "histogram" && type != "summary" &&
          type != "untyped") {
        return "unknown type '" + std::string(type) + "'";
      }
      if (!next_token(rest).empty()) return "text after the type";
      family->type = type;
      has_type_ = true;
      return {};
    }
    if (has_help_) return "a second HELP for '" + family->name + "'";
    has_help_ = true;
    if (!rest.empty() && is_blank(rest[0])) rest.remove_prefix(1);
    for (std::size_t i = 0; i < rest.size(); ++i) {
      if (rest[i] != '\\') {
        family->help += rest[i];
        continue;
      }
      if (++i == rest.size()) return "HELP ends in a lone backslash";
      if (rest[i] == '\\') {
        family->help += '\\';
      } else if (rest[i] == 'n') {
        family->help += '\n';
      } else {
        return std::string("bad escape '\\") + rest[i] + "' in HELP";
      }
    }
    return {};
  }

  // Parses {name="value",...} at the front of `rest`.
  std::string labels(std::string_view& rest, PromLabels& out) {
    rest.remove_prefix(1);  // '{'
    while (true) {
      if (!rest.empty() && rest[0] == '}') {
        if (!out.empty()) return "a trailing comma in the labels";
        rest.remove_prefix(1);
        return {};
      }
      std::size_t end = 0;
      while (end < rest.size() && rest[end] != '=') ++end;
      if (end == rest.size()) return "a label without '='";
      std::string name(rest.substr(0, end));
      if (!valid_label_name(name)) return "bad label name '" + name + "'";
      rest.remove_prefix(end + 1);
      if (rest.empty() || rest[0] != '"') return "label '" + name + "' value is not quoted";
      rest.remove_prefix(1);
      std::string label_value;
      bool closed = false;
      while (!rest.empty()) {
        const char c = rest[0];
        rest.remove_prefix(1);
        if (c == '"') {
          closed = true;
          break;
        }
        if (c != '\\') {
          label_value += c;
          continue;
        }
        if (rest.empty()) break;
        const char escaped = rest[0];
        rest.remove_prefix(1);
        if (escaped == '\\' || escaped == '"') {
          label_value += escaped;
        } else if (escaped == 'n') {
          label_value += '\n';
        } else {
          return std::string("bad escape '\\") + escaped + "' in label '" + name + "'";
        }
      }
      if (!closed) return "label '" + name + "' value is not closed";
      if (!out.emplace(name, std::move(label_value)).second) {
        return "label '" + name + "' twice";
      }
      if (!rest.empty() && rest[0] == ',') {
        rest.remove_prefix(1);
        if (!rest.empty() && rest[0] == '}') return "a trailing comma in the labels";
        continue;
      }
      if (!rest.empty() && rest[0] == '}') {
        rest.remove_prefix(1);
        return {};
      }
      return "expected ',' or '}' after label '" + name + "'";
    }
  }

  // Whether `name` is a sample name of `family`, and its suffix.
  static bool belongs(const PromFamily& family, std::string_view name, std::string_view& suffix) {
    suffix = {};
    if (name == family.name) {
      return family.type != "histogram";
    }
    if (family.type != "histogram" && family.type != "summary") return false;
    if (name.substr(0, family.name.size()) != family.name) return false;
    suffix = name.substr(family.name.size());
    return suffix == "_sum" || suffix == "_count" ||
           (family.type == "histogram" && suffix == "_bucket");
  }

  std::string sample() {
    std::string_view rest = line_;
    std::size_t end = 0;
    while (end < rest.size() && rest[end] != '{' && !is_blank(rest[end])) ++end;
    PromSample s;
    s.name = rest.substr(0, end);
    s.line = line_number_;
    rest.remove_prefix(end);
    if (!valid_metric_name(s.name)) return "bad metric name '" + s.name + "'";
    PromFamily* family = current();
    if (family == nullptr || !has_type_) return "sample '" + s.name + "' before any TYPE";
    std::string_view suffix;
    if (!belongs(*family, s.name, suffix)) {
      return "sample '" + s.name + "' outside its family (the current family is '" + family->name +
             "' of type " + family->type + ")";
    }
    if (!rest.empty() && rest[0] == '{') {
      if (std::string why = labels(rest, s.labels); !why.empty()) return why;
    }
    if (rest.empty() || !is_blank(rest[0])) return "no blank before the value";
    std::string_view value_token = next_token(rest);
    const std::optional<double> parsed = parse_value(value_token);
    if (!parsed) return "bad value '" + std::string(value_token) + "'";
    s.value = *parsed;
    if (std::string_view timestamp = next_token(rest); !timestamp.empty()) {
      if (!parse_timestamp(timestamp)) return "bad timestamp '" + std::string(timestamp) + "'";
      if (!next_token(rest).empty()) return "text after the timestamp";
    }
    const bool bucket = suffix == "_bucket";
    if (bucket != (s.labels.count("le") == 1)) {
      return bucket ? "a bucket without an 'le' label" : "an 'le' label outside a bucket";
    }
    if (family->type == "counter" && !(s.value >= 0)) return "a counter below 0 or NaN";
    if (!samples_seen_.insert({s.name, s.labels}).second) return "a duplicate sample";
    family->samples.push_back(std::move(s));
    return {};
  }

  // Checks the finished family: a histogram's series each have ascending buckets with
  // cumulative counts, a +Inf bucket equal to _count, and a _sum.
  std::string close_family() {
    const PromFamily* family = current();
    if (family == nullptr || family->type != "histogram") return {};
    struct Series {
      std::vector<std::pair<double, const PromSample*>> buckets;
      const PromSample* count = nullptr;
      const PromSample* sum = nullptr;
    };
    std::map<PromLabels, Series> series;
    for (const PromSample& s : family->samples) {
      PromLabels key = s.labels;
      key.erase("le");
      Series& one = series[key];
      if (s.name == family->name + "_count") {
        one.count = &s;
      } else if (s.name == family->name + "_sum") {
        one.sum = &s;
      } else {
        const std::optional<double> le = parse_value(s.labels.at("le"));
        if (!le || std::isnan(*le)) {
          return "line " + std::to_string(s.line) + ": bad le '" + s.labels.at("le") + "'";
        }
        one.buckets.emplace_back(*le, &s);
      }
    }
    for (const auto& [key, one] : series) {
      const std::string where = "histogram '" + family->name + "'";
      if (one.buckets.empty()) return where + ": a series without buckets";
      for (std::size_t i = 1; i < one.buckets.size(); ++i) {
        const PromSample& s = *one.buckets[i].second;
        if (!(one.buckets[i].first > one.buckets[i - 1].first)) {
          return "line " + std::to_string(s.line) + ": " + where + ": le not ascending";
        }
        if (s.value < one.buckets[i - 1].second->value) {
          return "line " + std::to_string(s.line) + ": " + where + ": buckets not cumulative";
        }
      }
      const auto& [last_le, last] = one.buckets.back();
      if (!std::isinf(last_le) || last_le < 0) {
        return "line " + std::to_string(last->line) + ": " + where + ": no le=\"+Inf\" bucket";
      }
      if (one.count == nullptr) return where + ": a series without _count";
      if (one.sum == nullptr) return where + ": a series without _sum";
      if (one.count->value != last->value) {
        return "line " + std::to_string(one.count->line) + ": " + where +
               ": _count differs from the +Inf bucket";
      }
    }
    return {};
  }

  PromParse result_;
  std::set<std::string> declared_;
  std::set<std::pair<std::string, PromLabels>> samples_seen_;
  bool has_help_ = false;
  bool has_type_ = false;
  std::string_view line_;
  int line_number_ = 0;
};

}  // namespace

PromParse parse_prometheus_text(std::string_view text) { return Parser().run(text); }

const PromFamily* find_family(const std::vector<PromFamily>& families, std::string_view name) {
  for (const PromFamily& family : families) {
    if (family.name == name) return &family;
  }
  return nullptr;
}

std::optional<double> value(const std::vector<PromFamily>& families, std::string_view sample_name,
                            const PromLabels& labels) {
  for (const PromFamily& family : families) {
    for (const PromSample& s : family.samples) {
      if (s.name == sample_name && s.labels == labels) return s.value;
    }
  }
  return std::nullopt;
}

}  // namespace kvvm::test
