// StreamDecoder: decode() one token at a time, holding back the bytes of a character that a
// later token finishes (an emoji or a CJK character split over byte-level tokens).
#include <utility>

#include "kvvm/tokenizer/tokenizer.h"
#include "tokenizer/tokenizer_impl.h"
#include "tokenizer/utf8.h"

namespace kvvm::tokenizer {

StreamDecoder::StreamDecoder(const Tokenizer& tokenizer, bool skip_special)
    : tokenizer_(tokenizer),
      skip_special_(skip_special),
      strip_left_(tokenizer.impl_->decoder.strip_count()) {}

std::string StreamDecoder::push(TokenId id) {
  const detail::TokenizerParts& impl = *tokenizer_.impl_;
  impl.append_bytes(id, skip_special_, first_, pending_);
  // The decoder's Strip of leading characters, as decode() applies it to the whole text.
  const std::string_view strip = impl.decoder.strip_content();
  while (strip_left_ > 0 && !strip.empty() && !pending_.empty()) {
    if (pending_.starts_with(strip)) {
      pending_.erase(0, strip.size());
      --strip_left_;
    } else if (pending_.size() < strip.size() && strip.starts_with(pending_)) {
      return {};  // maybe the character stripped: the next token tells
    } else {
      strip_left_ = 0;
    }
  }
  const std::size_t ready = detail::utf8_complete_prefix(pending_);
  std::string out = pending_.substr(0, ready);
  pending_.erase(0, ready);
  return out;
}

std::string StreamDecoder::finish() { return std::exchange(pending_, std::string()); }

}  // namespace kvvm::tokenizer
