#include "tool_fields.h"

#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <utility>

#include "field_values.h"
#include "openai_response.h"

namespace kvvm::server {
namespace {

using nlohmann::json;

bool valid_name(const std::string& name) {
  if (name.empty() || name.size() > 64) return false;
  for (const char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '_' || c == '-';
    if (!ok) return false;
  }
  return true;
}

// One entry of tools: {type: "function", function: {name, description, parameters, strict}}.
Check read_tool(const json& tool, const std::string& param, std::set<std::string>* names,
                ToolSpec* spec) {
  if (!tool.is_object()) return bad_field(param, wrong_type(tool, "an object"));
  const auto type = tool.find("type");
  if (type == tool.end() || !type->is_string() || *type != "function") {
    return bad_field(param + ".type", type == tool.end()
                                          ? std::string("is required; send \"function\"")
                                          : wrong_type(*type, "\"function\""));
  }
  const auto function = tool.find("function");
  if (function == tool.end() || !function->is_object()) {
    return bad_field(param + ".function", function == tool.end()
                                              ? std::string("is required")
                                              : wrong_type(*function, "an object"));
  }
  const auto name = function->find("name");
  if (name == function->end() || !name->is_string()) {
    return bad_field(param + ".function.name", name == function->end()
                                                   ? std::string("is required")
                                                   : wrong_type(*name, "a string"));
  }
  spec->name = name->get<std::string>();
  if (!valid_name(spec->name)) {
    return bad_field(param + ".function.name",
                     shown(*name) + " must be 1 to 64 letters, digits, underscores or dashes");
  }
  if (!names->insert(spec->name).second) {
    return bad_field(param + ".function.name", shown(*name) + " names two tools");
  }
  const auto description = function->find("description");
  if (description != function->end() && !description->is_string() && !description->is_null()) {
    return bad_field(param + ".function.description", wrong_type(*description, "a string"));
  }
  const auto parameters = function->find("parameters");
  if (parameters == function->end() || parameters->is_null()) {
    spec->parameters_json = "{}";
  } else if (!parameters->is_object()) {
    return bad_field(param + ".function.parameters",
                     wrong_type(*parameters, "an object (a JSON Schema)"));
  } else {
    spec->parameters_json = dump_json(*parameters);
  }
  const auto strict = function->find("strict");
  if (strict != function->end() && !strict->is_boolean() && !strict->is_null()) {
    return bad_field(param + ".function.strict", wrong_type(*strict, "a boolean"));
  }
  return std::nullopt;
}

}  // namespace

std::variant<ToolRequest, ApiError> read_tool_request(const RequestBody& body) {
  ToolRequest request;
  request.parallel = body.parallel_tool_calls;
  std::vector<ToolSpec> all;
  std::set<std::string> names;
  if (body.tools != nullptr) {
    for (std::size_t i = 0; i < body.tools->size(); ++i) {
      ToolSpec spec;
      if (Check error =
              read_tool((*body.tools)[i], "tools[" + std::to_string(i) + "]", &names, &spec)) {
        return *error;
      }
      all.push_back(std::move(spec));
    }
    if (!all.empty()) request.tools_json = dump_json(*body.tools);
  }
  // OpenAI's default: auto with tools, none without.
  request.choice = all.empty() ? ToolRequest::Choice::kNone : ToolRequest::Choice::kAuto;
  if (body.tool_choice != nullptr) {
    const json& choice = *body.tool_choice;
    if (choice.is_string()) {
      const std::string& word = choice.get_ref<const std::string&>();
      if (word == "none") {
        request.choice = ToolRequest::Choice::kNone;
      } else if (word == "auto") {
        request.choice = all.empty() ? ToolRequest::Choice::kNone : ToolRequest::Choice::kAuto;
      } else if (word == "required") {
        if (all.empty()) {
          return bad_field("tool_choice", "\"required\" needs tools to call; send tools");
        }
        request.choice = ToolRequest::Choice::kRequired;
      } else {
        return bad_field("tool_choice", shown(choice) +
                                            " is not a choice; send \"none\", \"auto\", "
                                            "\"required\" or {\"type\": \"function\", "
                                            "\"function\": {\"name\": ...}}");
      }
    } else {
      const auto type = choice.find("type");
      const auto function = choice.find("function");
      const bool shaped = type != choice.end() && *type == "function" && function != choice.end() &&
                          function->is_object() && function->contains("name") &&
                          (*function)["name"].is_string();
      if (!shaped) {
        return bad_field("tool_choice", shown(choice) +
                                            " is not a named function; send {\"type\": "
                                            "\"function\", \"function\": {\"name\": ...}}");
      }
      request.named = (*function)["name"].get<std::string>();
      if (all.empty()) {
        return bad_field("tool_choice.function.name",
                         "\"" + request.named + "\" names a function but the request has no tools");
      }
      if (!names.contains(request.named)) {
        return bad_field("tool_choice.function.name",
                         "\"" + request.named + "\" is not among the tools' functions");
      }
      request.choice = ToolRequest::Choice::kNamed;
    }
  }
  for (ToolSpec& spec : all) {
    if (request.choice == ToolRequest::Choice::kNamed && spec.name != request.named) continue;
    request.callable.push_back(std::move(spec));
  }
  return request;
}

Check settle_tool_calls(const ToolRequest& tools, const ParseContext& context,
                        ApiRequest* request) {
  if (!tools.calls()) return std::nullopt;
  if (!context.tool_call_format) {
    return bad_field("tools",
                     "this model's chat template shows no tool-call format kvvm knows; start the "
                     "server with --tool-call-parser hermes|llama3_json|mistral, or send "
                     "tool_choice \"none\"");
  }
  if (request->constraint) {
    return bad_field("tool_choice", "calling tools cannot be combined with " +
                                        request->constraint->field +
                                        " (an answer is either the calls or that output); send "
                                        "tool_choice \"none\" or drop " +
                                        request->constraint->field);
  }
  const ToolCallFormat format = *context.tool_call_format;
  request->parsing.tool_calls = format;
  // Mistral opens its calls with a special token: the text must keep it (as vLLM does).
  if (format == ToolCallFormat::kMistral) request->engine.skip_special_tokens = false;
  const ToolCallSyntax syntax = syntax_of(format);
  const bool automatic = tools.choice == ToolRequest::Choice::kAuto;
  if (automatic && syntax.trigger.empty()) return std::nullopt;  // read, not constrained
  grammar::Constraint constraint;
  constraint.kind = grammar::Constraint::Kind::kToolCalls;
  constraint.tool_calls = tool_calls_spec(format, tools.callable, tools.parallel, automatic);
  request->constraint = ConstraintRequest{std::move(constraint), "tools"};
  // The grammar of auto starts where `open` ends: the model has opened a call.
  if (automatic) request->engine.grammar_trigger = syntax.open;
  return std::nullopt;
}

}  // namespace kvvm::server
