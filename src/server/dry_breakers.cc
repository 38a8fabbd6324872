#include "dry_breakers.h"

#include <map>
#include <memory>
#include <mutex>
#include <utility>

namespace kvvm::server {

const std::vector<std::string>& default_dry_breakers() {
  static const std::vector<std::string> breakers = {"\n", ":", "\"", "*"};
  return breakers;
}

std::vector<std::int32_t> dry_breaker_tokens(const tokenizer::Tokenizer& tok,
                                             const std::vector<std::string>& breakers) {
  using Key = std::pair<const tokenizer::Tokenizer*, std::vector<std::string>>;
  static std::mutex mutex;
  static std::map<Key, std::shared_ptr<const std::vector<std::int32_t>>> known;
  Key key{&tok, breakers};
  {
    std::lock_guard<std::mutex> lock(mutex);
    auto it = known.find(key);
    if (it != known.end()) return *it->second;
  }
  auto ids = std::make_shared<std::vector<std::int32_t>>();
  for (std::size_t id = 0; id < tok.vocab_size(); ++id) {
    const auto token = static_cast<tokenizer::TokenId>(id);
    const std::string text = tok.decode(std::span<const tokenizer::TokenId>(&token, 1));
    for (const std::string& breaker : breakers) {
      if (text.find(breaker) != std::string::npos) {
        ids->push_back(static_cast<std::int32_t>(id));
        break;
      }
    }
  }
  std::lock_guard<std::mutex> lock(mutex);
  // A few lists at most in practice; a client cycling lists is bounded by clearing.
  if (known.size() >= 64) known.clear();
  known.emplace(std::move(key), ids);
  return *ids;
}

}  // namespace kvvm::server
