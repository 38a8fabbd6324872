// UTF-8 helpers for the tokenizer. Input text may be any bytes (a prompt is not checked before
// it reaches encode), so every helper says what it does with an ill-formed sequence instead of
// assuming one cannot occur.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace kvvm::tokenizer::detail {

// The length of the well-formed UTF-8 sequence at text[i] (RFC 3629: no overlong forms, no
// surrogates, nothing past U+10FFFF), or 0 when the bytes there are not one (truncated too).
std::size_t utf8_length(std::string_view text, std::size_t i);

// The code point of the well-formed sequence of `length` bytes at text[i].
char32_t utf8_decode(std::string_view text, std::size_t i, std::size_t length);

void utf8_append(std::string& out, char32_t code_point);

// The length of the prefix of `bytes` that can be released to a reader: everything but a
// trailing sequence that is incomplete yet still well-formed so far (a later byte may finish
// it). Ill-formed bytes are released as they are.
std::size_t utf8_complete_prefix(std::string_view bytes);

// Unicode White_Space, as Rust's char::is_whitespace (the added tokens' lstrip / rstrip).
bool is_white_space(char32_t code_point);
// Python's str.strip() set: White_Space plus the information separators U+001C..U+001F (the
// chat template's `trim` filter runs in Python).
bool is_python_space(char32_t code_point);
// A word character as an added token's single_word sees it: letters, marks, numbers, '_'.
bool is_word_char(char32_t code_point);

// The character classes Hugging Face's pre-tokenizers test, as Rust defines them (through
// utf8proc's general categories):
// char::is_numeric: Nd, Nl, No (the Digits pre-tokenizer).
bool is_numeric(char32_t code_point);
// char::is_ascii_punctuation or a P* category (the Punctuation pre-tokenizer).
bool is_punctuation(char32_t code_point);
// The regex crate's Unicode \w: Alphabetic, marks, Nd, Pc and the joiners U+200C / U+200D
// (the Whitespace pre-tokenizer's \w+|[^\w\s]+).
bool is_regex_word_char(char32_t code_point);

}  // namespace kvvm::tokenizer::detail
