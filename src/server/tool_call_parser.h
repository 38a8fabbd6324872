// Tool calls in a model's text, per family, as vLLM's tool parsers read them (and named as its
// --tool-call-parser names them):
// - kHermes ("hermes"; Qwen2.5, Qwen3, Hermes 2/3): <tool_call>\n{"name": ..., "arguments":
//   {...}}\n</tool_call>, one block a call (a block left open at the end counts when its JSON
//   is whole).
// - kLlama3Json ("llama3_json"; Llama 3.1-3.3): the answer starts with {"name": ...,
//   "parameters": {...}} (several separated by ";"), optionally after <|python_tag|>.
// - kMistral ("mistral"): [TOOL_CALLS] followed by a JSON array of {"name", "arguments"}.
// A call is a JSON object with a string "name" and an "arguments" (or "parameters") value;
// other keys (Mistral's "id") are ignored, and a call without arguments has {}.
//
// Text that does not parse as the family's call is content, never an error: a block or object
// whose JSON does not parse (truncated by max_tokens) stays content as the model wrote it, so
// a tool loop always gets an answer it can read (with tool_choice required or a named tool the
// grammar engine makes the call parse; see tool_calls_spec()). Content is the text outside the
// calls; where there is a call, the stretches between calls (and before the first, after the
// last) that are only whitespace are dropped, as the template's own newlines around calls are
// not an answer. Unlike vLLM, which drops everything but the text before the first call, other
// text after a call stays content: that is what a stream has already sent, and the stream and
// the whole answer must agree.
//
// `arguments` is the text vLLM returns, Python's json.dumps(args, ensure_ascii=False): keys in
// the model's order, ", " and ": " between items (`{"city": "Paris", "days": [1, 2]}`),
// characters past ASCII as they are. OpenAI's own arguments are the model's text; clients parse
// it either way.
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
// vLLM's names (and its alias "llama4_json"); InvalidArgument naming the known names otherwise.
Result<ToolCallFormat> parse_tool_call_format(std::string_view name);
// The family a chat template writes tool calls in, read from its text (<tool_call> ->
// hermes, <|python_tag|> or "parameters" with <|start_header_id|> -> llama3_json,
// [TOOL_CALLS] -> mistral); nullopt when the template shows none.
std::optional<ToolCallFormat> detect_tool_call_format(std::string_view template_source);

struct ToolCall {
  std::string id;  // from the ToolCallIds: "call_" + 24 random alphanumerics, as OpenAI's look
  std::string name;
  std::string arguments;  // a JSON text in json.dumps's form (see above)
};

struct ParsedAnswer {
  std::string content;  // the text outside the calls (empty when there is none)
  std::vector<ToolCall> calls;
};

// Makes call ids; the default draws from a random device. Tests pass a counter.
using ToolCallIds = std::function<std::string()>;
ToolCallIds random_tool_call_ids();
// The ids a family's template takes back: Mistral's refuses any but 9 alphanumerics (as vLLM
// makes them for it); the others get OpenAI's "call_" + 24.
ToolCallIds random_tool_call_ids(ToolCallFormat format);

// The whole answer at once (non-streamed responses).
ParsedAnswer parse_tool_calls(ToolCallFormat format, std::string_view text, const ToolCallIds& ids);

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
// parse_tool_calls() of its text (content and calls alike): parse_tool_calls() is this stream
// over the whole text. Content goes out as it comes, less what is not decided yet: a prefix of
// the opening tag, whitespace that may turn out to lie between calls, an incomplete UTF-8
// character. A call goes out whole, in one delta (index, id, name, arguments), once its JSON
// is known to parse: at </tool_call> (hermes) or at its object's closing brace (llama3_json,
// mistral). Earlier pieces could not be taken back when the JSON then failed (max_tokens cut
// it), which must leave it content.
//
// The tags must reach the parser: [TOOL_CALLS] (Mistral) and <|python_tag|> (Llama) are
// special tokens, which a detokenizer that skips special tokens drops (vLLM turns
// skip_special_tokens off for Mistral's parser); Qwen's <tool_call> is an ordinary added token.
class ToolCallStream {
 public:
  ToolCallStream(ToolCallFormat format, ToolCallIds ids);
  AnswerDelta push(std::string_view text);
  AnswerDelta finish();  // the end of the answer: what was held back

