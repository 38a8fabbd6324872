#include "grammar/json_values.h"

#include <algorithm>

namespace kvvm::grammar {

namespace {

ByteSet hex() {
  ByteSet set = ByteSet::range('0', '9');
  set.add_range('a', 'f');
  set.add_range('A', 'F');
  return set;
}

}  // namespace

JsonValues::JsonValues(Builder& builder, const JsonWhitespace& whitespace)
    : b_(builder), whitespace_(whitespace) {
  whitespace_.max_run = std::min(whitespace_.max_run, kMaxWhitespaceRun);
}

RuleId JsonValues::lazy(std::optional<RuleId>& slot, std::string_view name) {
  if (!slot) slot = b_.grammar().declare(name);
  return *slot;
}

Sequence JsonValues::ws() {
  if (!whitespace_.flexible || whitespace_.max_run == 0) return {};
  if (!ws_) {
    const RuleId rule = lazy(ws_, "ws");
    // max_run is bounded above, so the repetition's copies always fit.
    Result<Sequence> run =
        b_.repeat("ws-run", b_.bytes(ByteSet::of_bytes(" \t\n")), 0, whitespace_.max_run);
    b_.grammar().define(rule, {run.ok() ? *run : Sequence{}});
  }
  return b_.ref(*ws_);
}

Sequence JsonValues::comma() { return Builder::cat({b_.literal(","), ws()}); }

Sequence JsonValues::list(std::string_view name, const Sequence& item) {
  Sequence more = comma();
  Builder::append(more, item);
  return b_.optional(name, Builder::cat({item, b_.star(name, more)}));
}

Sequence JsonValues::value() {
  if (!value_) {
    const RuleId rule = lazy(value_, "value");
    // Objects and arrays refer back to value: the rule is declared before they are built.
    const Sequence array_items = list("array-items", Builder::cat({b_.ref(rule), ws()}));
    array_ = b_.grammar().add(
        "array", {Builder::cat({b_.literal("["), ws(), array_items, b_.literal("]")})});
    b_.grammar().define(rule, {object(), b_.ref(*array_), string(), number(), b_.literal("true"),
                               b_.literal("false"), b_.literal("null")});
  }
  return b_.ref(*value_);
}

Sequence JsonValues::object() {
  if (!object_) {
    const RuleId rule = lazy(object_, "object");
    const Sequence member = Builder::cat({string(), ws(), b_.literal(":"), ws(), value(), ws()});
    const Sequence members = list("object-members", member);
    b_.grammar().define(rule, {Builder::cat({b_.literal("{"), ws(), members, b_.literal("}")})});
  }
  return b_.ref(*object_);
}

Sequence JsonValues::plain_char() {
  if (!plain_) {
    const Sequence set =
        b_.codepoints("plain-char", {{0x20, 0x21}, {0x23, 0x5B}, {0x5D, 0x10FFFF}});
    plain_ = b_.grammar().add("plain-char-ref", {set});
  }
  return b_.ref(*plain_);
}

Sequence JsonValues::string_char() {
  if (!char_) {
    const Sequence h = b_.bytes(hex());
    const Sequence u = b_.literal("\\u");
    const Sequence d = b_.bytes(ByteSet::of_bytes("dD"));
    // \uXXXX outside D800..DFFF, and a high surrogate then a low one.
    const Sequence single = b_.any_of(
        "u-escape", {Builder::cat({b_.bytes(ByteSet::of_bytes("0123456789abcABC")), h, h, h}),
                     Builder::cat({b_.bytes(ByteSet::of_bytes("eEfF")), h, h, h}),
                     Builder::cat({d, b_.bytes(ByteSet::range('0', '7')), h, h})});
    const Sequence pair = Builder::cat({d, b_.bytes(ByteSet::of_bytes("89abAB")), h, h, u, d,
                                        b_.bytes(ByteSet::of_bytes("cdefCDEF")), h, h});
    char_ = b_.grammar().add(
        "string-char",
        {plain_char(), Builder::cat({b_.literal("\\"), b_.bytes(ByteSet::of_bytes("\"\\/bfnrt"))}),
         Builder::cat({u, single}), Builder::cat({u, pair})});
  }
  return b_.ref(*char_);
}

Sequence JsonValues::string() {
  if (!string_) {
    string_ = b_.grammar().add(
        "string", {Builder::cat({b_.literal("\""), b_.star("string-chars", string_char()),
                                 b_.literal("\"")})});
  }
  return b_.ref(*string_);
}

Sequence JsonValues::digit() { return b_.bytes(ByteSet::range('0', '9')); }

Sequence JsonValues::digits() {
  if (!digits_) digits_ = b_.grammar().add("digits", {b_.plus("digits-more", digit())});
  return b_.ref(*digits_);
}

Sequence JsonValues::integer() {
  if (!integer_) {
    const Sequence magnitude = b_.any_of(
        "integer-digits", {b_.literal("0"), Builder::cat({b_.bytes(ByteSet::range('1', '9')),
                                                          b_.star("integer-rest", digit())})});
    integer_ = b_.grammar().add("integer",
                                {Builder::cat({b_.optional("minus", b_.literal("-")), magnitude})});
  }
  return b_.ref(*integer_);
}

Sequence JsonValues::number() {
  if (!number_) {
    const Sequence fraction = b_.optional("fraction", Builder::cat({b_.literal("."), digits()}));
    const Sequence exponent = b_.optional(
        "exponent",
        Builder::cat({b_.bytes(ByteSet::of_bytes("eE")),
                      b_.optional("exponent-sign", b_.bytes(ByteSet::of_bytes("+-"))), digits()}));
    number_ = b_.grammar().add("number", {Builder::cat({integer(), fraction, exponent})});
  }
  return b_.ref(*number_);
}

Grammar json_object_grammar(const JsonWhitespace& whitespace) {
  Grammar grammar;
  Builder builder(grammar);
  JsonValues json(builder, whitespace);
  grammar.set_root(grammar.add("root", {json.object()}));
  return grammar;
}

}  // namespace kvvm::grammar
