// Splits a template's source into text and the tokens inside its tags, applying whitespace
// control as Jinja2 3.1's lexer does: `-` strips all whitespace on its side, `+` turns off
// lstrip_blocks / trim_blocks for its tag, trim_blocks drops the one newline after a block or
// comment tag, lstrip_blocks drops the spaces and tabs before one on its own line; raw blocks
// and comments are resolved here.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "jinja/error.h"

namespace kvvm::jinja::detail {

enum class TokenKind : std::uint8_t {
  kText,
  kVariableBegin,  // {{
  kVariableEnd,    // }}
  kBlockBegin,     // {%
  kBlockEnd,       // %}
  kName,
  kString,  // text holds the decoded string
  kInteger,
  kFloat,
  kOperator,  // text holds the operator
  kEnd,
};

struct Token {
  TokenKind kind = TokenKind::kEnd;
  std::string text;
  std::int64_t integer = 0;
  double floating = 0;
  SourcePos pos;
};

struct LexOptions {
  bool trim_blocks = true;
  bool lstrip_blocks = true;
  bool keep_trailing_newline = false;
};

// Throws TemplateError on a malformed tag, string or number.
std::vector<Token> tokenize(std::string_view source, const LexOptions& options);

}  // namespace kvvm::jinja::detail