 private:
  enum class State : std::uint8_t {
    kText,       // content, watching for the family's opening tag
    kStart,      // llama3_json: the answer's start, where a call list may begin
    kAfterTag,   // llama3_json: after <|python_tag|>, before the first object
    kBlock,      // hermes: inside <tool_call>, waiting for </tool_call>
    kArrayOpen,  // mistral: after [TOOL_CALLS], before '['
    kElement,    // mistral: before an element's '{'
    kObject,     // llama3_json, mistral: inside a call's object
    kAfterCall,  // after a call's object: a separator, the end, or not a call after all
    kPlain,      // llama3_json: the answer is text; everything is content
  };
  void run(bool at_end, AnswerDelta& out);
  // Content through the whitespace rule: a stretch next to calls that is only whitespace is
  // held, and dropped when a call or the end (after a call) comes.
  void emit_content(std::string_view text, AnswerDelta& out);
  void emit_call(std::string name, std::string arguments, AnswerDelta& out);
  // The held region (from region_) up to `to` turns out to be content; continue in `next`.
  void give_up(std::size_t to, State next, AnswerDelta& out);
  void release_utf8(AnswerDelta& out, bool at_end);

  ToolCallFormat format_;
  ToolCallIds ids_;
  State state_;
  std::string text_;               // everything pushed
  std::size_t pos_ = 0;            // bytes of text_ decided
  std::size_t region_ = 0;         // where the held text that may be a call started
  std::size_t body_ = 0;           // the block's (hermes) or the object's JSON starts here
  std::size_t search_ = 0;         // hermes: where to look for </tool_call> next
  std::uint32_t calls_ = 0;        // calls given out so far
  std::uint32_t depth_ = 0;        // the object scan: braces and brackets open
  bool in_string_ = false;         // ... inside a string
  bool escaped_ = false;           // ... after a backslash in one
  bool segment_has_text_ = false;  // the stretch since the last call has more than whitespace
  std::string blank_;              // that stretch's whitespace, held
  std::string partial_utf8_;       // content's incomplete last character, held
};

// The tools a request offers, as the grammar of their calls needs them: name and
// parameters_json (a JSON Schema, an object's; "{}" when the tool gave none).
using ToolSpec = grammar::ToolSchema;

// How a family spells calls, as its chat template teaches them, for the grammar: the calls are
// open + CALL + (between + CALL)* + close, where CALL is {"name": NAME, "<arguments_key>":
// ARGS} (grammar::ToolCallsSpec's language).
//   hermes:      <tool_call>\n{...}\n</tool_call>\n<tool_call>\n{...}\n</tool_call>
//   llama3_json: {"name": ..., "parameters": {...}}; {...}
//   mistral:     [TOOL_CALLS][{...}, {...}]
struct ToolCallSyntax {
  std::string open;           // "<tool_call>\n", "", "[TOOL_CALLS]["
  std::string close;          // "\n</tool_call>", "", "]"
  std::string between;        // "\n</tool_call>\n<tool_call>\n", "; ", ", "
  std::string arguments_key;  // "arguments", "parameters", "arguments"
  // The text that opens the first call, by which tool_choice auto starts the constraint (it is
  // `open`: the grammar then starts after it, ToolCallsSpec::after_open); empty: the family
  // has none (llama3_json), so auto is unconstrained.
  std::string trigger;
};
ToolCallSyntax syntax_of(ToolCallFormat format);

// The constraint's spec for a request's calls in `format`: at least one call of `tools`, any
// number when `parallel` (parallel_tool_calls), else exactly one; `after_open`: the grammar
// starts after the family's open text (tool_choice auto, once the model wrote it).
grammar::ToolCallsSpec tool_calls_spec(ToolCallFormat format, std::vector<ToolSpec> tools,
                                       bool parallel, bool after_open);

}  // namespace kvvm::server
