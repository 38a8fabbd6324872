// Integer and number schemas with bounds (minimum, maximum, exclusiveMinimum,
// exclusiveMaximum), as exact grammars: the digit strings of an integer range decompose into
// products of digit classes (as regular-expression numeric-range generators do); a number
// is its integer part's range plus which fractions each end allows. Bounded numbers are
// written without exponents (a subset of their syntax: every number written is in range).
#include <cmath>
#include <string>

#include "grammar/json_schema_compiler.h"

namespace kvvm::grammar {

namespace {

// Bounds past this are refused: integer parts are computed in 64 bits.
constexpr long double kMaxBound = 1e18L;

struct Bound {
  long double value = 0;
  bool strict = false;
  const char* keyword = "";
};

struct Bounds {
  std::optional<Bound> lower, upper;
};

// The bounds of `s`, the tighter where two keywords bound one side. exclusiveMinimum as a
// boolean is the older form (it makes minimum strict).
Result<Bounds> read_bounds(const SchemaJson& s, const std::string& path) {
  Bounds out;
  const auto number_of = [&](const char* key) -> Result<std::optional<long double>> {
    if (!s.contains(key) || s[key].is_boolean()) return std::optional<long double>();
    const SchemaJson& v = s[key];
    if (!v.is_number()) return schema_error(path, "\"", key, "\" ", v.dump(), " is not a number");
    const long double value =
        v.is_number_unsigned()  ? static_cast<long double>(v.get<std::uint64_t>())
        : v.is_number_integer() ? static_cast<long double>(v.get<std::int64_t>())
                                : static_cast<long double>(v.get<double>());
    if (!(std::fabs(value) <= kMaxBound)) {
      return schema_error(path, "\"", key, "\" ", v.dump(),
                          " is past +-1e18, the bounds supported");
    }
    return std::optional<long double>(value);
  };
  const auto flag = [&](const char* key) {
    return s.contains(key) && s[key].is_boolean() && s[key].get<bool>();
  };
  KVVM_ASSIGN_OR_RETURN(std::optional<long double> minimum, number_of("minimum"));
  KVVM_ASSIGN_OR_RETURN(std::optional<long double> maximum, number_of("maximum"));
  KVVM_ASSIGN_OR_RETURN(std::optional<long double> ex_minimum, number_of("exclusiveMinimum"));
  KVVM_ASSIGN_OR_RETURN(std::optional<long double> ex_maximum, number_of("exclusiveMaximum"));
  if (minimum) out.lower = Bound{*minimum, flag("exclusiveMinimum"), "minimum"};
  if (ex_minimum && (!out.lower || *ex_minimum >= out.lower->value)) {
    out.lower = Bound{*ex_minimum, true, "exclusiveMinimum"};
  }
  if (maximum) out.upper = Bound{*maximum, flag("exclusiveMaximum"), "maximum"};
  if (ex_maximum && (!out.upper || *ex_maximum <= out.upper->value)) {
    out.upper = Bound{*ex_maximum, true, "exclusiveMaximum"};
  }
  return out;
}

// The digit strings from `lo` to `hi` (as long as each other), as products of digit classes.
void same_length(const std::string& lo, const std::string& hi, std::vector<ByteSet> prefix,
                 std::vector<std::vector<ByteSet>>& out) {
  if (lo.empty()) {
    out.push_back(std::move(prefix));
    return;
  }
  const std::size_t rest = lo.size() - 1;
  const auto with = [&prefix](ByteSet set) {
    std::vector<ByteSet> next = prefix;
    next.push_back(set);
    return next;
  };
  if (lo[0] == hi[0]) {
    same_length(lo.substr(1), hi.substr(1), with(ByteSet::of(lo[0])), out);
    return;
  }
  const bool low_whole = lo.find_first_not_of('0', 1) == std::string::npos;
  const bool high_whole = hi.find_first_not_of('9', 1) == std::string::npos;
  char first = lo[0], last = hi[0];
  if (!low_whole) {
    same_length(lo.substr(1), std::string(rest, '9'), with(ByteSet::of(lo[0])), out);
    ++first;
  }
  if (!high_whole) --last;
  if (first <= last) {
    std::vector<ByteSet> product = with(ByteSet::range(first, last));
    for (std::size_t i = 0; i < rest; ++i) product.push_back(ByteSet::range('0', '9'));
    out.push_back(std::move(product));
  }
  if (!high_whole) same_length(std::string(rest, '0'), hi.substr(1), with(ByteSet::of(hi[0])), out);
}

std::uint64_t power10(std::size_t n) {
  std::uint64_t p = 1;
  for (std::size_t i = 0; i < n; ++i) p *= 10;
  return p;
}

// The decimal texts (no leading zeros) of the integers from `lo` to `hi` (none: unbounded).
// [lo, hi], or [lo, any) when not `bounded`. (Plain values, not an optional: GCC's
// -Wmaybe-uninitialized misreads an inlined optional here.)
std::vector<Sequence> integer_range(Builder& b, JsonValues& json, std::uint64_t lo, bool bounded,
                                    std::uint64_t hi) {
  std::vector<Sequence> out;
  if (bounded && lo > hi) return out;
  const std::size_t lo_len = std::to_string(lo).size();
  const std::size_t hi_len = bounded ? std::to_string(hi).size() : lo_len;
  std::vector<std::vector<ByteSet>> products;
  for (std::size_t len = lo_len; len <= hi_len; ++len) {
    const std::uint64_t from = len == lo_len ? lo : power10(len - 1);
    const std::uint64_t to = bounded && len == hi_len ? hi : power10(len) - 1;
    same_length(std::to_string(from), std::to_string(to), {}, products);
  }
  for (const auto& product : products) {
    Sequence seq;
    for (const ByteSet& set : product) Builder::append(seq, b.bytes(set));
    out.push_back(std::move(seq));
  }
  if (!bounded) {
    // Every integer with more digits than lo.
    Sequence longer = b.bytes(ByteSet::range('1', '9'));
    for (std::size_t i = 0; i < lo_len; ++i) Builder::append(longer, json.digit());
    Builder::append(longer, b.star("digits-any", json.digit()));
    out.push_back(std::move(longer));
  }
  return out;
}

}  // namespace

Result<Sequence> JsonSchemaCompiler::integer(const SchemaJson& s, const std::string& path) {
  KVVM_ASSIGN_OR_RETURN(Bounds bounds, read_bounds(s, path));
  if (!bounds.lower && !bounds.upper) return json_.integer();
  // The inclusive integer bounds: any real bound rounds exactly.
  std::optional<std::int64_t> lo, hi;
  if (bounds.lower) {
    const long double v = bounds.lower->value;
    lo = static_cast<std::int64_t>(bounds.lower->strict ? std::floor(v) + 1 : std::ceil(v));
  }
  if (bounds.upper) {
    const long double v = bounds.upper->value;
    hi = static_cast<std::int64_t>(bounds.upper->strict ? std::ceil(v) - 1 : std::floor(v));
  }
  if (lo && hi && *lo > *hi) {
    return schema_error(path, "no integer lies within its bounds (", *lo, " to ", *hi, ")");
  }
  std::vector<Sequence> options;
  if (!hi || *hi >= 0) {
    const std::uint64_t from = lo && *lo > 0 ? static_cast<std::uint64_t>(*lo) : 0;
    for (Sequence& seq :
         integer_range(b_, json_, from, hi.has_value(), hi ? static_cast<std::uint64_t>(*hi) : 0)) {
      options.push_back(std::move(seq));
    }
  }
  if (!lo || *lo < 0) {
    // Negative integers: "-" and a magnitude from max(1, -hi) to -lo.
    const std::uint64_t from = hi && *hi < 0 ? static_cast<std::uint64_t>(-*hi) : 1;
    const std::uint64_t to = lo ? static_cast<std::uint64_t>(-*lo) : 0;
    std::vector<Sequence> negative = integer_range(b_, json_, from, lo.has_value(), to);
    if (!negative.empty()) {
      options.push_back(
          Builder::cat({b_.literal("-"),
                        b_.any_of(concat(shown_path(path), "/negative"), std::move(negative))}));
    }
  }
  return b_.any_of(concat(shown_path(path), "/integer"), std::move(options));
}

Result<Sequence> JsonSchemaCompiler::number(const SchemaJson& s, const std::string& path) {
  KVVM_ASSIGN_OR_RETURN(Bounds bounds, read_bounds(s, path));
  if (!bounds.lower && !bounds.upper) return json_.number();
  for (const std::optional<Bound>* bound : {&bounds.lower, &bounds.upper}) {
    if (*bound && std::floor((*bound)->value) != (*bound)->value) {
      return schema_error(path, "\"", (*bound)->keyword, "\" ", s[(*bound)->keyword].dump(),
                          " on a number is not supported: only integer bounds are exact");
    }
  }
  // Fractions: any (or none), only zeros (or none), and one with a digit past zero.
  const Sequence dot = b_.literal(".");
  const Sequence any_fraction =
      b_.optional(concat(shown_path(path), "/fraction"), Builder::cat({dot, json_.digits()}));
  const Sequence zero_fraction = b_.optional(
      concat(shown_path(path), "/zero-fraction"),
      Builder::cat({dot, b_.plus(concat(shown_path(path), "/zeros"), b_.literal("0"))}));
  const Sequence digit_star = b_.star(concat(shown_path(path), "/fraction-digits"), json_.digit());
  const Sequence nonzero_fraction =
      Builder::cat({dot, digit_star, b_.bytes(ByteSet::range('1', '9')), digit_star});

  // The texts I(.F)? of magnitudes within a lower and an upper bound (integers, >= 0): the
  // integer parts strictly inside take any fraction; the ends take what their bound allows.
  struct Side {
    std::uint64_t value;
    bool strict;
  };
  const auto magnitude = [&](std::optional<Side> low, std::optional<Side> high) {
    std::vector<Sequence> out;
    const std::uint64_t from = low ? low->value + (low->strict ? 1 : 0) : 0;
    if (!high || high->value >= 1) {
      const std::uint64_t to = high ? high->value - 1 : 0;
      for (Sequence& seq : integer_range(b_, json_, from, high.has_value(), to)) {
        out.push_back(Builder::cat({seq, any_fraction}));
      }
    }
    if (low && low->strict && (!high || low->value < high->value)) {
      out.push_back(Builder::cat({b_.literal(std::to_string(low->value)), nonzero_fraction}));
    }
    if (high && !high->strict &&
        (!low || high->value > low->value || (high->value == low->value && !low->strict))) {
      out.push_back(Builder::cat({b_.literal(std::to_string(high->value)), zero_fraction}));
    }
    return out;
  };
  const auto as_side = [](const Bound& bound, bool negate) {
    const long double v = negate ? -bound.value : bound.value;
    return Side{static_cast<std::uint64_t>(v), bound.strict};
  };
  std::vector<Sequence> options;
  const auto& lower = bounds.lower;
  const auto& upper = bounds.upper;
  // x >= 0, written without a sign: the bounds as they are, where they bind.
  const bool positive_possible =
      !upper || upper->value > 0 || (upper->value == 0 && !upper->strict);
  if (positive_possible) {
    std::optional<Side> low, high;
    if (lower && (lower->value > 0 || (lower->value == 0 && lower->strict)))
      low = as_side(*lower, false);
    if (upper) high = as_side(*upper, false);
    for (Sequence& seq : magnitude(low, high)) options.push_back(std::move(seq));
  }
  // x = -M: x's lower bound is M's upper one, x's upper bound M's lower one.
  const bool negative_possible =
      !lower || lower->value < 0 || (lower->value == 0 && !lower->strict);
  if (negative_possible) {
    std::optional<Side> low, high;
    if (upper && (upper->value < 0 || (upper->value == 0 && upper->strict)))
      low = as_side(*upper, true);
    if (lower) high = as_side(*lower, true);
    std::vector<Sequence> negative = magnitude(low, high);
    if (!negative.empty()) {
      options.push_back(
          Builder::cat({b_.literal("-"),
                        b_.any_of(concat(shown_path(path), "/negative"), std::move(negative))}));
    }
  }
  if (options.empty()) return schema_error(path, "no number lies within its bounds");
  return b_.any_of(concat(shown_path(path), "/number"), std::move(options));
}

}  // namespace kvvm::grammar
