// A grammar's vocabulary read from a loaded tokenizer (the tokenizer's one use in this room).
#include "kvvm/grammar/vocabulary.h"

namespace kvvm::grammar {

Result<std::shared_ptr<const Vocabulary>> Vocabulary::from_tokenizer(
    const tokenizer::Tokenizer& tokenizer, std::span<const TokenId> ends) {
  const std::size_t n = tokenizer.vocab_size();
  std::vector<std::string> bytes(n);
  std::vector<bool> text(n, false);
  for (std::size_t id = 0; id < n; ++id) {
    const auto token = static_cast<TokenId>(id);
    bytes[id] = std::string(tokenizer.token_bytes(token));
    text[id] = !tokenizer.is_special(token) && !bytes[id].empty();
  }
  return build(std::move(bytes), std::move(text), ends);
}

}  // namespace kvvm::grammar
