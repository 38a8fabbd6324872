// The one way kvvm reads JSON from a file, a trace line or a request body: bounded in size and
// nesting depth, UTF-8 checked, and every error names the input, the byte offset and the line
// and column.
//
// Why a bound on depth before the DOM exists: nlohmann's DOM nests one value inside the other
// and its walks over it recurse (dump() for an error message, copies, comparisons), so 100,000
// nested '[' from a hostile or corrupt file exhausts the stack (SIGSEGV) instead of returning
// an error. The depth is counted in a scan over the raw bytes (strings and their
// escapes respected), and only a document within every bound reaches the parser.
#pragma once

#include <cstddef>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "kvvm/base/status.h"

namespace kvvm {

// 64 MiB: far above any config.json or trace line (a few KiB to a few MiB), far below memory.
inline constexpr std::size_t kDefaultJsonMaxBytes = std::size_t{64} << 20;
// 64 levels: Hugging Face configs nest about 4 deep, a trace line 2.
inline constexpr std::size_t kDefaultJsonMaxDepth = 64;

struct JsonLimits {
  std::size_t max_bytes = kDefaultJsonMaxBytes;  // the whole document
  std::size_t max_depth = kDefaultJsonMaxDepth;  // arrays and objects inside each other
};

// Parses `text` as one JSON document. InvalidArgument, starting with `name` + ": " (nothing
// when empty, for callers that say where themselves), when it is over max_bytes, nests deeper than
// max_depth, holds invalid UTF-8, is not valid JSON (truncated, trailing garbage, a number out
// of range) or gives a key twice in one object (named; nlohmann would keep the last silently);
// the message gives the byte offset (from 0) and the line and column (from 1) where the
// reading stopped.
Result<nlohmann::json> read_json(std::string_view text, const JsonLimits& limits = {},
                                 std::string_view name = {});

// The checks read_json makes before it parses (the size, UTF-8, the nesting depth), for a
// caller that parses with nlohmann's SAX interface itself; the same messages.
Status check_json_input(std::string_view text, const JsonLimits& limits = {},
                        std::string_view name = {});
// read_json's message for nlohmann's parse error `what` at `byte` (from 1; 0: unknown).
Status json_syntax_error(std::string_view text, std::string_view name, std::size_t byte,
                         const std::string& what);
// read_json's message for `key` given twice, the document's `index`-th key (from 0).
Status json_duplicate_key(std::string_view text, std::string_view name, const std::string& key,
                          std::size_t index);

// Reads and parses the file at `path` (its size is checked before it is read); errors name it.
Result<nlohmann::json> read_json_file(const std::string& path, const JsonLimits& limits = {});

}  // namespace kvvm
