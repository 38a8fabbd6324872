#include "tokenizer/byte_level.h"

#include <array>
#include <cstdint>

#include "tokenizer/utf8.h"

namespace kvvm::tokenizer::detail {
namespace {

// Printable bytes stand for themselves; the others (controls, space, DEL, NBSP, soft hyphen)
// take the code points from U+0100 upward in byte order, as GPT-2's bytes_to_unicode does.
struct Alphabet {
  std::array<std::string, 256> spelling;
  std::array<std::int16_t, 0x200> byte_of;  // code point -> byte, -1 when not in the alphabet

  Alphabet() {
    byte_of.fill(-1);
    char32_t next = 0x100;
    for (unsigned byte = 0; byte < 256; ++byte) {
      const bool printable = (byte >= 0x21 && byte <= 0x7E) || (byte >= 0xA1 && byte <= 0xAC) ||
                             (byte >= 0xAE && byte <= 0xFF);
      const char32_t code_point = printable ? char32_t{byte} : next++;
      utf8_append(spelling[byte], code_point);
      byte_of[code_point] = static_cast<std::int16_t>(byte);
    }
  }
};

const Alphabet& alphabet() {
  static const Alphabet table;
  return table;
}

}  // namespace

std::string bytes_to_byte_level(std::string_view bytes) {
  const Alphabet& table = alphabet();
  std::string out;
  out.reserve(bytes.size() * 2);
  for (const char byte : bytes) out += table.spelling[static_cast<unsigned char>(byte)];
  return out;
}

std::string byte_level_to_bytes(std::string_view token) {
  std::string out;
  out.reserve(token.size());
  append_byte_level_to_bytes(token, out);
  return out;
}

void append_byte_level_to_bytes(std::string_view token, std::string& out) {
  const Alphabet& table = alphabet();
  const std::size_t start = out.size();
  for (std::size_t i = 0; i < token.size();) {
    const std::size_t length = utf8_length(token, i);
    char32_t code_point = 0;
    if (length != 0) code_point = utf8_decode(token, i, length);
    if (length == 0 || code_point >= table.byte_of.size() || table.byte_of[code_point] < 0) {
      out.resize(start);
      out.append(token);
      return;
    }
    out += static_cast<char>(table.byte_of[code_point]);
    i += length;
  }
}

}  // namespace kvvm::tokenizer::detail
