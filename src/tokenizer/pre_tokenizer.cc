#include "tokenizer/pre_tokenizer.h"

#include "tokenizer/byte_level.h"
#include "tokenizer/regex.h"
#include "tokenizer/split_behavior.h"

namespace kvvm::tokenizer::detail {
namespace {

// The whole of `text` as alternating unmatched and matched segments.
std::vector<Segment> regex_segments(const Regex& regex, std::string_view text, bool invert) {
  std::vector<Segment> out;
  std::size_t previous = 0;
  for (const Match& match : regex.find_all(text)) {
    if (match.begin > previous) out.push_back({previous, match.begin, invert});
    out.push_back({match.begin, match.end, !invert});
    previous = match.end;
  }
  if (previous < text.size()) out.push_back({previous, text.size(), invert});
  return out;
}

class Split final : public PreTokenizer {
 public:
  Split(std::unique_ptr<Regex> regex, Behavior behavior, bool invert)
      : regex_(std::move(regex)), behavior_(behavior), invert_(invert) {}

  void apply(std::vector<PreToken>& pieces) const override {
    split_pieces(pieces, behavior_,
                 [&](std::string_view text) { return regex_segments(*regex_, text, invert_); });
  }
  bool byte_level() const override { return false; }

 private:
  std::unique_ptr<Regex> regex_;
  Behavior behavior_;
  bool invert_;
};

class ByteLevel final : public PreTokenizer {
 public:
  ByteLevel(bool add_prefix_space, std::unique_ptr<Regex> regex)
      : add_prefix_space_(add_prefix_space), regex_(std::move(regex)) {}

  void apply(std::vector<PreToken>& pieces) const override {
    if (add_prefix_space_) {
      for (PreToken& piece : pieces) {
        if (!piece.text.empty() && piece.text.front() != ' ') piece.text.insert(0, 1, ' ');
      }
    }
    if (regex_) {
      split_pieces(pieces, Behavior::kIsolated,
                   [&](std::string_view text) { return regex_segments(*regex_, text, false); });
    }
    std::erase_if(pieces, [](const PreToken& piece) { return piece.text.empty(); });
    for (PreToken& piece : pieces) piece.text = bytes_to_byte_level(piece.text);
  }
  bool byte_level() const override { return true; }

 private:
  bool add_prefix_space_;
  std::unique_ptr<Regex> regex_;  // null when use_regex is false
};

class SequencePreTokenizer final : public PreTokenizer {
 public:
  explicit SequencePreTokenizer(std::vector<std::unique_ptr<PreTokenizer>> steps)
      : steps_(std::move(steps)) {}

  void apply(std::vector<PreToken>& pieces) const override {
    for (const auto& step : steps_) step->apply(pieces);
  }
  bool byte_level() const override {
    for (const auto& step : steps_) {
      if (step->byte_level()) return true;
    }
    return false;
  }

 private:
  std::vector<std::unique_ptr<PreTokenizer>> steps_;
};

Result<std::unique_ptr<PreTokenizer>> parse_split(const Json& json, std::string_view where) {
  const std::string pattern_where = member_path(where, "pattern");
  const Json* pattern = find_member(json, "pattern");
  if (pattern == nullptr) return field_error(pattern_where, "missing");
  KVVM_RETURN_IF_ERROR(expect_object(*pattern, pattern_where));
  const Json* regex_text = find_member(*pattern, "Regex");
  const Json* literal_text = find_member(*pattern, "String");
  const Json* text = regex_text != nullptr ? regex_text : literal_text;
  if (text == nullptr || !text->is_string()) {
    return field_error(pattern_where, "expected {\"Regex\": string} or {\"String\": string}");
  }
  KVVM_ASSIGN_OR_RETURN(
      std::unique_ptr<Regex> regex,
      Regex::compile(text->get_ref<const std::string&>(), regex_text == nullptr, pattern_where));
  KVVM_ASSIGN_OR_RETURN(Behavior behavior, parse_behavior(json, where));
  KVVM_ASSIGN_OR_RETURN(bool invert, bool_member(json, "invert", false, where));
  return std::unique_ptr<PreTokenizer>(std::make_unique<Split>(std::move(regex), behavior, invert));
}

Result<std::unique_ptr<PreTokenizer>> parse_byte_level(const Json& json, std::string_view where) {
  KVVM_ASSIGN_OR_RETURN(bool add_prefix_space, bool_member(json, "add_prefix_space", true, where));
  KVVM_ASSIGN_OR_RETURN(bool use_regex, bool_member(json, "use_regex", true, where));
  std::unique_ptr<Regex> regex;
  if (use_regex) {
    KVVM_ASSIGN_OR_RETURN(std::unique_ptr<Regex> compiled,
                          Regex::compile(kGpt2Pattern, false, where));
    regex = std::move(compiled);
  }
  return std::unique_ptr<PreTokenizer>(
      std::make_unique<ByteLevel>(add_prefix_space, std::move(regex)));
}

}  // namespace

Result<std::unique_ptr<PreTokenizer>> parse_pre_tokenizer(const Json& json,
                                                          std::string_view where) {
  if (json.is_null()) return std::unique_ptr<PreTokenizer>();
  KVVM_RETURN_IF_ERROR(expect_object(json, where));
  KVVM_ASSIGN_OR_RETURN(std::string type, type_member(json, where));
  if (type == "Split") return parse_split(json, where);
  if (type == "ByteLevel") return parse_byte_level(json, where);
  if (type == "Sequence") {
    const std::string list_where = member_path(where, "pretokenizers");
    const Json* list = find_member(json, "pretokenizers");
    if (list == nullptr) return field_error(list_where, "missing");
    KVVM_RETURN_IF_ERROR(expect_array(*list, list_where));
    std::vector<std::unique_ptr<PreTokenizer>> steps;
    for (std::size_t i = 0; i < list->size(); ++i) {
      KVVM_ASSIGN_OR_RETURN(std::unique_ptr<PreTokenizer> step,
                            parse_pre_tokenizer((*list)[i], element_path(list_where, i)));
      if (step) steps.push_back(std::move(step));
    }
    if (steps.empty()) return std::unique_ptr<PreTokenizer>();
    return std::unique_ptr<PreTokenizer>(std::make_unique<SequencePreTokenizer>(std::move(steps)));
  }
  Result<std::unique_ptr<PreTokenizer>> by_class = parse_class_pre_tokenizer(json, type, where);
  if (!by_class.ok() || *by_class) return by_class;
  return field_error(member_path(where, "type"),
                     "pre-tokenizer '" + type +
                         "' is not implemented (Split, ByteLevel, Digits, Punctuation, "
                         "Whitespace, WhitespaceSplit, Metaspace, Sequence or null are)");
}

}  // namespace kvvm::tokenizer::detail
