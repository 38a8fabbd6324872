// tokenizer.json's "decoder": ByteLevel, Metaspace, Replace, ByteFallback, Fuse, Strip and
// Sequence, or null (tokens joined by a space), reduced to what decoding one token needs.
//
// Hugging Face decodes the whole list of tokens at once; every decoder served here works token
// by token except at two places, which this class names so that decode() and StreamDecoder give
// the same text: the first token kept (Metaspace drops its replacement characters there
// instead of turning them into spaces; a null decoder puts no space before it), and, after
// the tokens are fused (Fuse, ByteLevel), a Strip of the whole text's leading characters
// (Llama-2's Strip(" ", 1, 0)). Byte-level and <0xNN> tokens give their bytes as they are:
// a byte sequence that is not UTF-8 comes out as those bytes, where Hugging Face's text has
// U+FFFD (StreamDecoder holds an unfinished one back). Anything else after a fusion, and the
// other decoders (BPEDecoder, WordPiece, CTC), are refused by name.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "kvvm/base/status.h"
#include "tokenizer/json_fields.h"

namespace kvvm::tokenizer::detail {

class Regex;

class Decoder {
 public:
  static Result<Decoder> parse(const Json& json, std::string_view where);

  Decoder();
  ~Decoder();
  Decoder(Decoder&&) noexcept;
  Decoder& operator=(Decoder&&) noexcept;

  // The bytes of a token spelled `text`, as the first token kept (`first`) or a later one.
  std::string token_bytes(std::string_view text, bool first) const;
  void append_token_bytes(std::string_view text, bool first, std::string& out) const;
  // Whether the first token decodes differently from a later one.
  bool first_differs() const { return first_differs_; }

  // The whole text loses up to strip_count() leading strip_content() characters.
  std::string_view strip_content() const { return strip_content_; }
  std::size_t strip_count() const { return strip_count_; }

 private:
  struct Step;
  Status add(const Json& json, std::string_view where);

  std::vector<Step> steps_;
  bool fused_ = false;
  bool first_differs_ = false;
  std::string strip_content_;
  std::size_t strip_count_ = 0;
};

}  // namespace kvvm::tokenizer::detail
