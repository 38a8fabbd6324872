// The pre-tokenizers that split on character classes rather than a regex: Digits, Punctuation,
// Whitespace, WhitespaceSplit and Metaspace, with Hugging Face's semantics (a predicate
// matches one character at a time; the behaviour folds the matches; Rust's definitions of
// numeric, punctuation, word and white-space characters, see utf8.h).
#include <algorithm>

#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/split_behavior.h"
#include "tokenizer/utf8.h"

namespace kvvm::tokenizer::detail {
namespace {

// Splits on every character `Predicate` accepts, as `behavior` says.
template <bool (*Predicate)(char32_t)>
class ClassSplit final : public PreTokenizer {
 public:
  explicit ClassSplit(Behavior behavior) : behavior_(behavior) {}

  void apply(std::vector<PreToken>& pieces) const override {
    split_pieces(pieces, behavior_,
                 [](std::string_view text) { return char_segments(text, Predicate); });
  }
  bool byte_level() const override { return false; }

 private:
  Behavior behavior_;
};

// \w+|[^\w\s]+ with Unicode classes, white space dropped: each piece is a run of word
// characters or a run of other non-space characters. A byte that is not UTF-8 counts as other.
class Whitespace final : public PreTokenizer {
 public:
  void apply(std::vector<PreToken>& pieces) const override {
    split_pieces(pieces, Behavior::kRemoved, [](std::string_view text) {
      enum Kind { kSpace, kWord, kOther };
      std::vector<Segment> out;
      int previous = -1;
      for (std::size_t i = 0; i < text.size();) {
        const std::size_t length = utf8_length(text, i);
        Kind kind = kOther;
        if (length != 0) {
          const char32_t c = utf8_decode(text, i, length);
          kind = is_white_space(c) ? kSpace : is_regex_word_char(c) ? kWord : kOther;
        }
        const std::size_t next = i + (length == 0 ? 1 : length);
        if (kind == previous) {
          out.back().end = next;
        } else {
          out.push_back({i, next, kind == kSpace});
        }
        previous = kind;
        i = next;
      }
      return out;
    });
  }
  bool byte_level() const override { return false; }
};

// Spaces become the replacement character, which is prepended as the scheme says and split
// on (each piece begins with it) when `split`.
class Metaspace final : public PreTokenizer {
 public:
  explicit Metaspace(MetaspaceOptions options) : options_(std::move(options)) {}

  void apply(std::vector<PreToken>& pieces) const override {
    const std::string& mark = options_.replacement;
    for (PreToken& piece : pieces) {
      std::string replaced;
      replaced.reserve(piece.text.size() + mark.size());
      for (const char c : piece.text) {
        if (c == ' ') {
          replaced += mark;
        } else {
          replaced += c;
        }
      }
      const bool prepend = !replaced.empty() && !replaced.starts_with(mark) &&
                           (options_.prepend_scheme == PrependScheme::kAlways ||
                            (options_.prepend_scheme == PrependScheme::kFirst && piece.at_start));
      if (prepend) replaced.insert(0, mark);
      piece.text = std::move(replaced);
    }
    if (!options_.split) return;
    const char32_t mark_code_point = utf8_decode(mark, 0, mark.size());
    split_pieces(pieces, Behavior::kMergedWithNext, [&](std::string_view text) {
      return char_segments(text, [&](char32_t c) { return c == mark_code_point; });
    });
  }
  bool byte_level() const override { return false; }

 private:
  MetaspaceOptions options_;
};

bool is_digit_class(char32_t c) { return is_numeric(c); }
bool is_punctuation_class(char32_t c) { return is_punctuation(c); }
bool is_white_space_class(char32_t c) { return is_white_space(c); }

}  // namespace

Result<MetaspaceOptions> parse_metaspace_options(const Json& json, std::string_view where) {
  MetaspaceOptions options;
  KVVM_ASSIGN_OR_RETURN(std::string replacement, string_member(json, "replacement", where));
  if (replacement.empty() || utf8_length(replacement, 0) != replacement.size()) {
    return field_error(member_path(where, "replacement"),
                       "'" + replacement + "' is not one character");
  }
  options.replacement = std::move(replacement);
  bool scheme_given = false;
  if (const Json* scheme = find_member(json, "prepend_scheme")) {
    scheme_given = true;
    const std::string scheme_where = member_path(where, "prepend_scheme");
    if (!scheme->is_string()) {
      return field_error(scheme_where, "expected a string, found " + json_kind(*scheme));
    }
    const auto& name = scheme->get_ref<const std::string&>();
    if (name == "always") {
      options.prepend_scheme = PrependScheme::kAlways;
    } else if (name == "first") {
      options.prepend_scheme = PrependScheme::kFirst;
    } else if (name == "never") {
      options.prepend_scheme = PrependScheme::kNever;
    } else {
      return field_error(scheme_where,
                         "unknown prepend_scheme '" + name + "' (always, first, never)");
    }
  }
  KVVM_ASSIGN_OR_RETURN(bool add_prefix_space, bool_member(json, "add_prefix_space", true, where));
  if (!add_prefix_space && options.prepend_scheme != PrependScheme::kNever) {
    return field_error(
        member_path(where, "add_prefix_space"),
        std::string("false does not match prepend_scheme ") + (scheme_given ? "" : "(absent: ") +
            (options.prepend_scheme == PrependScheme::kFirst ? "'first'" : "'always'") +
            (scheme_given ? "" : ")"));
  }
  KVVM_ASSIGN_OR_RETURN(bool split, bool_member(json, "split", true, where));
  options.split = split;
  return options;
}

Result<std::unique_ptr<PreTokenizer>> parse_class_pre_tokenizer(const Json& json,
                                                                std::string_view type,
                                                                std::string_view where) {
  if (type == "Digits") {
    KVVM_ASSIGN_OR_RETURN(bool individual, bool_member(json, "individual_digits", false, where));
    return std::unique_ptr<PreTokenizer>(std::make_unique<ClassSplit<is_digit_class>>(
        individual ? Behavior::kIsolated : Behavior::kContiguous));
  }
  if (type == "Punctuation") {
    KVVM_ASSIGN_OR_RETURN(Behavior behavior, parse_behavior(json, where, Behavior::kIsolated));
    return std::unique_ptr<PreTokenizer>(
        std::make_unique<ClassSplit<is_punctuation_class>>(behavior));
  }
  if (type == "WhitespaceSplit") {
    return std::unique_ptr<PreTokenizer>(
        std::make_unique<ClassSplit<is_white_space_class>>(Behavior::kRemoved));
  }
  if (type == "Whitespace") return std::unique_ptr<PreTokenizer>(std::make_unique<Whitespace>());
  if (type == "Metaspace") {
    KVVM_ASSIGN_OR_RETURN(MetaspaceOptions options, parse_metaspace_options(json, where));
    return std::unique_ptr<PreTokenizer>(std::make_unique<Metaspace>(std::move(options)));
  }
  return std::unique_ptr<PreTokenizer>();
}

}  // namespace kvvm::tokenizer::detail
