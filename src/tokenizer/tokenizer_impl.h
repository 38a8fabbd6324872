// The parts of a loaded tokenizer, shared by loading (tokenizer_load.cc), encoding and
// decoding (tokenizer.cc) and streaming (stream_decoder.cc).
#pragma once

#include <deque>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "kvvm/tokenizer/tokenizer.h"
#include "tokenizer/added_tokens.h"
#include "tokenizer/bpe.h"
#include "tokenizer/decoder.h"
#include "tokenizer/normalizer.h"
#include "tokenizer/post_processor.h"
#include "tokenizer/pre_tokenizer.h"

namespace kvvm::tokenizer {
namespace detail {

// What the id of a token holds: its spelling (a view of the model's vocabulary or of
// `added_contents`) and what it decodes to after the first token (a range of `pool`).
struct TokenInfo {
  std::string_view spelling;
  std::uint32_t bytes_offset = 0;
  std::uint32_t bytes_length = 0;
  bool known = false;
  bool special = false;
};

// Outside Tokenizer so that the loading helpers, free functions, can name it.
struct TokenizerParts {
  std::unique_ptr<detail::Normalizer> normalizer;       // null: none
  std::unique_ptr<detail::PreTokenizer> pre_tokenizer;  // null: none
  std::unique_ptr<detail::Bpe> model;
  detail::AddedTokenMatcher raw_added;         // normalized = false: matched before normalising
  detail::AddedTokenMatcher normalized_added;  // normalized = true: matched after
  detail::PostProcessor post_processor;
  detail::Decoder decoder;

  // By id, for every id below vocab_size(); holes in the id space are unknown.
  std::vector<TokenInfo> tokens;
  std::string pool;                        // decoded bytes, back to back
  std::deque<std::string> added_contents;  // the added tokens' spellings
  detail::Vocab added_ids;                 // added tokens' contents, for token_id()

  // Appends the bytes of `id` (nothing for an unknown id, or a special one when skipped);
  // `first` says whether no token was appended yet, and is cleared once one is.
  void append_bytes(TokenId id, bool skip_special, bool& first, std::string& out) const {
    if (id < 0 || static_cast<std::size_t>(id) >= tokens.size()) return;
    const TokenInfo& token = tokens[static_cast<std::size_t>(id)];
    if (!token.known || (skip_special && token.special)) return;
    if (first && decoder.first_differs()) {
      out += decoder.token_bytes(token.spelling, true);
    } else {
      out.append(pool, token.bytes_offset, token.bytes_length);
    }
    first = false;
  }

  // Encodes text that holds no added token matched in the raw text yet; `at_start`: the text
  // begins where the input does.
  void encode_plain(std::string_view text, bool at_start, std::vector<TokenId>& ids) const;
};

}  // namespace detail

struct Tokenizer::Impl : detail::TokenizerParts {};

}  // namespace kvvm::tokenizer
