#include "tokenizer/decoder.h"

#include "tokenizer/byte_level.h"
#include "tokenizer/normalizer.h"
#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/regex.h"
#include "tokenizer/utf8.h"

namespace kvvm::tokenizer::detail {
namespace {

// The characters of `text` (a stray byte is one), as [begin, end) offsets.
std::vector<std::pair<std::size_t, std::size_t>> characters(std::string_view text) {
  std::vector<std::pair<std::size_t, std::size_t>> out;
  for (std::size_t i = 0; i < text.size();) {
    const std::size_t length = utf8_length(text, i);
    const std::size_t next = i + (length == 0 ? 1 : length);
    out.emplace_back(i, next);
    i = next;
  }
  return out;
}

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// The byte of a "<0xNN>" token, or -1. Rust's u8::from_str_radix, which Hugging Face calls on
// the two characters, also takes a '+' before a single digit.
int fallback_byte(std::string_view text) {
  if (text.size() != 6 || !text.starts_with("<0x") || text.back() != '>') return -1;
  if (text[3] == '+') return hex_digit(text[4]);
  const int high = hex_digit(text[3]);
  const int low = hex_digit(text[4]);
  return high < 0 || low < 0 ? -1 : high * 16 + low;
}

Result<std::string> one_character(const Json& json, std::string_view key, std::string_view where) {
  KVVM_ASSIGN_OR_RETURN(std::string text, string_member(json, key, where));
  if (text.empty() || utf8_length(text, 0) != text.size()) {
    return field_error(member_path(where, key), "'" + text + "' is not one character");
  }
  return text;
}

Result<std::size_t> count_member(const Json& json, std::string_view key, std::string_view where) {
  const Json* value = find_member(json, key);
  if (value == nullptr) return std::size_t{0};
  if (!value->is_number_integer() || value->get<std::int64_t>() < 0 ||
      value->get<std::int64_t>() > 1'000'000) {
    return field_error(member_path(where, key), "expected a count, found " + json_kind(*value));
  }
  return static_cast<std::size_t>(value->get<std::int64_t>());
}

}  // namespace

struct Decoder::Step {
  enum class Kind { kByteLevel, kMetaspace, kReplace, kByteFallback, kStrip, kJoinSpace };
  Kind kind = Kind::kByteLevel;
  std::string text;                    // Metaspace's replacement, Strip's content, Replace's
  std::string content;                 // Replace's content
  std::shared_ptr<const Regex> regex;  // Replace's pattern
  bool drop_first = false;             // Metaspace: the first token loses its replacements
  std::size_t start = 0;               // Strip
  std::size_t stop = 0;

  static Step of(Kind kind) {
    Step step;
    step.kind = kind;
    return step;
  }

