// The parts of a loaded tokenizer, shared by loading (tokenizer_load.cc), encoding and
// decoding (tokenizer.cc) and streaming (stream_decoder.cc).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "kvvm/tokenizer/tokenizer.h"
#include "tokenizer/added_tokens.h"
#include "tokenizer/bpe.h"
#include "tokenizer/normalizer.h"
#include "tokenizer/post_processor.h"
#include "tokenizer/pre_tokenizer.h"

namespace kvvm::tokenizer {
namespace detail {

// Outside Tokenizer so that the loading helpers, free functions, can name it.
struct TokenizerParts {
  std::unique_ptr<detail::Normalizer> normalizer;       // null: none
  std::unique_ptr<detail::PreTokenizer> pre_tokenizer;  // includes a ByteLevel step
  std::unique_ptr<detail::Bpe> model;
  detail::AddedTokenMatcher raw_added;         // normalized = false: matched before normalising
  detail::AddedTokenMatcher normalized_added;  // normalized = true: matched after
  detail::PostProcessor post_processor;

  // By id, for every id below vocab_size(); holes in the id space are unknown.
  std::vector<std::string> spelling;  // the vocabulary's
  std::vector<std::string> bytes;     // what decoding gives
  std::vector<std::uint8_t> known;
  std::vector<std::uint8_t> special;
  detail::Vocab added_ids;  // added tokens' contents, for token_id()

  // Appends the bytes of `id` (nothing for an unknown id, or a special one when skipped).
  void append_bytes(TokenId id, bool skip_special, std::string& out) const {
    if (id < 0 || static_cast<std::size_t>(id) >= bytes.size()) return;
    const auto index = static_cast<std::size_t>(id);
    if (known[index] == 0 || (skip_special && special[index] != 0)) return;
    out += bytes[index];
  }

  // Encodes text that holds no added token matched in the raw text yet.
  void encode_plain(std::string_view text, std::vector<TokenId>& ids) const;
};

}  // namespace detail

struct Tokenizer::Impl : detail::TokenizerParts {};

}  // namespace kvvm::tokenizer
