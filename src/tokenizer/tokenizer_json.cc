#include "tokenizer/tokenizer_json.h"

#include <algorithm>
#include <chrono>
#include <deque>
#include <string>
#include <utility>
#include <vector>

#include "base/json_reader.h"

namespace kvvm::tokenizer::detail {
namespace {

// nlohmann's SAX events into `document`, but for model.vocab (an object) and model.merges (an
// array), whose entries go to the lists as they come: no DOM node is built for the 150,000
// entries of each that a large vocabulary has. An entry of either that is not of its form
// (a vocab value that is not a number, a merge neither "a b" nor ["a", "b"]) is built as a
// small DOM value and handed over when it closes. Keys are counted so that a key given twice
// is reported where it is, as read_json reports it.
class TokenizerJsonSax final : public nlohmann::json_sax<Json> {
 public:
  TokenizerJsonSax(std::string_view text, std::string_view name, Json& document, BpeLists& lists)
      : text_(text), name_(name), document_(document), lists_(lists) {}

  const Status& status() const { return status_; }
  double vocab_ms() const { return vocab_ms_; }
  double merges_ms() const { return merges_ms_; }

  bool null() override { return value(Json(nullptr)); }
  bool boolean(bool v) override { return value(Json(v)); }
  bool number_integer(number_integer_t v) override { return value(Json(v)); }
  bool number_unsigned(number_unsigned_t v) override { return value(Json(v)); }
  bool number_float(number_float_t v, const string_t&) override { return value(Json(v)); }
  bool binary(binary_t&) override { return value(Json(nullptr)); }  // not in JSON text
  bool string(string_t& v) override {
    if (!frames_.empty() && frames_.back().kind == Kind::kMerges) {
      take_merge_string(std::move(v));
      return true;
    }
    return value(Json(std::move(v)));
  }
  bool key(string_t& v) override {
    Frame& top = frames_.back();
    const std::size_t index = keys_++;
    if (top.kind == Kind::kVocab) {
      token_ = std::move(v);
      token_index_ = index;
      return true;
    }
    const bool streamed = top.is_model && ((v == "vocab" && lists_.has_vocab) ||
                                           (v == "merges" && lists_.has_merges));
    if (streamed || top.json->contains(v)) return fail(json_duplicate_key(text_, name_, v, index));
    top.key = std::move(v);
    return true;
  }
  bool start_object(std::size_t) override { return open(Json::object()); }
  bool start_array(std::size_t) override { return open(Json::array()); }
  bool end_object() override { return close(); }
  bool end_array() override { return close(); }
  bool parse_error(std::size_t byte, const std::string&,
                   const nlohmann::detail::exception& error) override {
    return fail(json_syntax_error(text_, name_, byte, error.what()));
  }

 private:
  enum class Kind {
    kDom,     // a container of the document (or of an odd entry) being built
    kVocab,   // model.vocab: members streamed into the table
    kMerges,  // model.merges: elements streamed into the lists
  };
  struct Frame {
    Kind kind = Kind::kDom;
    Json* json = nullptr;  // kDom: the container
    std::string key;       // an object's pending key
    bool is_model = false;
    bool odd_entry = false;  // the root of a vocab or merges entry of no known form
    std::chrono::steady_clock::time_point start;
  };

  bool fail(Status status) {
    if (status_.ok()) status_ = std::move(status);
    return false;
  }

  // Where a value opened or read at the current position goes: into the document, into the
  // container on top, or (null) to the list on top.
  Json* slot(Json&& value) {
    if (frames_.empty()) {
      document_ = std::move(value);
      return &document_;
    }
    Frame& top = frames_.back();
    if (top.kind != Kind::kDom) return nullptr;
    if (top.json->is_array()) {
      top.json->push_back(std::move(value));
      return &top.json->back();
    }
    return &((*top.json)[top.key] = std::move(value));
  }

  bool value(Json&& v) {
    if (!frames_.empty() && frames_.back().kind == Kind::kVocab) {
      take_vocab_entry(v);
      return true;
    }
    if (!frames_.empty() && frames_.back().kind == Kind::kMerges) {
      lists_.add_malformed_merge(v);
      return true;
    }
    slot(std::move(v));
    return true;
  }

  bool open(Json&& container) {
    Frame frame;
    frame.start = std::chrono::steady_clock::now();
    if (!frames_.empty()) {
      Frame& top = frames_.back();
      if (top.is_model && top.key == "vocab" && container.is_object()) {
        lists_.has_vocab = true;
        frame.kind = Kind::kVocab;
        frames_.push_back(std::move(frame));
        return true;
      }
      if (top.is_model && top.key == "merges" && container.is_array()) {
        lists_.has_merges = true;
        frame.kind = Kind::kMerges;
        frames_.push_back(std::move(frame));
        return true;
      }
      if (top.kind != Kind::kDom) {
        odd_.push_back(std::move(container));
        frame.json = &odd_.back();
        frame.odd_entry = true;
        frames_.push_back(std::move(frame));
        return true;
      }
      frame.is_model = frames_.size() == 1 && top.json->is_object() && top.key == "model" &&
                       container.is_object();
    }
    frame.json = slot(std::move(container));
    frames_.push_back(std::move(frame));
    return true;
  }