  std::string apply(std::string_view token, bool first) const {
    switch (kind) {
      case Kind::kByteLevel:
        return byte_level_to_bytes(token);
      case Kind::kByteFallback: {
        const int byte = fallback_byte(token);
        return byte < 0 ? std::string(token) : std::string(1, static_cast<char>(byte));
      }
      case Kind::kJoinSpace:
        return first ? std::string(token) : " " + std::string(token);
      case Kind::kMetaspace: {
        std::string out;
        for (std::size_t at = 0;;) {
          const std::size_t found = token.find(text, at);
          out.append(token.substr(at, found == token.npos ? token.npos : found - at));
          if (found == token.npos) break;
          if (!(first && drop_first)) out += ' ';
          at = found + text.size();
        }
        return out;
      }
      case Kind::kReplace: {
        std::string out;
        std::size_t previous = 0;
        for (const Match& match : regex->find_all(token)) {
          out.append(token.substr(previous, match.begin - previous));
          out += content;
          previous = match.end;
        }
        out.append(token.substr(previous));
        return out;
      }
      case Kind::kStrip: {
        const auto chars = characters(token);
        const auto is_content = [&](std::size_t k) {
          return token.substr(chars[k].first, chars[k].second - chars[k].first) == text;
        };
        std::size_t begin = 0;
        while (begin < start && begin < chars.size() && is_content(begin)) ++begin;
        std::size_t end = chars.size();
        for (std::size_t k = 0; k < stop && end > begin && is_content(end - 1); ++k) --end;
        if (begin >= end) return {};
        return std::string(
            token.substr(chars[begin].first, chars[end - 1].second - chars[begin].first));
      }
    }
    return std::string(token);
  }
};

Decoder::Decoder() = default;
Decoder::~Decoder() = default;
Decoder::Decoder(Decoder&&) noexcept = default;
Decoder& Decoder::operator=(Decoder&&) noexcept = default;

Result<Decoder> Decoder::parse(const Json& json, std::string_view where) {
  Decoder decoder;
  if (json.is_null()) {
    // Hugging Face joins the tokens with a space when a tokenizer has no decoder.
    decoder.steps_.push_back(Step::of(Step::Kind::kJoinSpace));
    decoder.first_differs_ = true;
    return decoder;
  }
  KVVM_RETURN_IF_ERROR(decoder.add(json, where));
  return decoder;
}

Status Decoder::add(const Json& json, std::string_view where) {
  KVVM_RETURN_IF_ERROR(expect_object(json, where));
  KVVM_ASSIGN_OR_RETURN(std::string type, type_member(json, where));
  const auto after_fusion = [&](std::string_view why) {
    return field_error(where, "decoder '" + type + "' after the tokens are fused (" +
                                  std::string(why) + ") is not implemented");
  };
  if (type == "Sequence") {
    const std::string list_where = member_path(where, "decoders");
    const Json* list = find_member(json, "decoders");
    if (list == nullptr) return field_error(list_where, "missing");
    KVVM_RETURN_IF_ERROR(expect_array(*list, list_where));
    for (std::size_t i = 0; i < list->size(); ++i) {
      KVVM_RETURN_IF_ERROR(add((*list)[i], element_path(list_where, i)));
    }
    return Status::Ok();
  }
  if (type == "Fuse") {
    fused_ = true;
    return Status::Ok();
  }
  if (type == "ByteLevel") {
    if (fused_) return after_fusion("by Fuse or ByteLevel");
    steps_.push_back(Step::of(Step::Kind::kByteLevel));
    fused_ = true;  // Hugging Face's ByteLevel decoder returns the tokens as one text
    return Status::Ok();
  }
  if (type == "ByteFallback") {
    if (fused_) return after_fusion("by Fuse or ByteLevel");
    steps_.push_back(Step::of(Step::Kind::kByteFallback));
    return Status::Ok();
  }
  if (type == "Metaspace") {
    if (fused_) return after_fusion("by Fuse or ByteLevel");
    KVVM_ASSIGN_OR_RETURN(MetaspaceOptions options, parse_metaspace_options(json, where));
    Step step = Step::of(Step::Kind::kMetaspace);
    step.text = options.replacement;
    step.drop_first = options.prepend_scheme != PrependScheme::kNever;
    first_differs_ = first_differs_ || step.drop_first;
    steps_.push_back(std::move(step));
    return Status::Ok();
  }
  if (type == "Replace") {
    KVVM_ASSIGN_OR_RETURN(std::unique_ptr<Regex> pattern, parse_replace_pattern(json, where));
    KVVM_ASSIGN_OR_RETURN(std::string content, string_member(json, "content", where));
    if (fused_) {
      // One character replaced in the fused text is the same as in each token; a longer
      // pattern could match across two.
      const Json* literal = find_member(json["pattern"], "String");
      const bool one_char = literal != nullptr && literal->is_string() &&
                            utf8_length(literal->get_ref<const std::string&>(), 0) ==
                                literal->get_ref<const std::string&>().size();
      if (!one_char || strip_count_ > 0) {
        return after_fusion("only a one-character String pattern before any Strip is");
      }
    }
    Step step = Step::of(Step::Kind::kReplace);
    step.content = std::move(content);
    step.regex = std::shared_ptr<const Regex>(std::move(pattern));
    steps_.push_back(std::move(step));
    return Status::Ok();
  }
  if (type == "Strip") {
    KVVM_ASSIGN_OR_RETURN(std::string content, one_character(json, "content", where));
    KVVM_ASSIGN_OR_RETURN(std::size_t start, count_member(json, "start", where));
    KVVM_ASSIGN_OR_RETURN(std::size_t stop, count_member(json, "stop", where));
    if (!fused_) {
      Step step = Step::of(Step::Kind::kStrip);
      step.text = std::move(content);
      step.start = start;
      step.stop = stop;
      steps_.push_back(std::move(step));
      return Status::Ok();
    }
    if (stop != 0 || (strip_count_ > 0 && start > 0)) {
      return after_fusion("only one Strip of leading characters is");
    }
    if (start > 0) {
      strip_content_ = std::move(content);
      strip_count_ = start;
    }
    return Status::Ok();
  }
  return field_error(member_path(where, "type"),
                     "decoder '" + type +
                         "' is not implemented (ByteLevel, Metaspace, Replace, ByteFallback, "
                         "Fuse, Strip, Sequence or null are)");
}

std::string Decoder::token_bytes(std::string_view text, bool first) const {
  std::string out;
  append_token_bytes(text, first, out);
  return out;
}

void Decoder::append_token_bytes(std::string_view text, bool first, std::string& out) const {
  // The byte-level families' one step, without a copy per step: every token of a 150,000-token
  // vocabulary is decoded at load.
  if (steps_.size() == 1 && steps_[0].kind == Step::Kind::kByteLevel) {
    append_byte_level_to_bytes(text, out);
    return;
  }
  std::string token(text);
  for (const Step& step : steps_) token = step.apply(token, first);
  out += token;
}

}  // namespace kvvm::tokenizer::detail
