// Template: the Jinja subset Hugging Face chat templates are written in, parsed once and rendered
// many times (a chat request renders its checkpoint's template on every call).
//
// Rendered as transformers renders chat templates (an ImmutableSandboxedEnvironment with
// trim_blocks and lstrip_blocks, the loop controls, tojson as json.dumps with
// ensure_ascii=False), so that a template prints the same bytes here as there.
//
// Sandboxed: a template reads only the data it is given (no attribute beyond a value's data and
// the string, list and dict methods templates call), and a render is bounded in steps, nesting
// and output (TemplateLimits): a hostile or broken template ends with an error, never a hang or
// a crash. Errors are InvalidArgument "NAME:LINE:COLUMN: what" (parse and render alike; a
// raise_exception() call's message is kept), ResourceExhausted "NAME:LINE:COLUMN: ... exceeds
// BOUND (LIMIT)" naming the bound a render ran into, its Exhaustion holding what was asked for
// (requested) and the limit, in the bound's unit (steps, levels, bytes).
//
// Not there, as no chat template needs them and transformers gives templates no loader:
// extends/block/include/import, {% do %}, autoescaping (escape returns a plain string), and
// the printed form of Python's lazy objects (range(), dict.items() and map/select results
// print as the lists they hold).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "kvvm/base/status.h"

namespace kvvm::jinja {

struct TemplateLimits {
  // Loop iterations, calls and output writes together; work on large values counts in
  // proportion (a step per list item, per 16 bytes of a string copied or scanned).
  std::uint64_t max_steps = 10'000'000;
  std::uint32_t max_depth = 256;  // nested calls (macros, recursion) and expressions
  std::size_t max_output_bytes = std::size_t{64} << 20;  // the output, and any one value built
};

struct TemplateOptions {
  // As transformers sets them for chat templates.
  bool trim_blocks = true;
  bool lstrip_blocks = true;
  bool keep_trailing_newline = false;
  TemplateLimits limits;
};

// What a render asks of its host.
struct RenderHooks {
  // strftime_now(format): the local time formatted; nullptr: the system clock.
  std::function<std::string(std::string_view format)> strftime_now;
};

class Template {
 public:
  // Parses `source`; `name` prefixes every error ("chat_template:3:14: ...").
  static Result<Template> parse(std::string_view source, std::string_view name = "template",
                                const TemplateOptions& options = {});

  // Renders with `context_json`, a JSON object whose members are the template's variables
  // (messages, tools, add_generation_prompt, bos_token, ...). Globals the template may call:
  // raise_exception(message), strftime_now(format), range, namespace, dict.
  Result<std::string> render(std::string_view context_json, const RenderHooks& hooks = {}) const;

  const std::string& name() const;
  const std::string& source() const;

  Template(Template&&) noexcept;
  Template& operator=(Template&&) noexcept;
  Template(const Template&);
  Template& operator=(const Template&);
  ~Template();

 private:
  struct Parsed;
  explicit Template(std::shared_ptr<const Parsed> parsed);
  std::shared_ptr<const Parsed> parsed_;  // immutable: renders from many threads share it
};

}  // namespace kvvm::jinja
