// Tokenizer: Hugging Face tokenizer.json with a byte-level BPE model, as the Llama-3, Qwen2
// and GPT-2 families ship it.
//
// Encoding: added tokens (special or not) are matched first, longest at each position; the
// text between them is normalised (NFC when the file asks, through utf8proc), split by the
// pre-tokenizer's patterns (PCRE2 with UTF and JIT; GPT-2, Llama-3 and Qwen2 patterns, or
// whatever Split regex the file gives), mapped to byte-level characters and merged by rank.
// Decoding maps the byte-level characters back to bytes; StreamDecoder holds back a token's
// bytes while they end inside a UTF-8 sequence, so streamed text is always whole characters.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kvvm/status.h"

namespace kvvm::tokenizer {

using TokenId = std::int32_t;

class Tokenizer {
 public:
  // InvalidArgument naming the path and the defect for a file that is not a byte-level BPE
  // tokenizer.json this class implements (malformed JSON, unknown model / pre-tokenizer /
  // normalizer type, a merge naming an unknown token, ...). NotFound when absent.
  static Result<std::unique_ptr<Tokenizer>> load(const std::string& path);
  static Result<std::unique_ptr<Tokenizer>> parse(std::string_view json, std::string_view origin);

  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;
  ~Tokenizer();

  // Token ids of `text`. `add_special_tokens`: apply the file's post-processor (a BOS, say),
  // as transformers' encode(text) does; false as encode(text, add_special_tokens=False).
  std::vector<TokenId> encode(std::string_view text, bool add_special_tokens = false) const;
  // Bytes of the ids; special tokens included unless `skip_special`.
  std::string decode(std::span<const TokenId> ids, bool skip_special = false) const;

  std::size_t vocab_size() const;  // highest id + 1, added tokens included
  std::optional<TokenId> token_id(std::string_view token) const;
  // The token's text as the vocabulary spells it (byte-level characters), or "" when unknown.
  std::string_view token_text(TokenId id) const;
  bool is_special(TokenId id) const;

 private:
  struct Impl;
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
  friend class StreamDecoder;
};

// Streams decoded text token by token; what push() returns, concatenated with finish(),
// equals decode() of every id pushed.
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tokenizer, bool skip_special = false);
  // Text completed by this token (possibly empty while a character is incomplete).
  std::string push(TokenId id);
  // Whatever is held back (an incomplete sequence at the end, as decode() gives it).
  std::string finish();

 private:
  const Tokenizer& tokenizer_;
  bool skip_special_;
  std::string pending_;
};

}  // namespace kvvm::tokenizer
