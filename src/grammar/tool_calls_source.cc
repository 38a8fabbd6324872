// Tool calls compiled to a Grammar: open CALL (between CALL){min-1,max-1} close, CALL being
// {"name": "<a tool's name>", "<arguments_key>": <that tool's parameters>}.
//
// Each tool's parameters compile alone through the JSON Schema front end (so that its $refs
// resolve against its own root, and its refusal names the tool), and their rules are copied
// into the calls' grammar. The envelope's keys are literals in a fixed order, name first, as
// every family's template writes them and as the parsers read the name before the arguments.
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "grammar/builder.h"
#include "grammar/json_values.h"
#include "grammar/text.h"
#include "kvvm/grammar/constraint.h"

namespace kvvm::grammar {
namespace {

// `part`'s rules added to `into` under `prefix`, its root's id returned.
RuleId embed(Grammar& into, const Grammar& part, std::string_view prefix) {
  std::vector<RuleId> ids(part.rules().size());
  for (std::size_t r = 0; r < ids.size(); ++r) {
    ids[r] = into.declare(concat(prefix, part.name(static_cast<RuleId>(r))));
  }
  for (std::size_t r = 0; r < ids.size(); ++r) {
    std::vector<Sequence> alternatives = part.rules()[r].alternatives;
    for (Sequence& alternative : alternatives) {
      for (Element& e : alternative) {
        e.index =
            e.kind == Element::Kind::kBytes ? into.intern(part.byte_sets()[e.index]) : ids[e.index];
      }
    }
    into.define(ids[r], std::move(alternatives));
  }
  return ids[part.root()];
}

// Whether a tool's parameters leave its arguments open: no schema, or the empty one.
bool any_arguments(std::string_view parameters_json) {
  if (parameters_json.find_first_not_of(" \t\r\n") == std::string_view::npos) return true;
  const nlohmann::json schema = nlohmann::json::parse(parameters_json, nullptr, false);
  return schema.is_object() && schema.empty();
}

}  // namespace

Result<Grammar> grammar_from_tool_calls(const ToolCallsSpec& spec,
                                        const JsonSchemaOptions& options) {
  if (spec.tools.empty()) return Status::InvalidArgument("tools: an empty list; give at least one");
  if (spec.min_calls == 0)
    return Status::InvalidArgument("tool calls: min_calls must be 1 or more");
  if (spec.max_calls != 0 && spec.max_calls < spec.min_calls) {
    return Status::InvalidArgument(
        concat("tool calls: max_calls ", spec.max_calls, " is below min_calls ", spec.min_calls));
  }
  std::set<std::string_view> names;
  for (std::size_t i = 0; i < spec.tools.size(); ++i) {
    const std::string& name = spec.tools[i].name;
    if (name.empty()) return Status::InvalidArgument(concat("tools[", i, "].function.name: empty"));
    if (!names.insert(name).second) {
      return Status::InvalidArgument(
          concat("tools[", i, "].function.name: \"", name, "\" is named by an earlier tool too"));
    }
  }

  const GrammarLimits& limits = options.limits;
  Grammar grammar;
  Builder b(grammar, limits);
  JsonValues json(b, spec.whitespace);
  const JsonSchemaOptions parameter_options{
      .whitespace = spec.whitespace, .strict = options.strict, .limits = limits};
  const std::string key = nlohmann::json(spec.arguments_key).dump();

  // After `{"name": `, one alternative a tool: its name, then its arguments.
  std::vector<Sequence> named;
  for (std::size_t i = 0; i < spec.tools.size(); ++i) {
    const ToolSchema& tool = spec.tools[i];
    Sequence arguments;
    if (any_arguments(tool.parameters_json)) {
      arguments = json.object();
    } else {
      Result<Grammar> parameters =
          grammar_from_json_schema(tool.parameters_json, parameter_options);
      if (!parameters.ok()) {
        return parameters.status().with_context(
            concat("tools[", i, "] (", tool.name, ").function.parameters"));
      }
      arguments = b.ref(embed(grammar, *parameters, concat("tools[", i, "].")));
    }
    Sequence alternative = b.literal(
        nlohmann::json(tool.name).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
    for (const Sequence& part : {json.ws(), b.literal(","), json.ws(), b.literal(key), json.ws(),
                                 b.literal(":"), json.ws(), arguments}) {
      Builder::append(alternative, part);
    }
    named.push_back(std::move(alternative));
    KVVM_RETURN_IF_ERROR(b.check_size(concat("tools[", i, "]")));
  }
  Sequence call = Builder::cat(
      {b.literal("{"), json.ws(), b.literal("\"name\""), json.ws(), b.literal(":"), json.ws()});
  Builder::append(call, b.any_of("tool", std::move(named)));
  Builder::append(call, Builder::cat({json.ws(), b.literal("}")}));
  const RuleId call_rule = grammar.add("call", {call});

  Result<Sequence> calls = b.separated(
      "calls", b.ref(call_rule), b.literal(spec.between), spec.min_calls,
      spec.max_calls == 0 ? std::nullopt : std::optional<std::uint64_t>(spec.max_calls));
  if (!calls.ok()) return calls.status();
  Sequence root = spec.after_open ? Sequence{} : b.literal(spec.open);
  Builder::append(root, *calls);
  Builder::append(root, b.literal(spec.close));
  grammar.set_root(grammar.add("tool-calls", {root}));
  KVVM_RETURN_IF_ERROR(grammar.check(limits));
  return grammar;
}

}  // namespace kvvm::grammar
