#include "tokenizer/bpe.h"

#include <queue>

#include "tokenizer/utf8.h"

namespace kvvm::tokenizer::detail {
namespace {

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

std::string quoted(std::string_view left, std::string_view right) {
  return "'" + std::string(left) + " " + std::string(right) + "'";
}

std::string merge_where(std::size_t rank) { return element_path("model.merges", rank); }

}  // namespace

void BpeLists::add_merge(std::string_view left, std::string_view right) {
  const std::size_t rank = merge_count++;
  if (!has_vocab) {
    pending.push_back({left, right});
    return;
  }
  if (merge_table.size() == 0) merge_table.reserve(vocab.size());
  resolve({left, right}, rank);
}

void BpeLists::add_malformed_merge(const Json& entry) {
  const std::size_t rank = merge_count++;
  if (!merges_error.ok()) return;
  if (!has_vocab) {
    pending.push_back({{}, {}, &malformed.emplace_back(entry)});
    return;
  }
  resolve({{}, {}, &entry}, rank);
}

void BpeLists::resolve_pending() {
  if (pending.empty()) return;
  merge_table.reserve(pending.size());
  const std::size_t first = merge_count - pending.size();
  for (std::size_t i = 0; i < pending.size(); ++i) resolve(pending[i], first + i);
  pending.clear();
}

void BpeLists::resolve(const PendingMerge& merge, std::size_t rank) {
  if (!merges_error.ok()) return;
  if (merge.malformed != nullptr) {
    if (merge.malformed->is_string()) {
      merges_error =
          field_error(merge_where(rank), "merge '" + merge.malformed->get<std::string>() +
                                             "' is not two tokens separated by one space");
    } else {
      merges_error =
          field_error(merge_where(rank), "expected \"left right\" or [left, right], found " +
                                             json_kind(*merge.malformed));
    }
    return;
  }
  const TokenId left = vocab.find(merge.left);
  const TokenId right = vocab.find(merge.right);
  if (left < 0 || right < 0) {
    merges_error = field_error(merge_where(rank),
                               "merge " + quoted(merge.left, merge.right) + " names token '" +
                                   std::string(left < 0 ? merge.left : merge.right) +
                                   "', which is not in the vocab");
    return;
  }
  joined_.assign(merge.left);
  joined_.append(merge.right);
  const TokenId result = vocab.find(joined_);
  if (result < 0) {
    merges_error = field_error(merge_where(rank), "merge " + quoted(merge.left, merge.right) +
                                                      " makes token '" + joined_ +
                                                      "', which is not in the vocab");
    return;
  }
  merge_table.assign(left, right, {static_cast<std::uint32_t>(rank), result});
}

Result<std::unique_ptr<Bpe>> Bpe::build(const Json& model, BpeLists lists, std::string_view where) {
  KVVM_RETURN_IF_ERROR(refuse_set(model, "dropout", where, "null expected: encoding is exact"));
  KVVM_RETURN_IF_ERROR(refuse_set(model, "continuing_subword_prefix", where, "null expected"));
  KVVM_RETURN_IF_ERROR(refuse_set(model, "end_of_word_suffix", where, "null expected"));
  auto bpe = std::unique_ptr<Bpe>(new Bpe());
  for (auto [key, field] : {std::pair{"ignore_merges", &bpe->ignore_merges_},
                            {"byte_fallback", &bpe->byte_fallback_},
                            {"fuse_unk", &bpe->fuse_unk_}}) {
    KVVM_ASSIGN_OR_RETURN(bool value, bool_member(model, key, false, where));
    *field = value;
  }

  const std::string vocab_where = member_path(where, "vocab");
  if (!lists.has_vocab) {
    const Json* vocab = find_member(model, "vocab");
    if (vocab == nullptr) return field_error(vocab_where, "missing");
    return field_error(vocab_where, "expected an object, found " + json_kind(*vocab));
  }
  KVVM_RETURN_IF_ERROR(lists.vocab_error);
  // The merges are resolved against the vocabulary before it moves into the model.
  lists.resolve_pending();
  bpe->vocab_ = std::move(lists.vocab);

  // An empty unk_token is taken as none.
  const Json* unk = find_member(model, "unk_token");
  if (unk != nullptr && !(unk->is_string() && unk->get_ref<const std::string&>().empty())) {
    if (!unk->is_string()) {
      return field_error(member_path(where, "unk_token"),
                         "expected a string, found " + json_kind(*unk));
    }
    // Hugging Face fails at encode time on an unk_token outside the vocab; refused here.
    bpe->unk_ = bpe->vocab_.find(unk->get_ref<const std::string&>());
    if (bpe->unk_ < 0) {
      return field_error(member_path(where, "unk_token"), json_kind(*unk) + " is not in the vocab");
    }
  }
  for (unsigned byte = 0; byte < 256; ++byte) {
    static constexpr char kHex[] = "0123456789ABCDEF";
    const char name[] = {'<', '0', 'x', kHex[byte >> 4], kHex[byte & 15], '>'};
    bpe->byte_ids_[byte] = bpe->vocab_.find(std::string_view(name, sizeof name));
  }

  if (!lists.has_merges) {
    const std::string merges_where = member_path(where, "merges");
    const Json* merges = find_member(model, "merges");
    if (merges == nullptr) return field_error(merges_where, "missing");
    return field_error(merges_where, "expected an array, found " + json_kind(*merges));
  }
  KVVM_RETURN_IF_ERROR(lists.merges_error);
  bpe->merges_ = std::move(lists.merge_table);
  return bpe;
}

void Bpe::encode(std::string_view word, std::vector<TokenId>& out) const {
  if (word.empty()) return;
  if (ignore_merges_) {
    if (const TokenId id = vocab_.find(word); id >= 0) {
      out.push_back(id);
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

void Bpe::symbols_of(std::string_view word, std::vector<TokenId>& ids) const {
  // An unk waits until a known character (or the end) comes, so a run of them can fuse; as in
  // Hugging Face's merge_word, byte-fallback tokens do not flush it.
  bool unk_pending = false;
  for (std::size_t i = 0; i < word.size();) {
    std::size_t length = utf8_length(word, i);
    if (length == 0) length = 1;  // a stray byte is a character of its own
    const std::string_view character = word.substr(i, length);
    i += length;
    if (const TokenId id = vocab_.find(character); id >= 0) {
      if (unk_pending) ids.push_back(unk_);
      unk_pending = false;
      ids.push_back(id);
      continue;
    }
    if (byte_fallback_) {
      bool all = true;
      for (const char byte : character)
        all = all && byte_ids_[static_cast<unsigned char>(byte)] >= 0;
      if (all) {
        for (const char byte : character)
          ids.push_back(byte_ids_[static_cast<unsigned char>(byte)]);
        continue;
      }
    }
    if (unk_ < 0) continue;  // dropped, as Hugging Face does without an unk_token
    if (unk_pending && !fuse_unk_) ids.push_back(unk_);
    unk_pending = true;
  }
  if (unk_pending) ids.push_back(unk_);
}

void Bpe::merge(std::string_view word, std::vector<TokenId>& out) const {
  // Symbols in a doubly linked list over a vector; a merged-away symbol is marked dead.
  struct Symbol {
    TokenId id;
    int prev;
    int next;
    bool alive;
  };
  std::vector<TokenId> initial;
  initial.reserve(word.size());
  symbols_of(word, initial);
  std::vector<Symbol> symbols;
  symbols.reserve(initial.size());
  for (std::size_t i = 0; i < initial.size(); ++i) {
    const int index = static_cast<int>(i);
    symbols.push_back({initial[i], index - 1,
                       index + 1 < static_cast<int>(initial.size()) ? index + 1 : -1, true});
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
    if (const MergeTable::Merge* found = merges_.find(a.id, b.id)) {
      heap.push({found->rank, left, a.id, b.id, found->result});
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
