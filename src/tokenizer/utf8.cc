#include "tokenizer/utf8.h"

#include <utf8proc.h>

namespace kvvm::tokenizer::detail {
namespace {

// The range the second byte of a sequence led by `lead` must fall in, and the sequence length;
// length 0 for a byte that cannot lead one.
struct LeadInfo {
  std::size_t length = 0;
  unsigned low = 0x80;
  unsigned high = 0xBF;
};

LeadInfo lead_info(unsigned lead) {
  if (lead < 0x80) return {1, 0, 0};
  if (lead >= 0xC2 && lead <= 0xDF) return {2};
  if (lead == 0xE0) return {3, 0xA0, 0xBF};  // overlong below
  if (lead == 0xED) return {3, 0x80, 0x9F};  // surrogates above
  if (lead >= 0xE1 && lead <= 0xEF) return {3};
  if (lead == 0xF0) return {4, 0x90, 0xBF};  // overlong below
  if (lead == 0xF4) return {4, 0x80, 0x8F};  // past U+10FFFF above
  if (lead >= 0xF1 && lead <= 0xF3) return {4};
  return {};
}

unsigned byte_at(std::string_view text, std::size_t i) {
  return static_cast<unsigned char>(text[i]);
}

// Whether text[i + k] is an acceptable k-th byte (k >= 1) of the sequence `info` describes.
bool continues(const LeadInfo& info, std::string_view text, std::size_t i, std::size_t k) {
  const unsigned byte = byte_at(text, i + k);
  if (k == 1) return byte >= info.low && byte <= info.high;
  return byte >= 0x80 && byte <= 0xBF;
}

}  // namespace

std::size_t utf8_length(std::string_view text, std::size_t i) {
  if (i >= text.size()) return 0;
  const LeadInfo info = lead_info(byte_at(text, i));
  if (info.length == 0 || i + info.length > text.size()) return 0;
  for (std::size_t k = 1; k < info.length; ++k) {
    if (!continues(info, text, i, k)) return 0;
  }
  return info.length;
}

char32_t utf8_decode(std::string_view text, std::size_t i, std::size_t length) {
  static constexpr unsigned kLeadMask[] = {0, 0x7F, 0x1F, 0x0F, 0x07};
  char32_t code_point = byte_at(text, i) & kLeadMask[length];
  for (std::size_t k = 1; k < length; ++k)
    code_point = (code_point << 6) | (byte_at(text, i + k) & 0x3F);
  return code_point;
}

void utf8_append(std::string& out, char32_t code_point) {
  if (code_point < 0x80) {
    out += static_cast<char>(code_point);
  } else if (code_point < 0x800) {
    out += static_cast<char>(0xC0 | (code_point >> 6));
    out += static_cast<char>(0x80 | (code_point & 0x3F));
  } else if (code_point < 0x10000) {
    out += static_cast<char>(0xE0 | (code_point >> 12));
    out += static_cast<char>(0x80 | ((code_point >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (code_point & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (code_point >> 18));
    out += static_cast<char>(0x80 | ((code_point >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((code_point >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (code_point & 0x3F));
  }
}

std::size_t utf8_complete_prefix(std::string_view bytes) {
  // A sequence is at most 4 bytes, so only a lead byte among the last 3 can be unfinished.
  const std::size_t size = bytes.size();
  for (std::size_t back = 1; back <= 3 && back <= size; ++back) {
    const std::size_t start = size - back;
    const unsigned byte = byte_at(bytes, start);
    if (byte >= 0x80 && byte <= 0xBF) continue;  // a continuation byte: look further back
    const LeadInfo info = lead_info(byte);
    if (info.length <= back) return size;  // complete, ASCII, or not a lead byte at all
    for (std::size_t k = 1; k < back; ++k) {
      if (!continues(info, bytes, start, k)) return size;  // already ill-formed: release it
    }
    return start;
  }
  return size;
}

bool is_white_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
         c == 0x3000;
}

bool is_python_space(char32_t c) { return is_white_space(c) || (c >= 0x1C && c <= 0x1F); }

bool is_word_char(char32_t c) {
  if (c == U'_') return true;
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(c))) {
    case UTF8PROC_CATEGORY_LU:
    case UTF8PROC_CATEGORY_LL:
    case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO:
    case UTF8PROC_CATEGORY_MN:
    case UTF8PROC_CATEGORY_MC:
    case UTF8PROC_CATEGORY_ME:
    case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL:
    case UTF8PROC_CATEGORY_NO:
    case UTF8PROC_CATEGORY_PC:
      return true;
    default:
      return false;
  }
}

bool is_numeric(char32_t c) {
  if (c < 0x80) return c >= U'0' && c <= U'9';
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(c))) {
    case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL:
    case UTF8PROC_CATEGORY_NO:
      return true;
    default:
      return false;
  }
}

bool is_punctuation(char32_t c) {
  // ASCII's punctuation includes symbols Unicode files under S* ($ + < = > ^ ` | ~).
  if (c < 0x80)
    return (c >= 0x21 && c <= 0x2F) || (c >= 0x3A && c <= 0x40) || (c >= 0x5B && c <= 0x60) ||
           (c >= 0x7B && c <= 0x7E);
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(c))) {
    case UTF8PROC_CATEGORY_PC:
    case UTF8PROC_CATEGORY_PD:
    case UTF8PROC_CATEGORY_PS:
    case UTF8PROC_CATEGORY_PE:
    case UTF8PROC_CATEGORY_PI:
    case UTF8PROC_CATEGORY_PF:
    case UTF8PROC_CATEGORY_PO:
      return true;
    default:
      return false;
  }
}

bool is_regex_word_char(char32_t c) {
  if (c < 0x80) {
    return (c >= U'0' && c <= U'9') || (c >= U'a' && c <= U'z') || (c >= U'A' && c <= U'Z') ||
           c == U'_';
  }
  if (c == 0x200C || c == 0x200D) return true;  // Join_Control
  // Other_Alphabetic outside the letters and marks: circled and squared Latin letters (So).
  if ((c >= 0x24B6 && c <= 0x24E9) || (c >= 0x1F130 && c <= 0x1F149) ||
      (c >= 0x1F150 && c <= 0x1F169) || (c >= 0x1F170 && c <= 0x1F189)) {
    return true;
  }
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(c))) {
    case UTF8PROC_CATEGORY_LU:
    case UTF8PROC_CATEGORY_LL:
    case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO:
    case UTF8PROC_CATEGORY_NL:
    case UTF8PROC_CATEGORY_MN:
    case UTF8PROC_CATEGORY_MC:
    case UTF8PROC_CATEGORY_ME:
    case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_PC:
      return true;
    default:
      return false;
  }
}

}  // namespace kvvm::tokenizer::detail