  bool close() {
    Frame frame = std::move(frames_.back());
    frames_.pop_back();
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - frame.start)
            .count();
    if (frame.kind == Kind::kVocab) vocab_ms_ += ms;
    if (frame.kind == Kind::kMerges) merges_ms_ += ms;
    if (!frame.odd_entry) return true;
    Json entry = std::move(odd_.back());
    odd_.pop_back();
    if (frames_.back().kind == Kind::kVocab) {
      take_vocab_entry(entry);
    } else if (entry.is_array() && entry.size() == 2 && entry[0].is_string() &&
               entry[1].is_string()) {
      const std::string_view left =
          lists_.decoded.emplace_back(std::move(entry[0].get_ref<std::string&>()));
      const std::string_view right =
          lists_.decoded.emplace_back(std::move(entry[1].get_ref<std::string&>()));
      lists_.add_merge(left, right);
    } else {
      lists_.add_malformed_merge(entry);
    }
    return true;
  }

  void take_merge_string(std::string&& text) {
    const std::string_view kept = lists_.decoded.emplace_back(std::move(text));
    const std::size_t space = kept.find(' ');
    if (space == kept.npos || kept.find(' ', space + 1) != kept.npos) {
      lists_.add_malformed_merge(Json(std::string(kept)));
      return;
    }
    lists_.add_merge(kept.substr(0, space), kept.substr(space + 1));
  }

  // One "token": id of the vocab, refusing an id that is not an integer in range or already
  // another token's (the first such refusal is kept; the reading goes on so that a syntax
  // error later in the file is still the one reported).
  void take_vocab_entry(const Json& id) {
    const auto refuse = [&](const std::string& why) {
      if (lists_.vocab_error.ok()) {
        lists_.vocab_error = field_error("model.vocab['" + token_ + "']", why);
      }
    };
    if (!id.is_number_integer()) {
      refuse("expected an integer token id, found " + json_kind(id));
      return;
    }
    if (id.is_number_unsigned() && id.get<std::uint64_t>() > std::uint64_t(kMaxTokenId)) {
      refuse("token id " + std::to_string(id.get<std::uint64_t>()) + " out of range [0, " +
             std::to_string(kMaxTokenId) + "]");
      return;
    }
    const auto value = id.get<std::int64_t>();
    if (value < 0 || value > kMaxTokenId) {
      refuse("token id " + std::to_string(value) + " out of range [0, " +
             std::to_string(kMaxTokenId) + "]");
      return;
    }
    const auto index = static_cast<std::size_t>(value);
    if (index >= index_of_id_.size()) {
      index_of_id_.resize(std::max(index + 1, index_of_id_.size() * 2));
    }
    if (index_of_id_[index] != 0) {
      const std::string_view other =
          lists_.vocab.token_at(static_cast<std::size_t>(index_of_id_[index] - 1));
      if (other == token_) {
        fail(json_duplicate_key(text_, name_, token_, token_index_));
        return;
      }
      refuse("id " + std::to_string(value) + " is also the id of '" + std::string(other) + "'");
      return;
    }
    if (!lists_.vocab.insert(token_, static_cast<TokenId>(value))) {
      fail(json_duplicate_key(text_, name_, token_, token_index_));
      return;
    }
    index_of_id_[index] = static_cast<std::int32_t>(lists_.vocab.size());
  }

  std::string_view text_;
  std::string_view name_;
  Json& document_;
  BpeLists& lists_;
  Status status_;
  std::vector<Frame> frames_;
  std::deque<Json> odd_;  // the odd entries being built (stable addresses)
  std::size_t keys_ = 0;
  std::string token_;  // the vocab member whose value comes next
  std::size_t token_index_ = 0;
  std::vector<std::int32_t> index_of_id_;  // id -> vocab entry index + 1, 0 when unused
  double vocab_ms_ = 0;
  double merges_ms_ = 0;
};

}  // namespace

Status check_json_syntax(std::string_view text) {
  if (!Json::accept(text)) return Status::InvalidArgument("not valid JSON");
  return Status::Ok();
}

Status read_tokenizer_json(std::string_view text, std::string_view name, Json& document,
                           BpeLists& lists, double* vocab_ms, double* merges_ms) {
  JsonLimits limits;
  limits.max_bytes = text.size();  // the caller bounded the size
  limits.max_depth = kTokenizerJsonMaxDepth;
  KVVM_RETURN_IF_ERROR(check_json_input(text, limits, name));
  TokenizerJsonSax sax(text, name, document, lists);
  const bool read = Json::sax_parse(text, &sax);
  if (!sax.status().ok()) return sax.status();
  if (!read) return Status::InvalidArgument(std::string(name) + ": not valid JSON");
  if (vocab_ms != nullptr) *vocab_ms += sax.vocab_ms();
  if (merges_ms != nullptr) *merges_ms += sax.merges_ms();
  return Status::Ok();
}

}  // namespace kvvm::tokenizer::detail
