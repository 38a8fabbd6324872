#include "tokenizer/pre_tokenizer.h"

#include "tokenizer/byte_level.h"
#include "tokenizer/regex.h"

namespace kvvm::tokenizer::detail {
namespace {

// What becomes of the pattern's matches (Hugging Face's SplitDelimiterBehavior).
enum class Behavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

struct Segment {
  std::size_t begin;
  std::size_t end;
  bool is_match;
};

// The whole of `text` as alternating unmatched and matched segments.
std::vector<Segment> segments(const Regex& regex, std::string_view text, bool invert) {
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

// Folds the segments into pieces as `behavior` says, the way Hugging Face's split does.
std::vector<Segment> apply_behavior(std::vector<Segment> in, Behavior behavior) {
  std::vector<Segment> out;
  bool previous_match = false;
  switch (behavior) {
    case Behavior::kIsolated:
      return in;
    case Behavior::kRemoved:
      for (const Segment& s : in) {
        if (!s.is_match) out.push_back(s);
      }
      return out;
    case Behavior::kMergedWithPrevious:
      for (const Segment& s : in) {
        if (s.is_match && !previous_match && !out.empty()) {
          out.back().end = s.end;
        } else {
          out.push_back(s);
        }
        previous_match = s.is_match;
      }
      return out;
    case Behavior::kMergedWithNext:
      for (auto it = in.rbegin(); it != in.rend(); ++it) {
        if (it->is_match && !previous_match && !out.empty()) {
          out.back().begin = it->begin;
        } else {
          out.push_back(*it);
        }
        previous_match = it->is_match;
      }
      return {out.rbegin(), out.rend()};
    case Behavior::kContiguous:
      for (const Segment& s : in) {
        if (s.is_match == previous_match && !out.empty()) {
          out.back().end = s.end;
        } else {
          out.push_back(s);
        }
        previous_match = s.is_match;
      }
      return out;
  }
  return in;
}

void split_pieces(const Regex& regex, bool invert, Behavior behavior,
                  std::vector<std::string>& pieces) {
  std::vector<std::string> out;
  out.reserve(pieces.size());
  for (const std::string& piece : pieces) {
    for (const Segment& s : apply_behavior(segments(regex, piece, invert), behavior)) {
      if (s.end > s.begin) out.emplace_back(piece, s.begin, s.end - s.begin);
    }
  }
  pieces = std::move(out);
}

class Split final : public PreTokenizer {
 public:
  Split(std::unique_ptr<Regex> regex, Behavior behavior, bool invert)
      : regex_(std::move(regex)), behavior_(behavior), invert_(invert) {}

  void apply(std::vector<std::string>& pieces) const override {
    split_pieces(*regex_, invert_, behavior_, pieces);
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

  void apply(std::vector<std::string>& pieces) const override {
    if (add_prefix_space_) {
      for (std::string& piece : pieces) {
        if (!piece.empty() && piece.front() != ' ') piece.insert(piece.begin(), ' ');
      }
    }
    if (regex_) split_pieces(*regex_, false, Behavior::kIsolated, pieces);
    std::erase_if(pieces, [](const std::string& piece) { return piece.empty(); });
    for (std::string& piece : pieces) piece = bytes_to_byte_level(piece);
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

  void apply(std::vector<std::string>& pieces) const override {
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

Result<Behavior> parse_behavior(const Json& json, std::string_view where) {
  Result<std::string> name = string_member(json, "behavior", where);
  if (!name.ok()) return name.status();
  if (*name == "Removed") return Behavior::kRemoved;
  if (*name == "Isolated") return Behavior::kIsolated;
  if (*name == "MergedWithPrevious") return Behavior::kMergedWithPrevious;
  if (*name == "MergedWithNext") return Behavior::kMergedWithNext;
  if (*name == "Contiguous") return Behavior::kContiguous;
  return field_error(member_path(where, "behavior"),
                     "unknown behavior '" + *name +
                         "' (Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous)");
}

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
  Result<std::unique_ptr<Regex>> regex =
      Regex::compile(text->get_ref<const std::string&>(), regex_text == nullptr, pattern_where);
  if (!regex.ok()) return regex.status();
  Result<Behavior> behavior = parse_behavior(json, where);
  if (!behavior.ok()) return behavior.status();
  Result<bool> invert = bool_member(json, "invert", false, where);
  if (!invert.ok()) return invert.status();
  return std::unique_ptr<PreTokenizer>(
      std::make_unique<Split>(std::move(*regex), *behavior, *invert));
}

Result<std::unique_ptr<PreTokenizer>> parse_byte_level(const Json& json, std::string_view where) {
  Result<bool> add_prefix_space = bool_member(json, "add_prefix_space", true, where);
  if (!add_prefix_space.ok()) return add_prefix_space.status();
  Result<bool> use_regex = bool_member(json, "use_regex", true, where);
  if (!use_regex.ok()) return use_regex.status();
  std::unique_ptr<Regex> regex;
  if (*use_regex) {
    Result<std::unique_ptr<Regex>> compiled = Regex::compile(kGpt2Pattern, false, where);
    if (!compiled.ok()) return compiled.status();
    regex = std::move(*compiled);
  }
  return std::unique_ptr<PreTokenizer>(
      std::make_unique<ByteLevel>(*add_prefix_space, std::move(regex)));
}

}  // namespace

Result<std::unique_ptr<PreTokenizer>> parse_pre_tokenizer(const Json& json,
                                                          std::string_view where) {
  if (json.is_null()) return std::unique_ptr<PreTokenizer>();
  KVVM_RETURN_IF_ERROR(expect_object(json, where));
  Result<std::string> type = type_member(json, where);
  if (!type.ok()) return type.status();
  if (*type == "Split") return parse_split(json, where);
  if (*type == "ByteLevel") return parse_byte_level(json, where);
  if (*type == "Sequence") {
    const std::string list_where = member_path(where, "pretokenizers");
    const Json* list = find_member(json, "pretokenizers");
    if (list == nullptr) return field_error(list_where, "missing");
    KVVM_RETURN_IF_ERROR(expect_array(*list, list_where));
    std::vector<std::unique_ptr<PreTokenizer>> steps;
    for (std::size_t i = 0; i < list->size(); ++i) {
      Result<std::unique_ptr<PreTokenizer>> step =
          parse_pre_tokenizer((*list)[i], element_path(list_where, i));
      if (!step.ok()) return step.status();
      if (*step) steps.push_back(std::move(*step));
    }
    if (steps.empty()) return std::unique_ptr<PreTokenizer>();
    return std::unique_ptr<PreTokenizer>(std::make_unique<SequencePreTokenizer>(std::move(steps)));
  }
  return field_error(member_path(where, "type"), "pre-tokenizer '" + *type +
                                                     "' is not implemented (Split, ByteLevel, "
                                                     "Sequence or null are)");
}

}  // namespace kvvm::tokenizer::detail
