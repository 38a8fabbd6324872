// Reading tokenizer.json's text with base/json_reader.h's read_json (nlohmann's parser, the
// bounds and the duplicate-key check every JSON input of kvvm gets): model.vocab and
// model.merges are then moved out of the DOM into the BPE model's lists, everything else stays
// a DOM for the component parsers.
#pragma once

#include <string_view>

#include "kvvm/base/status.h"
#include "tokenizer/bpe.h"
#include "tokenizer/json_fields.h"

namespace kvvm::tokenizer::detail {

// The nesting bound of base/json_reader.h's read_json.
inline constexpr std::size_t kTokenizerJsonMaxDepth = 64;

// `document` gets the whole document but model.vocab (when an object) and model.merges (when
// an array), which go to `lists` (its merges view strings it owns, in `decoded`). A
// malformed document is InvalidArgument starting "<name>: " with the byte, line and column.
// `vocab_ms` / `merges_ms` (when not null) get the time spent moving each list into its table
// (the parse itself is not in them).
Status read_tokenizer_json(std::string_view text, std::string_view name, Json& document,
                           BpeLists& lists, double* vocab_ms = nullptr,
                           double* merges_ms = nullptr);

// Reads `text` as JSON without keeping anything (the syntax alone, for the load benchmark).
Status check_json_syntax(std::string_view text);

}  // namespace kvvm::tokenizer::detail
