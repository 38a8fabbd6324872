#include "tokenizer/bpe.h"

#include <queue>

#include "tokenizer/utf8.h"

namespace kvvm::tokenizer::detail {
namespace {

Result<TokenId> parse_id(const Json& value, std::string_view where) {
  if (!value.is_number_integer()) {
    return field_error(where, "expected an integer token id, found " + json_kind(value));
  }
  const auto id = value.get<std::int64_t>();
  if (id < 0 || id > kMaxTokenId) {
    return field_error(where, "token id " + std::to_string(id) + " out of range [0, " +
                                  std::to_string(kMaxTokenId) + "]");
  }
  return static_cast<TokenId>(id);
}

// A merge as "left right" (older files) or ["left", "right"] (newer ones, which allow spaces).
Status merge_parts(const Json& entry, std::string_view where, std::string& left,
                   std::string& right) {
  if (entry.is_string()) {
    const auto& text = entry.get_ref<const std::string&>();
    const auto space = text.find(' ');
    if (space == std::string::npos || text.find(' ', space + 1) != std::string::npos) {
      return field_error(where, "merge '" + text + "' is not two tokens separated by one space");
    }
    left = text.substr(0, space);
    right = text.substr(space + 1);
    return Status::Ok();
  }
  if (entry.is_array() && entry.size() == 2 && entry[0].is_string() && entry[1].is_string()) {
    left = entry[0].get<std::string>();
    right = entry[1].get<std::string>();
    return Status::Ok();
  }
  return field_error(where, "expected \"left right\" or [left, right], found " + json_kind(entry));
}

// Refuses a model option that changes encoding in a way not implemented here.
Status refuse_set(const Json& model, std::string_view key, std::string_view where,
                  std::string_view why) {
  const Json* value = find_member(model, key);
  if (value == nullptr) return Status::Ok();
  if (value->is_boolean() && !value->get<bool>()) return Status::Ok();
  if (value->is_string() && value->get_ref<const std::string&>().empty()) return Status::Ok();
  return field_error(member_path(where, key),
                     json_kind(*value) + " is not implemented (" + std::string(why) + ")");
}

}  // namespace

Result<std::unique_ptr<Bpe>> Bpe::parse(const Json& model, std::string_view where) {
  KVVM_RETURN_IF_ERROR(refuse_set(model, "dropout", where, "null expected: encoding is exact"));
  KVVM_RETURN_IF_ERROR(refuse_set(model, "unk_token", where,
                                  "null expected: a byte-level vocabulary spells every byte"));
  KVVM_RETURN_IF_ERROR(refuse_set(model, "byte_fallback", where, "false expected"));
  KVVM_RETURN_IF_ERROR(refuse_set(model, "continuing_subword_prefix", where, "null expected"));
  KVVM_RETURN_IF_ERROR(refuse_set(model, "end_of_word_suffix", where, "null expected"));
  auto bpe = std::unique_ptr<Bpe>(new Bpe());
  Result<bool> ignore_merges = bool_member(model, "ignore_merges", false, where);
  if (!ignore_merges.ok()) return ignore_merges.status();
  bpe->ignore_merges_ = *ignore_merges;

  const std::string vocab_where = member_path(where, "vocab");
  const Json* vocab = find_member(model, "vocab");
  if (vocab == nullptr) return field_error(vocab_where, "missing");
  KVVM_RETURN_IF_ERROR(expect_object(*vocab, vocab_where));
  std::unordered_map<TokenId, const std::string*> by_id;
  bpe->vocab_.reserve(vocab->size());
  for (const auto& [token, value] : vocab->items()) {
    const std::string token_where = vocab_where + "['" + token + "']";
    Result<TokenId> id = parse_id(value, token_where);
    if (!id.ok()) return id.status();
    const auto [other, fresh] = by_id.emplace(*id, &token);
    if (!fresh) {
      return field_error(
          token_where, "id " + std::to_string(*id) + " is also the id of '" + *other->second + "'");
    }
    bpe->vocab_.emplace(token, *id);
  }

  const std::string merges_where = member_path(where, "merges");
  const Json* merges = find_member(model, "merges");
  if (merges == nullptr) return field_error(merges_where, "missing");
  KVVM_RETURN_IF_ERROR(expect_array(*merges, merges_where));
  bpe->merges_.reserve(merges->size());
  std::string left, right;
  for (std::size_t rank = 0; rank < merges->size(); ++rank) {
    const std::string merge_where = element_path(merges_where, rank);
    KVVM_RETURN_IF_ERROR(merge_parts((*merges)[rank], merge_where, left, right));
    const auto find = [&](const std::string& token) { return bpe->vocab_.find(token); };
    for (const std::string* part : {&left, &right}) {
      if (find(*part) == bpe->vocab_.end()) {
        return field_error(merge_where, "merge '" + left + " " + right + "' names token '" + *part +
                                            "', which is not in the vocab");
      }
    }
    const auto result = find(left + right);
    if (result == bpe->vocab_.end()) {
      return field_error(merge_where, "merge '" + left + " " + right + "' makes token '" + left +
                                          right + "', which is not in the vocab");
    }
    // A pair listed twice takes its later rank, as Hugging Face's map (filled in order) does.
    bpe->merges_[pair_key(find(left)->second, find(right)->second)] = {
        static_cast<std::uint32_t>(rank), result->second};
  }
  return bpe;
}

void Bpe::encode(std::string_view word, std::vector<TokenId>& out) const {
  if (word.empty()) return;
  if (ignore_merges_) {
    if (const auto found = vocab_.find(word); found != vocab_.end()) {
      out.push_back(found->second);
      return;
    }
  }
  const bool cacheable = word.size() <= kCacheWordBytes;
  if (cacheable) {
    MutexLock lock(cache_mutex_);
    if (const auto found = cache_.find(word); found != cache_.end()) {
      out.insert(out.end(), found->second.begin(), found->second.end());
      return;
    }
  }
  const std::size_t first = out.size();
  merge(word, out);
  if (cacheable) {
    MutexLock lock(cache_mutex_);
    if (cache_.size() < kCacheEntries) {
      cache_.emplace(
          std::string(word),
          std::vector<TokenId>(out.begin() + static_cast<std::ptrdiff_t>(first), out.end()));
    }
  }
}

void Bpe::merge(std::string_view word, std::vector<TokenId>& out) const {
  // Symbols in a doubly linked list over a vector; a merged-away symbol is marked dead.
  struct Symbol {
    TokenId id;
    int prev;
    int next;
    bool alive;
  };
  std::vector<Symbol> symbols;
  for (std::size_t i = 0; i < word.size();) {
    std::size_t length = utf8_length(word, i);
    if (length == 0) length = 1;
    const auto found = vocab_.find(word.substr(i, length));
    i += length;
    if (found == vocab_.end()) continue;
    const int index = static_cast<int>(symbols.size());
    symbols.push_back({found->second, index - 1, -1, true});
    if (index > 0) symbols[static_cast<std::size_t>(index) - 1].next = index;
  }

  // Candidates by rank, then by position: the leftmost of equal-rank pairs merges first.
  struct Candidate {
    std::uint32_t rank;
    int left;
    TokenId left_id;
    TokenId right_id;
    TokenId result;
    bool operator>(const Candidate& other) const {
      return rank != other.rank ? rank > other.rank : left > other.left;
    }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> heap;
  const auto consider = [&](int left) {
    if (left < 0) return;
    const Symbol& a = symbols[static_cast<std::size_t>(left)];
    if (a.next < 0) return;
    const Symbol& b = symbols[static_cast<std::size_t>(a.next)];
    const auto found = merges_.find(pair_key(a.id, b.id));
    if (found != merges_.end()) {
      heap.push({found->second.rank, left, a.id, b.id, found->second.result});
    }
  };
  for (int i = 0; i + 1 < static_cast<int>(symbols.size()); ++i) consider(i);

  while (!heap.empty()) {
    const Candidate top = heap.top();
    heap.pop();
    Symbol& a = symbols[static_cast<std::size_t>(top.left)];
    // Stale when either side has merged since: a pair's span only grows, so equal ids mean the
    // very pair the candidate was made for.
    if (!a.alive || a.next < 0 || a.id != top.left_id) continue;
    Symbol& b = symbols[static_cast<std::size_t>(a.next)];
    if (b.id != top.right_id) continue;
    a.id = top.result;
    b.alive = false;
    a.next = b.next;
    if (b.next >= 0) symbols[static_cast<std::size_t>(b.next)].prev = top.left;
    consider(a.prev);
    consider(top.left);
  }
  for (const Symbol& symbol : symbols) {
    if (symbol.alive) out.push_back(symbol.id);
  }
}

}  // namespace kvvm::tokenizer::detail
