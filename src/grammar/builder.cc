#include "grammar/builder.h"

#include <algorithm>
#include <string>

#include "grammar/text.h"
#include "tokenizer/utf8.h"

namespace kvvm::grammar {

std::string show_byte(std::uint8_t byte) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  if (byte >= 0x20 && byte < 0x7f) return std::string("'") + static_cast<char>(byte) + "'";
  return std::string("\\x") + kHex[byte >> 4] + kHex[byte & 15];
}

Sequence Builder::literal(std::string_view text) {
  Sequence out;
  out.reserve(text.size());
  for (char c : text) {
    out.push_back(
        Element{Element::Kind::kBytes, grammar_.intern(ByteSet::of(static_cast<std::uint8_t>(c)))});
  }
  return out;
}

Sequence Builder::bytes(const ByteSet& set) {
  return {Element{Element::Kind::kBytes, grammar_.intern(set)}};
}

Sequence Builder::cat(std::initializer_list<Sequence> parts) {
  Sequence out;
  for (const Sequence& part : parts) append(out, part);
  return out;
}

Sequence Builder::any_of(std::string_view name, std::vector<Sequence> options) {
  if (options.size() == 1) return std::move(options[0]);
  return ref(grammar_.add(name, std::move(options)));
}

Sequence Builder::optional(std::string_view name, const Sequence& body) {
  return ref(grammar_.add(name, {body, {}}));
}

Sequence Builder::star(std::string_view name, const Sequence& body) {
  const RuleId rule = grammar_.declare(name);
  Sequence again = body;
  again.push_back(Element{Element::Kind::kRule, rule});  // in last place: no stack growth
  grammar_.define(rule, {std::move(again), {}});
  return ref(rule);
}

Sequence Builder::plus(std::string_view name, const Sequence& body) {
  Sequence out = body;
  append(out, star(name, body));
  return out;
}

Result<Sequence> Builder::repeat(std::string_view name, const Sequence& body, std::uint64_t min,
                                 std::optional<std::uint64_t> max) {
  if (max && *max < min) {
    return Status::InvalidArgument(
        concat(name, ": a repetition of at least ", min, " and at most ", *max));
  }
  // Each copy costs the body's elements, and each optional copy a rule; the bounds are checked
  // before anything is built, in arithmetic that cannot wrap (counts come from user text).
  const std::uint64_t copies = max ? *max : std::max(min, min + 1);
  const std::uint64_t size = std::max<std::size_t>(body.size(), 1);
  const std::uint64_t used = grammar_.element_count();
  const std::uint64_t room = used < limits_.max_elements ? limits_.max_elements - used : 0;
  const std::uint64_t cost = copies > UINT64_MAX / size ? UINT64_MAX : copies * size;
  if (cost > room) {
    return Status::ResourceExhausted(
        concat(name, ": a repetition of ", max ? *max : min, " copies of ", body.size(),
               " elements passes the grammar's bound of ", limits_.max_elements, " elements"),
        {cost, limits_.max_elements, limits_.max_elements});
  }
  const std::uint64_t rules = max ? *max - min : 1;
  if (rules > limits_.max_rules || grammar_.rules().size() + rules > limits_.max_rules) {
    return Status::ResourceExhausted(
        concat(name, ": a repetition with ", rules,
               " optional copies passes the grammar's bound of ", limits_.max_rules, " rules"),
        {rules, limits_.max_rules, limits_.max_rules});
  }
  Sequence out;
  for (std::uint64_t i = 0; i < min; ++i) append(out, body);
  if (!max) {
    append(out, star(name, body));
    return out;
  }
  // body (body (body)?)? ... : the optional tail, built from the inside out.
  Sequence tail;
  for (std::uint64_t i = min; i < *max; ++i) {
    Sequence inner = body;
    append(inner, tail);
    tail = optional(name, inner);
  }
  append(out, tail);
  return out;
}

Result<Sequence> Builder::separated(std::string_view name, const Sequence& body,
                                    const Sequence& separator, std::uint64_t min,
                                    std::optional<std::uint64_t> max) {
  if (max && *max < min) {
    return Status::InvalidArgument(concat(name, ": at least ", min, " items and at most ", *max));
  }
  if (max && *max == 0) return Sequence{};
  Sequence next = separator;
  append(next, body);
  Result<Sequence> rest = repeat(name, next, min > 0 ? min - 1 : 0,
                                 max ? std::optional<std::uint64_t>(*max - 1) : std::nullopt);
  if (!rest.ok()) return rest.status();
  Sequence list = body;
  append(list, *rest);
  if (min > 0) return list;
  return optional(name, list);
}

