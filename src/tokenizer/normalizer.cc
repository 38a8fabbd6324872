#include "tokenizer/normalizer.h"

#include <utf8proc.h>

#include <cstdlib>
#include <vector>

#include "tokenizer/regex.h"
#include "tokenizer/utf8.h"

namespace kvvm::tokenizer::detail {
namespace {

// One of NFC, NFD, NFKC, NFKD: utf8proc_map with the matching options.
class UnicodeForm final : public Normalizer {
 public:
  explicit UnicodeForm(utf8proc_option_t options) : options_(options) {}

  std::string normalize(std::string_view text) const override {
    std::string out;
    out.reserve(text.size());
    // utf8proc refuses ill-formed input as a whole, so it sees the well-formed runs only.
    std::size_t run = 0;
    for (std::size_t i = 0; i < text.size();) {
      const std::size_t length = utf8_length(text, i);
      if (length != 0) {
        i += length;
        continue;
      }
      map_run(text.substr(run, i - run), out);
      out += text[i];
      run = ++i;
    }
    map_run(text.substr(run), out);
    return out;
  }

 private:
  void map_run(std::string_view run, std::string& out) const {
    if (run.empty()) return;
    // ASCII is in every normal form already.
    bool ascii = true;
    for (const char c : run) ascii = ascii && static_cast<unsigned char>(c) < 0x80;
    if (ascii) {
      out += run;
      return;
    }
    utf8proc_uint8_t* mapped = nullptr;
    const utf8proc_ssize_t length =
        utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(run.data()),
                     static_cast<utf8proc_ssize_t>(run.size()), &mapped, options_);
    if (length < 0) {
      out += run;  // out of memory in utf8proc: the text as it came is still a valid input
    } else {
      out.append(reinterpret_cast<const char*>(mapped), static_cast<std::size_t>(length));
    }
    std::free(mapped);
  }

  utf8proc_option_t options_;
};

// Prepends its text to a non-empty input (each stretch between added tokens is one input).
class Prepend final : public Normalizer {
 public:
  explicit Prepend(std::string prefix) : prefix_(std::move(prefix)) {}
  std::string normalize(std::string_view text) const override {
    if (text.empty()) return {};
    return prefix_ + std::string(text);
  }

 private:
  std::string prefix_;
};

// Replaces every match of a string or a regex (leftmost, non-overlapping) by `content`.
class Replace final : public Normalizer {
 public:
  Replace(std::unique_ptr<Regex> pattern, std::string content)
      : pattern_(std::move(pattern)), content_(std::move(content)) {}
  std::string normalize(std::string_view text) const override {
    std::string out;
    out.reserve(text.size());
    std::size_t previous = 0;
    for (const Match& match : pattern_->find_all(text)) {
      out.append(text.substr(previous, match.begin - previous));
      out += content_;
      previous = match.end;
    }
    out.append(text.substr(previous));
    return out;
  }

 private:
  std::unique_ptr<Regex> pattern_;
  std::string content_;
};

class SequenceNormalizer final : public Normalizer {
 public:
  explicit SequenceNormalizer(std::vector<std::unique_ptr<Normalizer>> steps)
      : steps_(std::move(steps)) {}

  std::string normalize(std::string_view text) const override {
    std::string out(text);
    for (const auto& step : steps_) out = step->normalize(out);
    return out;
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> steps_;
};

}  // namespace

Result<std::unique_ptr<Regex>> parse_replace_pattern(const Json& json, std::string_view where) {
  const std::string pattern_where = member_path(where, "pattern");
  const Json* pattern = find_member(json, "pattern");
  if (pattern == nullptr) return field_error(pattern_where, "missing");
  KVVM_RETURN_IF_ERROR(expect_object(*pattern, pattern_where));
  const Json* regex_text = find_member(*pattern, "Regex");
  const Json* literal_text = find_member(*pattern, "String");
  const Json* text = regex_text != nullptr ? regex_text : literal_text;
  if (text == nullptr || !text->is_string() || text->get_ref<const std::string&>().empty()) {
    return field_error(pattern_where,
                       "expected {\"Regex\": string} or {\"String\": string}, not empty");
  }
  return Regex::compile(text->get_ref<const std::string&>(), regex_text == nullptr, pattern_where);
}

Result<std::unique_ptr<Normalizer>> parse_normalizer(const Json& json, std::string_view where) {
  if (json.is_null()) return std::unique_ptr<Normalizer>();
  KVVM_RETURN_IF_ERROR(expect_object(json, where));
  KVVM_ASSIGN_OR_RETURN(std::string type, type_member(json, where));
  const auto form = [](int options) -> std::unique_ptr<Normalizer> {
    return std::make_unique<UnicodeForm>(static_cast<utf8proc_option_t>(UTF8PROC_STABLE | options));
  };
  if (type == "NFC") return form(UTF8PROC_COMPOSE);
  if (type == "NFD") return form(UTF8PROC_DECOMPOSE);
  if (type == "NFKC") return form(UTF8PROC_COMPOSE | UTF8PROC_COMPAT);
  if (type == "NFKD") return form(UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT);
  if (type == "Prepend") {
    KVVM_ASSIGN_OR_RETURN(std::string prefix, string_member(json, "prepend", where));
    return std::unique_ptr<Normalizer>(std::make_unique<Prepend>(std::move(prefix)));
  }
  if (type == "Replace") {
    KVVM_ASSIGN_OR_RETURN(std::unique_ptr<Regex> pattern, parse_replace_pattern(json, where));
    KVVM_ASSIGN_OR_RETURN(std::string content, string_member(json, "content", where));
    return std::unique_ptr<Normalizer>(
        std::make_unique<Replace>(std::move(pattern), std::move(content)));
  }
  if (type == "Sequence") {
    const std::string list_where = member_path(where, "normalizers");
    const Json* list = find_member(json, "normalizers");
    if (list == nullptr) return field_error(list_where, "missing");
    KVVM_RETURN_IF_ERROR(expect_array(*list, list_where));
    std::vector<std::unique_ptr<Normalizer>> steps;
    for (std::size_t i = 0; i < list->size(); ++i) {
      KVVM_ASSIGN_OR_RETURN(std::unique_ptr<Normalizer> step,
                            parse_normalizer((*list)[i], element_path(list_where, i)));
      if (step) steps.push_back(std::move(step));
    }
    if (steps.empty()) return std::unique_ptr<Normalizer>();
    return std::unique_ptr<Normalizer>(std::make_unique<SequenceNormalizer>(std::move(steps)));
  }
  return field_error(member_path(where, "type"), "normalizer '" + type +
                                                     "' is not implemented (NFC, NFD, NFKC, NFKD, "
                                                     "Prepend, Replace, Sequence or null are)");
}

}  // namespace kvvm::tokenizer::detail
