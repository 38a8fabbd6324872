// String schemas: minLength / maxLength (code points, as JSON Schema counts them: one
// character of the string's value, escaped or not, is one), pattern (the regular-expression
// front end's rules, embedded), and the formats date, time, date-time, uuid and email written
// as grammars of their own.
#include <algorithm>

#include "grammar/json_schema_compiler.h"
#include "grammar/regex_embed.h"

namespace kvvm::grammar {

namespace {

// Bytes that a string's text may hold as themselves: not '"', '\' or a control character.
bool plain_byte(unsigned b) { return b >= 0x20 && b != '"' && b != '\\'; }

// Whether a '|' stands outside every group and class of `pattern`.
bool has_top_level_bar(std::string_view pattern) {
  int depth = 0;
  bool in_class = false;
  for (std::size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (c == '\\') {
      ++i;
    } else if (in_class) {
      if (c == ']') in_class = false;
    } else if (c == '[') {
      in_class = true;
    } else if (c == '(') {
      ++depth;
    } else if (c == ')') {
      --depth;
    } else if (c == '|' && depth == 0) {
      return true;
    }
  }
  return false;
}

}  // namespace

Result<Sequence> JsonSchemaCompiler::string(const SchemaJson& s, const std::string& path) {
  KVVM_ASSIGN_OR_RETURN(std::optional<std::uint64_t> min, count_keyword(s, "minLength", path));
  KVVM_ASSIGN_OR_RETURN(std::optional<std::uint64_t> max, count_keyword(s, "maxLength", path));
  const bool has_pattern = s.contains("pattern");
  const bool has_format = s.contains("format");
  // Each of these is a language of its own; their intersections are not built.
  if (has_format && (has_pattern || min || max)) {
    return schema_error(path, "\"format\" beside \"",
                        has_pattern ? "pattern"
                        : min       ? "minLength"
                                    : "maxLength",
                        "\" is not supported");
  }
  if (has_pattern && (min || max)) {
    return schema_error(path, "\"pattern\" beside \"", min ? "minLength" : "maxLength",
                        "\" is not supported");
  }
  if (has_format) {
    if (!s["format"].is_string()) return schema_error(path, "\"format\" is not a string");
    return format(s["format"].get<std::string>(), path);
  }
  if (has_pattern) {
    if (!s["pattern"].is_string()) return schema_error(path, "\"pattern\" is not a string");
    return pattern(s["pattern"].get<std::string>(), path);
  }
  if (max && min.value_or(0) > *max) {
    return schema_error(path, "\"minLength\" ", *min, " is more than \"maxLength\" ", *max);
  }
  if (min.value_or(0) == 0 && !max) return json_.string();
  KVVM_ASSIGN_OR_RETURN(Sequence body, b_.repeat(concat("schema at ", shown_path(path), ": length"),
                                                 json_.string_char(), min.value_or(0), max));
  return Builder::cat({b_.literal("\""), body, b_.literal("\"")});
}

Result<Sequence> JsonSchemaCompiler::pattern(std::string_view text, const std::string& path) {
  // JSON Schema patterns search: unanchored ends match anything around the pattern.
  std::string_view inner = text;
  const bool anchored_start = !inner.empty() && inner.front() == '^';
  if (anchored_start) inner.remove_prefix(1);
  bool anchored_end = false;
  if (!inner.empty() && inner.back() == '$') {
    std::size_t slashes = 0;
    while (slashes + 1 < inner.size() && inner[inner.size() - 2 - slashes] == '\\') ++slashes;
    if (slashes % 2 == 0) {
      anchored_end = true;
      inner.remove_suffix(1);
    }
  }
  if ((anchored_start || anchored_end) && has_top_level_bar(inner)) {
    return schema_error(path, "pattern \"", text,
                        "\": ^ or $ beside a top-level | is not supported");
  }
  // The pattern's rules are built apart, then copied with every byte that would need an
  // escape inside a JSON string ('"', '\', control characters) taken out of their byte sets:
  // a match is written as itself, so its text is its value. Rules left matching nothing go.
  Grammar scratch;
  Builder scratch_builder(scratch, options_.limits);
  KVVM_ASSIGN_OR_RETURN(
      Sequence body,
      embed_regex(scratch_builder, inner, concat("schema at ", shown_path(path), ": pattern")));
  const auto& rules = scratch.rules();
  std::vector<ByteSet> sets = scratch.byte_sets();
  for (ByteSet& set : sets) {
    for (unsigned b = 0; b < 0x80; ++b) {
      if (!plain_byte(b)) set.words[b >> 6] &= ~(std::uint64_t{1} << (b & 63));
    }
  }
  std::vector<bool> live(rules.size(), false);
  const auto seq_live = [&](const Sequence& seq) {
    return std::all_of(seq.begin(), seq.end(), [&](const Element& e) {
      return e.kind == Element::Kind::kBytes ? !sets[e.index].empty() : bool(live[e.index]);
    });
  };
  for (bool changed = true; changed;) {
    changed = false;
    for (std::size_t r = 0; r < rules.size(); ++r) {
      if (live[r]) continue;
      for (const Sequence& alt : rules[r].alternatives) {
        if (seq_live(alt)) {
          live[r] = true;
          changed = true;
          break;
        }
      }
    }
  }
  if (!seq_live(body)) {
    return schema_error(path, "pattern \"", text,
                        "\" matches only strings with '\"', '\\' or control characters, which "
                        "are not written inside a patterned string");
  }
  std::vector<RuleId> map(rules.size(), 0);
  for (std::size_t r = 0; r < rules.size(); ++r) {
    if (live[r]) map[r] = grammar_.declare(concat(shown_path(path), "/pattern/", rules[r].name));
  }
  const auto copy = [&](const Sequence& seq) {
    Sequence out;
    for (const Element& e : seq) {
      if (e.kind == Element::Kind::kBytes)
        Builder::append(out, b_.bytes(sets[e.index]));
      else
        Builder::append(out, b_.ref(map[e.index]));
    }
    return out;
  };
  for (std::size_t r = 0; r < rules.size(); ++r) {
    if (!live[r]) continue;
    std::vector<Sequence> alternatives;
    for (const Sequence& alt : rules[r].alternatives) {
      if (seq_live(alt)) alternatives.push_back(copy(alt));
    }
    grammar_.define(map[r], std::move(alternatives));
  }
  KVVM_RETURN_IF_ERROR(b_.check_size(concat("schema at ", shown_path(path), ": pattern")));
  const Sequence any = b_.star(concat(shown_path(path), "/pattern-around"), json_.string_char());
  return Builder::cat({b_.literal("\""), anchored_start ? Sequence{} : any, copy(body),
                       anchored_end ? Sequence{} : any, b_.literal("\"")});
}

Result<Sequence> JsonSchemaCompiler::format(std::string_view name, const std::string& path) {
  const auto found = formats_.find(std::string(name));
  if (found != formats_.end()) return b_.ref(found->second);
  const Sequence quote = b_.literal("\"");
  const auto d = [&] { return json_.digit(); };
  const auto set = [&](std::string_view list) { return b_.bytes(ByteSet::of_bytes(list)); };
  const auto range = [&](char lo, char hi) { return b_.bytes(ByteSet::range(lo, hi)); };
  const auto lit = [&](std::string_view text) { return b_.literal(text); };
  const auto hex = [&] {
    ByteSet h = ByteSet::range('0', '9');
    h.add_range('a', 'f');
    h.add_range('A', 'F');
    return b_.bytes(h);
  };
  const auto hexes = [&](int n) {
    Sequence out;
    for (int i = 0; i < n; ++i) Builder::append(out, hex());
    return out;
  };
  // full-date (RFC 3339) of a real day: years 0001..9999, each month's days, 02-29 only in
  // leap years (divisible by 4, centuries only when divisible by 400).
  const auto date = [&] {
    const Sequence year =
        b_.any_of("date-year", {Builder::cat({range('1', '9'), d(), d(), d()}),
                                Builder::cat({lit("0"), range('1', '9'), d(), d()}),
                                Builder::cat({lit("00"), range('1', '9'), d()}),
                                Builder::cat({lit("000"), range('1', '9')})});
    const Sequence day28 = b_.any_of(
        "date-day", {Builder::cat({lit("0"), range('1', '9')}), Builder::cat({lit("1"), d()}),
                     Builder::cat({lit("2"), range('0', '8')})});
    const Sequence day30 = b_.any_of("date-day30", {day28, lit("29"), lit("30")});
    const Sequence day31 = b_.any_of("date-day31", {day30, lit("31")});
    const Sequence month_day = b_.any_of(
        "date-month-day",
        {Builder::cat({b_.any_of("date-month31", {Builder::cat({lit("0"), set("13578")}),
                                                  Builder::cat({lit("1"), set("02")})}),
                       lit("-"), day31}),
         Builder::cat({b_.any_of("date-month30", {Builder::cat({lit("0"), set("469")}), lit("11")}),
                       lit("-"), day30}),
         Builder::cat({lit("02-"), day28})});
    const Sequence leap_year = b_.any_of(
        "date-leap-year",
        {Builder::cat({d(), d(),
                       b_.any_of("date-leap-yy", {Builder::cat({set("02468"), set("48")}),
                                                  Builder::cat({set("2468"), lit("0")}),
                                                  Builder::cat({set("13579"), set("26")})})}),
         Builder::cat({b_.any_of("date-leap-cc", {Builder::cat({lit("0"), set("48")}),
                                                  Builder::cat({set("2468"), set("048")}),
                                                  Builder::cat({set("13579"), set("26")})}),
                       lit("00")})});
    return b_.any_of("date", {Builder::cat({year, lit("-"), month_day}),
                              Builder::cat({leap_year, lit("-02-29")})});
  };
  // full-time (RFC 3339), seconds 00..59 (leap seconds are not written), an optional
  // fraction, and Z or a numeric offset.
  const auto time = [&] {
    const Sequence hour = b_.any_of(
        "time-hour", {Builder::cat({set("01"), d()}), Builder::cat({lit("2"), range('0', '3')})});
    const Sequence minute = Builder::cat({range('0', '5'), d()});
    const Sequence offset =
        b_.any_of("time-offset", {lit("Z"), Builder::cat({set("+-"), hour, lit(":"), minute})});
    return b_.any_of(
        "time",
        {Builder::cat({hour, lit(":"), minute, lit(":"), minute,
                       b_.optional("time-fraction", Builder::cat({lit("."), json_.digits()})),
                       offset})});
  };
  Sequence body;
  if (name == "date") {
    body = date();
  } else if (name == "time") {
    body = time();
  } else if (name == "date-time") {
    body = Builder::cat({date(), lit("T"), time()});
  } else if (name == "uuid") {
    body = Builder::cat({hexes(8), lit("-"), hexes(4), lit("-"), hexes(4), lit("-"), hexes(4),
                         lit("-"), hexes(12)});
  } else if (name == "email") {
    // A dot-atom local part and a host name of letter-digit-hyphen labels.
    ByteSet atext = ByteSet::range('a', 'z');
    atext.add_range('A', 'Z');
    atext.add_range('0', '9');
    atext.add(ByteSet::of_bytes("!#$%&'*+/=?^_`{|}~-"));
    ByteSet alnum = ByteSet::range('a', 'z');
    alnum.add_range('A', 'Z');
    alnum.add_range('0', '9');
    ByteSet alnum_hyphen = alnum;
    alnum_hyphen.add('-');
    const Sequence atom = b_.plus("email-atom", b_.bytes(atext));
    const Sequence local =
        Builder::cat({atom, b_.star("email-local", Builder::cat({lit("."), atom}))});
    const Sequence label = b_.any_of(
        "email-label",
        {Builder::cat({b_.bytes(alnum),
                       b_.optional("email-label-tail",
                                   Builder::cat({b_.star("email-label-mid", b_.bytes(alnum_hyphen)),
                                                 b_.bytes(alnum)}))})});
    body = Builder::cat(
        {local, lit("@"), label, b_.star("email-domain", Builder::cat({lit("."), label}))});
  } else {
    return schema_error(path, "format \"", name, "\" is not supported");
  }
  const RuleId rule = grammar_.add(concat("format-", name), {Builder::cat({quote, body, quote})});
  formats_[std::string(name)] = rule;
  return b_.ref(rule);
}

}  // namespace kvvm::grammar
