// GPT-2's byte-level alphabet: each of the 256 byte values stands for one printable code point,
// so any byte string becomes text a BPE vocabulary can spell, and back.
#pragma once

#include <string>
#include <string_view>

namespace kvvm::tokenizer::detail {

// The byte-level spelling of `bytes` (each byte replaced by its code point's UTF-8).
std::string bytes_to_byte_level(std::string_view bytes);

// The bytes a vocabulary token spells, as the ByteLevel decoder gives them: each character
// mapped back to its byte, or the token's own bytes unchanged when any character is outside
// the alphabet (an added token such as "<|eot_id|>" is all inside it; "a b" is not).
std::string byte_level_to_bytes(std::string_view token);
// The same, appended to `out`.
void append_byte_level_to_bytes(std::string_view token, std::string& out);

}  // namespace kvvm::tokenizer::detail
