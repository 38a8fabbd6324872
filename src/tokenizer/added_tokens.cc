#include "tokenizer/added_tokens.h"

#include "tokenizer/utf8.h"

namespace kvvm::tokenizer::detail {
namespace {

std::uint64_t edge_key(int node, unsigned char byte) {
  return (static_cast<std::uint64_t>(node) << 8) | byte;
}

// The code point that ends at text[end - 1] (scanning back over at most 4 bytes), or -1 when
// the bytes there are not a well-formed sequence.
std::int64_t code_point_before(std::string_view text, std::size_t end) {
  for (std::size_t back = 1; back <= 4 && back <= end; ++back) {
    const std::size_t length = utf8_length(text, end - back);
    if (length == back) return utf8_decode(text, end - back, length);
  }
  return -1;
}

std::int64_t code_point_at(std::string_view text, std::size_t i) {
  const std::size_t length = utf8_length(text, i);
  return length == 0 ? -1 : utf8_decode(text, i, length);
}

bool white_at(std::int64_t code_point) {
  return code_point >= 0 && is_white_space(static_cast<char32_t>(code_point));
}
bool word_at(std::int64_t code_point) {
  return code_point >= 0 && is_word_char(static_cast<char32_t>(code_point));
}

}  // namespace

void AddedTokenMatcher::add(const AddedToken& token, std::string content) {
  if (content.empty()) return;  // an empty token would match everywhere; it never matches
  const int index = static_cast<int>(tokens_.size());
  tokens_.push_back(token);
  int node = 0;
  for (const char c : content) {
    const auto [edge, fresh] = edges_.emplace(edge_key(node, static_cast<unsigned char>(c)),
                                              static_cast<int>(nodes_.size()));
    if (fresh) nodes_.emplace_back();
    node = edge->second;
  }
  // Two tokens with one content: the first keeps it.
  if (nodes_[static_cast<std::size_t>(node)].token < 0)
    nodes_[static_cast<std::size_t>(node)].token = index;
}

int AddedTokenMatcher::longest_at(std::string_view text, std::size_t i, std::size_t& end) const {
  int node = 0;
  int found = -1;
  for (std::size_t k = i; k < text.size(); ++k) {
    const auto edge = edges_.find(edge_key(node, static_cast<unsigned char>(text[k])));
    if (edge == edges_.end()) break;
    node = edge->second;
    if (nodes_[static_cast<std::size_t>(node)].token >= 0) {
      found = nodes_[static_cast<std::size_t>(node)].token;
      end = k + 1;
    }
  }
  return found;
}

bool AddedTokenMatcher::accepts(const AddedToken& token, std::string_view text, std::size_t begin,
                                std::size_t end) const {
  if (!token.single_word) return true;
  return !word_at(code_point_before(text, begin)) && !word_at(code_point_at(text, end));
}

std::vector<TextPiece> AddedTokenMatcher::split(std::string_view text) const {
  std::vector<TextPiece> pieces;
  if (tokens_.empty()) {
    if (!text.empty()) pieces.push_back({0, text.size(), -1});
    return pieces;
  }
  std::size_t plain = 0;  // where the current stretch of plain text began
  for (std::size_t i = 0; i < text.size();) {
    std::size_t end = i;
    const int index = longest_at(text, i, end);
    if (index < 0) {
      ++i;
      continue;
    }
    const AddedToken& token = tokens_[static_cast<std::size_t>(index)];
    if (!accepts(token, text, i, end)) {
      i = end;  // as Hugging Face's search resumes after a refused match
      continue;
    }
    std::size_t begin = i;
    if (token.lstrip) {
      while (begin > plain) {
        const std::int64_t before = code_point_before(text, begin);
        if (!white_at(before)) break;
        std::string utf8;
        utf8_append(utf8, static_cast<char32_t>(before));
        begin -= utf8.size();
      }
    }
    if (token.rstrip) {
      while (end < text.size() && white_at(code_point_at(text, end))) {
        end += utf8_length(text, end);
      }
    }
    if (begin > plain) pieces.push_back({plain, begin, -1});
    pieces.push_back({begin, end, index});
    plain = i = end;
  }
  if (plain < text.size()) pieces.push_back({plain, text.size(), -1});
  return pieces;
}

}  // namespace kvvm::tokenizer::detail
