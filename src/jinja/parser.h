// Builds the statement tree from the lexer's tokens, with Jinja's grammar and precedence.
#pragma once

#include <cstdint>
#include <vector>

#include "jinja/ast.h"
#include "jinja/lexer.h"

namespace kvvm::jinja::detail {

// Throws TemplateError on a syntax error; kExhausted when nesting passes max_depth (a parser
// that recursed without bound would overflow the stack on hostile input).
Body parse_tokens(std::vector<Token> tokens, std::uint32_t max_depth);

}  // namespace kvvm::jinja::detail
