// Tool calls in a model's text, per family, as vLLM's tool parsers read them (and named as its
// --tool-call-parser names them):
// - kHermes ("hermes"; Qwen2.5, Qwen3, Hermes 2/3): <tool_call>\n{"name": ..., "arguments":
//   {...}}\n</tool_call>, one block a call, text before the first block is content.
// - kLlama3Json ("llama3_json"; Llama 3.1-3.3): the whole answer is {"name": ...,
//   "parameters": {...}} (several separated by "; "), optionally after <|python_tag|>.
// - kMistral ("mistral"): [TOOL_CALLS] followed by a JSON array of {"name", "arguments"}.
// Text that does not parse as the family's call is content, never an error: a tool loop always
// gets an answer it can read (with tool_choice required or a named tool the grammar engine
// makes the call parse; see tool_call_grammar()).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kvvm/base/status.h"
#include "kvvm/grammar/constraint.h"

namespace kvvm::server {

enum class ToolCallFormat : std::uint8_t { kHermes, kLlama3Json, kMistral };
std::string_view to_string(ToolCallFormat format);  // "hermes", "llama3_json", "mistral"
// InvalidArgument naming the known names otherwise.
Result<ToolCallFormat> parse_tool_call_format(std::string_view name);
// The family a chat template writes tool calls in, read from its text (<tool_call> ->
// hermes, <|python_tag|> or "parameters" with <|start_header_id|> -> llama3_json,
// [TOOL_CALLS] -> mistral); nullopt when the template shows none.
std::optional<ToolCallFormat> detect_tool_call_format(std::string_view template_source);

struct ToolCall {
  std::string id;         // "call_" + 24 random alphanumerics, as OpenAI's look
  std::string name;
  std::string arguments;  // a JSON object's text, as the API returns it (compact)
};

struct ParsedAnswer {
  std::string content;  // the text outside the calls (empty when there is none)
  std::vector<ToolCall> calls;
};

// Makes call ids; the default draws from a random device. Tests pass a counter.
using ToolCallIds = std::function<std::string()>;
ToolCallIds random_tool_call_ids();

// The whole answer at once (non-streamed responses).
ParsedAnswer parse_tool_calls(ToolCallFormat format, std::string_view text,
                              const ToolCallIds& ids);

// One streamed chunk's worth, as the OpenAI SDKs accumulate it: a call's first delta carries
// its index, id, type and name (and possibly the first arguments), later ones only the index
// and the next piece of arguments. Content before a call is content.
struct ToolCallDelta {
  std::uint32_t index = 0;
  std::string id;    // first delta of a call only
  std::string name;  // first delta of a call only
  std::string arguments;
};
struct AnswerDelta {
  std::string content;
  std::vector<ToolCallDelta> calls;
  bool empty() const { return content.empty() && calls.empty(); }
};

// Streamed text in, deltas out; the deltas of a whole answer, accumulated, equal
// parse_tool_calls() of its text (content and calls alike). Text that might still open a call
// (a prefix of the opening tag) is held back until it is decided.
class ToolCallStream {
 public:
  ToolCallStream(ToolCallFormat format, ToolCallIds ids);
  AnswerDelta push(std::string_view text);
  AnswerDelta finish();  // the end of the answer: what was held back

 private:
  ToolCallFormat format_;
  ToolCallIds ids_;
  std::string text_;          // everything pushed
  std::size_t emitted_ = 0;   // bytes of text_ already given out as content
  std::uint32_t calls_ = 0;   // calls opened so far
  std::string open_args_;     // the open call's arguments given out so far
  bool in_call_ = false;
};

// The tools a request offers, as the grammar of their calls needs them.
struct ToolSpec {
  std::string name;
  std::string parameters_json;  // a JSON Schema (an object's); "{}" when the tool gave none
};

// How a family spells calls, for the grammar: every call is open + {"name": NAME,
// "<arguments_key>": ARGS} + close, calls apart by `between`.
struct ToolCallSyntax {
  std::string open;           // "<tool_call>\n", "[TOOL_CALLS][", "" (llama3_json)
  std::string close;          // "\n</tool_call>", "]", ""
  std::string between;        // "\n" / ", " / "; "
  std::string arguments_key;  // "arguments" / "parameters"
  // The text that opens the first call, by which tool_choice auto starts the constraint;
  // empty: the family has none (llama3_json without <|python_tag|>), so auto is unconstrained.
  std::string trigger;
};
ToolCallSyntax syntax_of(ToolCallFormat format);

}  // namespace kvvm::server
