// tokenizer.json's "pre_tokenizer": Split (a regex or a string, any of the five delimiter
// behaviours, invert), ByteLevel (add_prefix_space, use_regex = GPT-2's pattern), Digits,
// Punctuation, Whitespace, WhitespaceSplit, Metaspace (pre_tokenizer_splits.cc) and Sequence.
// Others (BertPreTokenizer, UnicodeScripts, CharDelimiterSplit, ...) are refused by name.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "kvvm/base/status.h"
#include "tokenizer/json_fields.h"

namespace kvvm::tokenizer::detail {

struct PreToken {
  std::string text;
  // Begins where the whole input begins: Metaspace's "first" scheme prepends to this piece
  // only, as Hugging Face's does to the split whose original offset is 0.
  bool at_start = false;
};

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  // Splits every piece further (ByteLevel also spells each in the byte-level alphabet, and
  // Metaspace replaces its spaces); empty pieces are dropped.
  virtual void apply(std::vector<PreToken>& pieces) const = 0;
  // Whether this step (or one inside it) maps pieces to the byte-level alphabet.
  virtual bool byte_level() const = 0;
};

// Metaspace's options, shared by the pre-tokenizer and the decoder of that name.
enum class PrependScheme { kAlways, kFirst, kNever };
struct MetaspaceOptions {
  std::string replacement = "\u2581";  // one character ("▁" by default)
  PrependScheme prepend_scheme = PrependScheme::kAlways;
  bool split = true;
};
// As Hugging Face reads them: replacement one character; prepend_scheme always / first /
// never (default always); split default true; the legacy add_prefix_space false accepted only
// with prepend_scheme never (Hugging Face refuses it otherwise, absent counting as always).
Result<MetaspaceOptions> parse_metaspace_options(const Json& json, std::string_view where);

// nullptr for null (or an empty Sequence).
Result<std::unique_ptr<PreTokenizer>> parse_pre_tokenizer(const Json& json, std::string_view where);

// The character-class pre-tokenizers of pre_tokenizer_splits.cc; nullptr (and no error) for a
// type they do not name.
Result<std::unique_ptr<PreTokenizer>> parse_class_pre_tokenizer(const Json& json,
                                                                std::string_view type,
                                                                std::string_view where);

}  // namespace kvvm::tokenizer::detail
