// A tool call's JSON as vLLM's parsers read it: the text read as Python's json.loads reads it
// (keys in order, a repeated key's last value in its first place, numbers past a double's
// range as infinity), its "name" and "arguments" (or "parameters") taken, and the arguments
// written back as Python's json.dumps(ensure_ascii=False) writes them.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace kvvm::server::detail {

struct CallText {
  std::string name;
  std::string arguments;
};

// The call in a JSON text: an object with a string "name" and "arguments" (or "parameters",
// as Llama's template names them); nullopt for anything else.
std::optional<CallText> read_call(std::string_view text);

}  // namespace kvvm::server::detail
