// Tokenizer: Hugging Face tokenizer.json with a BPE model, as the Llama-3, Qwen2, GPT-2,
// DeepSeek, StarCoder, Falcon (byte-level) and Llama-2 / Mistral (Metaspace or Prepend +
// Replace, byte_fallback) families ship it.
//
// Encoding: added tokens (special or not) are matched first, longest at each position; the
// text between them is normalised (NFC and the other normal forms through utf8proc, Prepend,
// Replace), split by the pre-tokenizer (Split patterns through PCRE2 with UTF and JIT,
// ByteLevel, Digits, Punctuation, Whitespace, WhitespaceSplit, Metaspace), and merged by rank
// (a character outside the vocabulary becoming its <0xNN> byte tokens or the unk_token).
// Decoding applies the file's decoder token by token (ByteLevel's characters back to bytes,
// Metaspace's "▁" back to spaces, <0xNN> to its byte); StreamDecoder holds back a token's
// bytes while they end inside a UTF-8 sequence, so streamed text is always whole characters.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kvvm/base/status.h"

namespace kvvm::tokenizer {

using TokenId = std::int32_t;

namespace detail {
struct LoadProfile;
}  // namespace detail

class Tokenizer {
 public:
  // InvalidArgument naming the path and the defect for a file that is not a BPE
  // tokenizer.json this class implements (malformed JSON, unknown model / pre-tokenizer /
  // normalizer / decoder type, a merge naming an unknown token, ...). NotFound when absent.
  // The tokenizer_config.json beside the file, when there is one, is read for add_bos_token
  // and add_eos_token (see parse).
  static Result<std::unique_ptr<Tokenizer>> load(const std::string& path);
  // `config`: the text of a tokenizer_config.json, or empty for none. A flag it sets decides
  // its side of encode(text, true): true puts the config's bos_token (eos_token) there once,
  // false leaves that side empty, as transformers' update_post_processor rebuilds the
  // template from the flags; a flag it leaves out keeps what tokenizer.json's post-processor
  // does on that side (src/tokenizer/tokenizer_config.cc says where transformers differs).
  static Result<std::unique_ptr<Tokenizer>> parse(std::string_view json, std::string_view origin,
                                                  std::string_view config = {});

  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;
  ~Tokenizer();

  // Token ids of `text`. `add_special_tokens`: apply the file's post-processor (a BOS, say),
  // as transformers' encode(text) does; false as encode(text, add_special_tokens=False).
  // Empty text gives no ids (only the post-processor's, when it adds some), as Hugging Face's.
  std::vector<TokenId> encode(std::string_view text, bool add_special_tokens = false) const;
  // Bytes of the ids; special tokens included unless `skip_special`.
  std::string decode(std::span<const TokenId> ids, bool skip_special = false) const;

  std::size_t vocab_size() const;  // highest id + 1, added tokens included
  std::optional<TokenId> token_id(std::string_view token) const;
  // The token's text as the vocabulary spells it (byte-level characters), or "" when unknown.
  std::string_view token_text(TokenId id) const;
  bool is_special(TokenId id) const;
  // The bytes the token adds to decoded text after the first token (Metaspace's "▁" as a space,
  // <0xNN> as its byte, byte-level characters as their bytes): what a grammar over the output's
  // bytes sees it add. Empty for an id of no token. Valid while the tokenizer lives.
  std::string_view token_bytes(TokenId id) const;

 private:
  struct Impl;
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
  friend class StreamDecoder;
  // tokenizer_load.cc's loader, which also reports where a load's time goes.
  friend Result<std::unique_ptr<Tokenizer>> load_profiled(const std::string& path,
                                                          detail::LoadProfile* profile);
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
  bool first_ = true;           // no token has given text yet (the decoder may treat it apart)
  std::size_t strip_left_ = 0;  // leading characters the decoder's Strip may still take
};

}  // namespace kvvm::tokenizer
