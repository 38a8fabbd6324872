// Encoding and decoding with a loaded tokenizer (tokenizer_load.cc builds it).
#include "kvvm/tokenizer/tokenizer.h"

#include "tokenizer/tokenizer_impl.h"

namespace kvvm::tokenizer {

void detail::TokenizerParts::encode_plain(std::string_view text, bool at_start,
                                          std::vector<TokenId>& ids) const {
  if (text.empty()) return;
  if (!pre_tokenizer) {
    model->encode(text, ids);
    return;
  }
  std::vector<PreToken> pieces{{std::string(text), at_start}};
  pre_tokenizer->apply(pieces);
  for (const PreToken& piece : pieces) model->encode(piece.text, ids);
}

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::~Tokenizer() = default;

std::vector<TokenId> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  const Impl& impl = *impl_;
  std::vector<TokenId> ids;
  ids.reserve(text.size() / 3 + 4);
  for (const detail::TextPiece& raw : impl.raw_added.split(text)) {
    if (raw.token >= 0) {
      ids.push_back(impl.raw_added.token(raw.token).id);
      continue;
    }
    const std::string_view stretch = text.substr(raw.begin, raw.end - raw.begin);
    const std::string normalized =
        impl.normalizer ? impl.normalizer->normalize(stretch) : std::string(stretch);
    for (const detail::TextPiece& piece : impl.normalized_added.split(normalized)) {
      if (piece.token >= 0) {
        ids.push_back(impl.normalized_added.token(piece.token).id);
      } else {
        impl.encode_plain(std::string_view(normalized).substr(piece.begin, piece.end - piece.begin),
                          raw.begin == 0 && piece.begin == 0, ids);
      }
    }
  }
  if (add_special_tokens) return impl.post_processor.apply(std::move(ids));
  return ids;
}

std::string Tokenizer::decode(std::span<const TokenId> ids, bool skip_special) const {
  std::string out;
  bool first = true;
  for (const TokenId id : ids) impl_->append_bytes(id, skip_special, first, out);
  // A Strip after the tokens are fused takes the text's leading characters.
  const std::string_view strip = impl_->decoder.strip_content();
  std::size_t begin = 0;
  for (std::size_t n = 0; n < impl_->decoder.strip_count() && !strip.empty() &&
                          std::string_view(out).substr(begin).starts_with(strip);
       ++n) {
    begin += strip.size();
  }
  return begin == 0 ? out : out.substr(begin);
}

std::size_t Tokenizer::vocab_size() const { return impl_->tokens.size(); }

std::optional<TokenId> Tokenizer::token_id(std::string_view token) const {
  if (const auto found = impl_->added_ids.find(token); found != impl_->added_ids.end()) {
    return found->second;
  }
  if (const TokenId id = impl_->model->vocab().find(token); id >= 0) return id;
  return std::nullopt;
}

std::string_view Tokenizer::token_text(TokenId id) const {
  if (id < 0 || static_cast<std::size_t>(id) >= impl_->tokens.size()) return {};
  return impl_->tokens[static_cast<std::size_t>(id)].spelling;
}

bool Tokenizer::is_special(TokenId id) const {
  return id >= 0 && static_cast<std::size_t>(id) < impl_->tokens.size() &&
         impl_->tokens[static_cast<std::size_t>(id)].special;
}

std::string_view Tokenizer::token_bytes(TokenId id) const {
  if (id < 0 || static_cast<std::size_t>(id) >= impl_->tokens.size()) return {};
  const detail::TokenInfo& token = impl_->tokens[static_cast<std::size_t>(id)];
  if (!token.known) return {};
  return std::string_view(impl_->pool).substr(token.bytes_offset, token.bytes_length);
}

}  // namespace kvvm::tokenizer