std::vector<CodepointRange> normalize_ranges(std::vector<CodepointRange> ranges, bool negate) {
  std::vector<CodepointRange> clipped;
  for (CodepointRange r : ranges) {
    if (r.lo > r.hi || r.lo > 0x10FFFF) continue;
    r.hi = std::min<std::uint32_t>(r.hi, 0x10FFFF);
    // Surrogates are not UTF-8: cut them out.
    if (r.lo < 0xD800 && r.hi >= 0xD800) {
      clipped.push_back({r.lo, 0xD7FF});
      if (r.hi > 0xDFFF) clipped.push_back({0xE000, r.hi});
    } else if (r.lo >= 0xD800 && r.lo <= 0xDFFF) {
      if (r.hi > 0xDFFF) clipped.push_back({0xE000, r.hi});
    } else {
      clipped.push_back(r);
    }
  }
  std::sort(clipped.begin(), clipped.end(),
            [](const CodepointRange& a, const CodepointRange& b) { return a.lo < b.lo; });
  std::vector<CodepointRange> merged;
  for (const CodepointRange& r : clipped) {
    if (!merged.empty() && r.lo <= merged.back().hi + 1) {
      merged.back().hi = std::max(merged.back().hi, r.hi);
    } else {
      merged.push_back(r);
    }
  }
  if (!negate) return merged;
  std::vector<CodepointRange> out;
  std::uint32_t next = 0;
  const auto add = [&out](std::uint32_t lo, std::uint32_t hi) {
    if (lo > hi) return;
    if (lo < 0xD800 && hi >= 0xD800) {
      out.push_back({lo, 0xD7FF});
      if (hi > 0xDFFF) out.push_back({0xE000, hi});
    } else if (lo >= 0xD800 && lo <= 0xDFFF) {
      if (hi > 0xDFFF) out.push_back({0xE000, hi});
    } else {
      out.push_back({lo, hi});
    }
  };
  for (const CodepointRange& r : merged) {
    if (r.lo > next) add(next, r.lo - 1);
    next = r.hi + 1;
  }
  if (next <= 0x10FFFF) add(next, 0x10FFFF);
  return out;
}

namespace {

int utf8_length(std::uint32_t cp) { return cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4; }

void encode(std::uint32_t cp, std::uint8_t* out) {
  std::string bytes;
  tokenizer::detail::utf8_append(bytes, static_cast<char32_t>(cp));
  for (std::size_t i = 0; i < bytes.size(); ++i) out[i] = static_cast<std::uint8_t>(bytes[i]);
}

// [lo, hi] of one encoded length as products of byte ranges: split until, at every level, the
// range covers whole blocks of continuation bytes.
void split(std::uint32_t lo, std::uint32_t hi, std::vector<std::vector<ByteSet>>& out) {
  const int n = utf8_length(lo);
  for (int i = 1; i < n; ++i) {
    const std::uint32_t m = (1u << (6 * i)) - 1;
    if ((lo & ~m) != (hi & ~m)) {
      if ((lo & m) != 0) {
        split(lo, lo | m, out);
        split((lo | m) + 1, hi, out);
        return;
      }
      if ((hi & m) != m) {
        split(lo, (hi & ~m) - 1, out);
        split(hi & ~m, hi, out);
        return;
      }
    }
  }
  std::uint8_t a[4], b[4];
  encode(lo, a);
  encode(hi, b);
  std::vector<ByteSet> product;
  for (int k = 0; k < n; ++k) product.push_back(ByteSet::range(a[k], b[k]));
  out.push_back(std::move(product));
}

}  // namespace

Sequence Builder::codepoints(std::string_view name, std::vector<CodepointRange> ranges,
                             bool negate) {
  std::vector<std::vector<ByteSet>> products;
  for (const CodepointRange& r : normalize_ranges(std::move(ranges), negate)) {
    // Split at the encoded lengths' bounds first.
    static constexpr std::uint32_t kBounds[] = {0x7F, 0x7FF, 0xFFFF, 0x10FFFF};
    std::uint32_t lo = r.lo;
    for (std::uint32_t bound : kBounds) {
      if (lo > r.hi) break;
      if (lo > bound) continue;
      const std::uint32_t hi = std::min(r.hi, bound);
      split(lo, hi, products);
      lo = hi + 1;
    }
  }
  // Products of one byte merge into one set: a class of ASCII is one element.
  ByteSet single;
  std::vector<Sequence> options;
  for (const auto& product : products) {
    if (product.size() == 1) {
      single.add(product[0]);
      continue;
    }
    Sequence seq;
    for (const ByteSet& set : product) append(seq, bytes(set));
    options.push_back(std::move(seq));
  }
  if (!single.empty()) options.insert(options.begin(), bytes(single));
  if (options.empty()) return ref(grammar_.add(name, {}));  // matches nothing
  return any_of(name, std::move(options));
}

Sequence Builder::any_codepoint() {
  if (!any_codepoint_) {
    const Sequence seq = codepoints("any-char", {{0, 0x10FFFF}});
    any_codepoint_ = grammar_.add("any-char-ref", {seq});
  }
  return ref(*any_codepoint_);
}

Status Builder::check_size(std::string_view where) const {
  const std::size_t elements = grammar_.element_count();
  if (elements > limits_.max_elements) {
    return Status::ResourceExhausted(
        concat(where, ": the grammar passes its bound of ", limits_.max_elements, " elements"),
        {elements, limits_.max_elements, limits_.max_elements});
  }
  if (grammar_.rules().size() > limits_.max_rules) {
    return Status::ResourceExhausted(
        concat(where, ": the grammar passes its bound of ", limits_.max_rules, " rules"),
        {grammar_.rules().size(), limits_.max_rules, limits_.max_rules});
  }
  return Status::Ok();
}

}  // namespace kvvm::grammar
