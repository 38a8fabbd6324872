#include "kvvm/grammar/vocabulary.h"

#include <algorithm>

#include "grammar/text.h"

namespace kvvm::grammar {

Result<std::shared_ptr<const Vocabulary>> Vocabulary::from_bytes(std::vector<std::string> bytes,
                                                                 std::vector<bool> special,
                                                                 std::span<const TokenId> ends) {
  if (special.size() != bytes.size()) {
    return Status::InvalidArgument(
        concat("vocabulary: ", bytes.size(), " tokens but ", special.size(), " special flags"));
  }
  std::vector<bool> text(bytes.size());
  for (std::size_t i = 0; i < bytes.size(); ++i) text[i] = !special[i] && !bytes[i].empty();
  return build(std::move(bytes), std::move(text), ends);
}

Result<std::shared_ptr<const Vocabulary>> Vocabulary::build(std::vector<std::string> bytes,
                                                            std::vector<bool> text,
                                                            std::span<const TokenId> ends) {
  std::shared_ptr<Vocabulary> v(new Vocabulary());
  for (const TokenId end : ends) {
    if (end < 0 || static_cast<std::size_t>(end) >= bytes.size()) {
      return Status::InvalidArgument(concat("vocabulary: end token ", end,
                                            " is outside the vocabulary [0, ", bytes.size(), ")"));
    }
    text[static_cast<std::size_t>(end)] = false;
    v->ends_.push_back(end);
  }
  std::sort(v->ends_.begin(), v->ends_.end());
  v->ends_.erase(std::unique(v->ends_.begin(), v->ends_.end()), v->ends_.end());
  for (std::size_t id = 0; id < bytes.size(); ++id) {
    if (text[id]) v->sorted_.push_back(static_cast<TokenId>(id));
  }
  std::sort(v->sorted_.begin(), v->sorted_.end(), [&bytes](TokenId a, TokenId b) {
    const std::string& x = bytes[static_cast<std::size_t>(a)];
    const std::string& y = bytes[static_cast<std::size_t>(b)];
    return x != y ? x < y : a < b;
  });
  v->shared_.resize(v->sorted_.size(), 0);
  for (std::size_t i = 1; i < v->sorted_.size(); ++i) {
    const std::string& x = bytes[static_cast<std::size_t>(v->sorted_[i - 1])];
    const std::string& y = bytes[static_cast<std::size_t>(v->sorted_[i])];
    std::size_t k = 0;
    while (k < x.size() && k < y.size() && x[k] == y[k] && k < 0xFFFF) ++k;
    v->shared_[i] = static_cast<std::uint16_t>(k);
  }
  v->bytes_ = std::move(bytes);
  v->text_ = std::move(text);
  return std::shared_ptr<const Vocabulary>(std::move(v));
}

bool Vocabulary::is_end(TokenId id) const {
  return std::binary_search(ends_.begin(), ends_.end(), id);
}

}  // namespace kvvm::grammar
