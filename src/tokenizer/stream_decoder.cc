// StreamDecoder: decode() one token at a time, holding back the bytes of a character that a
// later token finishes (an emoji or a CJK character split over byte-level tokens).
#include <utility>

#include "kvvm/tokenizer/tokenizer.h"
#include "tokenizer/tokenizer_impl.h"
#include "tokenizer/utf8.h"

namespace kvvm::tokenizer {

StreamDecoder::StreamDecoder(const Tokenizer& tokenizer, bool skip_special)
    : tokenizer_(tokenizer), skip_special_(skip_special) {}

std::string StreamDecoder::push(TokenId id) {
  tokenizer_.impl_->append_bytes(id, skip_special_, pending_);
  const std::size_t ready = detail::utf8_complete_prefix(pending_);
  std::string out = pending_.substr(0, ready);
  pending_.erase(0, ready);
  return out;
}

std::string StreamDecoder::finish() { return std::exchange(pending_, std::string()); }

}  // namespace kvvm::tokenizer
