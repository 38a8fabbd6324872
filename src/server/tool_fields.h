// A chat request's tools, read together: `tools` (what the template shows the model),
// `tool_choice` (none / auto / required / one named function) and `parallel_tool_calls`, as
// OpenAI's API takes them. What a call must look like follows from the choice: none is no call,
// auto lets the model decide (the call, once opened, must parse), required and a named function
// make one (or, with parallel calls, several) calls the only answer.
#pragma once

#include <cstdint>
#include <string>
#include <variant>
#include <vector>

#include "api_error.h"
#include "field_values.h"
#include "openai_request.h"
#include "request_fields.h"
#include "tool_call_parser.h"

namespace kvvm::server {

struct ToolRequest {
  enum class Choice : std::uint8_t { kNone, kAuto, kRequired, kNamed };
  Choice choice = Choice::kNone;
  std::string named;     // kNamed: the function
  bool parallel = true;  // parallel_tool_calls
  // The functions a call may name (a named choice: that one), with their parameters' schemas.
  std::vector<ToolSpec> callable;
  // tools as the body sent them (JSON text), for the template; empty when there are none.
  std::string tools_json;
  bool calls() const { return choice != Choice::kNone && !callable.empty(); }
};

// Reads tools, tool_choice and parallel_tool_calls of `body` (each already type-checked by the
// table). A 400 names the field: a tool that is not {type: "function", function: {name,
// description?, parameters?, strict?}}, a name OpenAI would refuse (not 1-64 of [a-zA-Z0-9_-])
// or given twice, parameters that are not an object, tool_choice required or named without
// tools, a named function that is not among them, an unknown choice.
std::variant<ToolRequest, ApiError> read_tool_request(const RequestBody& body);

// What `tools` asks of the answer: with calls allowed, the answer is read for them in the
// context's format (a 400 naming tools when the server knows none), and constrained by the
// grammar engine: required or named, the whole answer is the calls (one, or any number with
// parallel_tool_calls); auto, the call once the model opens it (EngineRequest::grammar_trigger),
// where the format has an opening text. A request that also asks for a constraint of its own
// (response_format, guided_*) is a 400: an answer cannot be both.
Check settle_tool_calls(const ToolRequest& tools, const ParseContext& context, ApiRequest* request);

}  // namespace kvvm::server
