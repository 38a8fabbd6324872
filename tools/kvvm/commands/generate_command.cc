#include "commands/generate_command.h"

#include <CLI/CLI.hpp>
#include <chrono>
#include <fstream>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <ostream>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/format.h"
#include "kit/cli_common.h"
#include "kit/kv_dtype_flag.h"
#include "kit/model_loading.h"
#include "kit/speculative_flag.h"
#include "kvvm/engine/engine.h"
#include "kvvm/engine/generate.h"
#include "kvvm/engine/kv_space.h"
#include "kvvm/grammar/constraint.h"
#include "kvvm/grammar/grammar_cache.h"
#include "kvvm/grammar/vocabulary.h"
#include "kvvm/model/config.h"
#include "kvvm/model/model.h"
#include "kvvm/tokenizer/chat_renderer.h"
#include "kvvm/tokenizer/tokenizer.h"

namespace kvvm::cli {
namespace {

constexpr const char* kGenerate = "kvvm generate";
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// "1,2,3" as token ids below the vocabulary.
Result<std::vector<std::int32_t>> parse_ids(const std::string& text, std::uint32_t vocab) {
  std::vector<std::int32_t> ids;
  std::size_t from = 0;
  while (from <= text.size()) {
    const std::size_t comma = std::min(text.find(',', from), text.size());
    Result<std::uint64_t> id =
        parse_count(std::string_view(text).substr(from, comma - from), 0, vocab - 1);
    if (!id.ok())
      return id.status().with_context("--prompt-ids (the vocabulary has " + std::to_string(vocab) +
                                      " tokens)");
    ids.push_back(static_cast<std::int32_t>(*id));
    from = comma + 1;
  }
  return ids;
}

Result<std::vector<std::int32_t>> prompt_tokens(const GenerateOptions& options,
                                                const model::ModelConfig& config,
                                                const tokenizer::Tokenizer& tok) {
  std::vector<std::int32_t> ids;
  if (options.prompt_ids) {
    KVVM_ASSIGN_OR_RETURN(std::vector<std::int32_t> parsed,
                          parse_ids(*options.prompt_ids, config.vocab_size));
    ids = std::move(parsed);
  } else if (options.prompt) {
    ids = tok.encode(*options.prompt, /*add_special_tokens=*/true);
  } else if (options.chat) {
    Result<tokenizer::ChatRenderer> renderer =
        tokenizer::ChatRenderer::load(options.model_dir, options.chat_template);
    if (!renderer.ok()) return renderer.status().with_context("--chat");
    nlohmann::json messages = nlohmann::json::array();
    if (options.system) messages.push_back({{"role", "system"}, {"content", *options.system}});
    messages.push_back({{"role", "user"}, {"content", *options.chat}});
    tokenizer::ChatInput input;
    input.messages_json = messages.dump();
    Result<std::string> text = renderer->render(input);
    if (!text.ok()) return text.status().with_context("--chat");
    // The template spells the special tokens out: adding them again would double the BOS.
    ids = tok.encode(*text, /*add_special_tokens=*/false);
  } else {
    return Status::InvalidArgument("one of --prompt or --chat is required");
  }
  if (ids.empty()) return Status::InvalidArgument("the prompt encodes to no tokens");
  return ids;
}

// The length of the well-formed UTF-8 sequence at text[i] (RFC 3629: no overlong form, no
// surrogate, nothing past U+10FFFF), or 0.
std::size_t utf8_sequence(std::string_view text, std::size_t i) {
  const auto byte = [&](std::size_t k) { return static_cast<unsigned char>(text[k]); };
  const unsigned char lead = byte(i);
  if (lead < 0x80) return 1;
  std::size_t length = 0;
  unsigned char low = 0x80, high = 0xBF;  // the second byte's range
  if (lead >= 0xC2 && lead <= 0xDF) {
    length = 2;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    length = 3;
    if (lead == 0xE0) low = 0xA0;
    if (lead == 0xED) high = 0x9F;
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    length = 4;
    if (lead == 0xF0) low = 0x90;
    if (lead == 0xF4) high = 0x8F;
  } else {
    return 0;
  }
  if (i + length > text.size() || byte(i + 1) < low || byte(i + 1) > high) return 0;
  for (std::size_t k = 2; k < length; ++k) {
    if (byte(i + k) < 0x80 || byte(i + k) > 0xBF) return 0;
  }
  return length;
}

// A model may emit bytes that are no UTF-8 (a random one does): each such byte becomes U+FFFD,
// in the stream and in the JSON alike, so both show the same text (JSON cannot hold the
// bytes). Byte by byte, so cleaning the pieces equals cleaning their concatenation.
std::string clean_utf8(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (std::size_t i = 0; i < text.size();) {
    const std::size_t length = utf8_sequence(text, i);
    if (length == 0) {
      out += "\xEF\xBF\xBD";
      ++i;
    } else {
      out.append(text.substr(i, length));
      i += length;
    }
  }
  return out;
}

// A constraint's file, whole; NotFound naming the flag and the path.
Result<std::string> read_constraint_file(const std::string& flag, const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) return Status::NotFound(flag + " " + path + ": cannot open the file");
  std::ostringstream text;
  text << file.rdbuf();
  if (!file.good() && !file.eof()) return Status::NotFound(flag + " " + path + ": cannot read it");
  return text.str();
}

// The flag's constraint (CLI11 lets one through at most); nullopt when none was given. What it
// refuses names the flag (and the file).
Result<std::optional<std::pair<std::string, grammar::Constraint>>> constraint_of(
    const GenerateOptions& options) {
  using Kind = grammar::Constraint::Kind;
  grammar::Constraint constraint;
  constraint.whitespace.flexible = options.json_whitespace == "flexible";
  std::string flag;
  if (options.json_schema_file) {
    flag = "--json-schema " + *options.json_schema_file;
    constraint.kind = Kind::kJsonSchema;
    KVVM_ASSIGN_OR_RETURN(constraint.text,
                          read_constraint_file("--json-schema", *options.json_schema_file));
  } else if (options.json_object) {
    flag = "--json-object";
    constraint.kind = Kind::kJsonObject;
  } else if (options.regex) {
    flag = "--regex";
    constraint.kind = Kind::kRegex;
    constraint.text = *options.regex;
  } else if (options.grammar_file) {
    flag = "--grammar " + *options.grammar_file;
    constraint.kind = Kind::kGbnf;
    KVVM_ASSIGN_OR_RETURN(constraint.text,
                          read_constraint_file("--grammar", *options.grammar_file));
  } else if (!options.choices.empty()) {
    flag = "--choice";
    constraint.kind = Kind::kChoices;
    constraint.choices = options.choices;
  } else {
    return std::optional<std::pair<std::string, grammar::Constraint>>();
  }
  return std::optional(std::pair(flag, std::move(constraint)));
}

const char* finish_name(engine::FinishReason reason) {
  return reason == engine::FinishReason::kStop ? "stop" : "length";
}

}  // namespace

CLI::App* add_generate_command(CLI::App& app, GenerateOptions& options) {
  CLI::App* cmd = app.add_subcommand(
      "generate",
      "Generate text from a prompt with a Hugging Face checkpoint (Llama, Qwen2 or Mistral "
      "family: config.json, tokenizer.json, model.safetensors), its KV cache in a kvvm arena. "
      "The text streams to stdout as tokens arrive; notes go to stderr.");
  cmd->add_option("--model", options.model_dir,
                  "Checkpoint directory: config.json, tokenizer.json, model.safetensors (or "
                  "model.safetensors.index.json and its shards); tokenizer_config.json for --chat")
      ->required();
  CLI::Option* prompt = cmd->add_option(
      "--prompt", options.prompt,
      "Raw prompt text, encoded as transformers' encode() does (with the tokenizer's special "
      "tokens, a BOS say)");
  CLI::Option* chat = cmd->add_option(
      "--chat", options.chat,
      "A user message, rendered through the model's chat template with the assistant's "
      "header appended; one of --prompt or --chat is required");
  CLI::Option* ids = cmd->add_option(
      "--prompt-ids", options.prompt_ids,
      "Exact prompt token ids, comma-separated, instead of --prompt or --chat (parity checks, "
      "benchmarks on checkpoints without a real tokenizer)");
  prompt->excludes(chat)->excludes(ids);
  chat->excludes(ids);
  cmd->add_option("--system", options.system, "A system message before the --chat message")
      ->needs(chat);
  cmd->add_option("--chat-template", options.chat_template,
                  "The chat template: a Jinja file (rendered as transformers renders it), or a "
                  "built-in one: chatml, llama3, qwen3 (default: the model's own, from "
                  "chat_template.jinja or tokenizer_config.json; a built-in its tokens identify "
                  "when it ships none)")
      ->needs(chat);
  cmd->add_option("--max-tokens", options.max_tokens,
                  "Tokens to generate at most; generation also stops at the config's end tokens "
                  "(default 128, cut to what the context leaves)")
      ->transform(count_validator(0, std::numeric_limits<std::uint32_t>::max()));
  cmd->add_option("--temperature", options.temperature,
                  "Sampling temperature; 0 is greedy, the most likely token (default 0)")
      ->transform(number_validator(0, 1000));
  cmd->add_option("--top-k", options.top_k,
                  "Sample among the K most likely tokens only; 0: no limit (default 0)")
      ->transform(count_validator(0, std::numeric_limits<std::uint32_t>::max()));
  cmd->add_option("--top-p", options.top_p,
                  "Sample among the fewest most likely tokens whose probability reaches P, in "
                  "(0, 1] (default 1: all)")
      ->transform(number_validator(0, 1, /*min_exclusive=*/true));
  cmd->add_option("--min-p", options.min_p,
                  "Drop tokens less likely than P times the most likely one, before --top-k "
                  "and --top-p (vLLM's order), in [0, 1] (default 0: off)")
      ->transform(number_validator(0, 1));
  cmd->add_option("--seed", options.seed,
                  "Seed of the sampler: the same seed, the same tokens (default 0)")
      ->transform(count_validator(0, std::numeric_limits<std::uint64_t>::max()));
  cmd->add_option("--backend", options.backend,
                  "auto, cpu or cuda (default auto: cuda when a GPU is usable, else cpu)")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  cmd->add_option("--layout", options.layout,
                  "KV layout of the arena: token-major, seq-major or head-major (default "
                  "token-major)");
  cmd->add_option("--max-context", options.max_context,
                  "Tokens the sequence may hold, prompt included (default: the config's "
                  "max_position_embeddings)")
      ->transform(count_validator(1, std::numeric_limits<std::uint32_t>::max()));
  cmd->add_flag("--ignore-eos", options.ignore_eos,
                "Do not stop at the model's end tokens: generate exactly --max-tokens tokens "
                "(for benchmarks)");
  cmd->add_flag("--no-graphs", options.no_graphs,
                "Do not replay CUDA graphs for decode steps (the CUDA backend captures them by "
                "default; the same tokens either way, only slower without)");
  add_speculative_flag(*cmd, options.speculative_config);
  add_weight_flags(*cmd, options.weights);
  add_kv_dtype_flag(*cmd, options.kv_dtype);
  add_kv_scales_flag(*cmd, options.kv_scales);
  CLI::Option* schema = cmd->add_option(
      "--json-schema", options.json_schema_file,
      "Constrain the text to JSON matching the JSON Schema in FILE (as response_format "
      "json_schema; a keyword kvvm cannot enforce is refused by name)");
  CLI::Option* object =
      cmd->add_flag("--json-object", options.json_object, "Constrain the text to any JSON object");
  CLI::Option* regex = cmd->add_option(
      "--regex", options.regex,
      "Constrain the text to match the regular expression R whole (ECMAScript syntax, as JSON "
      "Schema patterns)");
  CLI::Option* grammar = cmd->add_option(
      "--grammar", options.grammar_file,
      "Constrain the text to the GBNF grammar in FILE (llama.cpp's syntax; root is the start)");
  CLI::Option* choice = cmd->add_option(
      "--choice", options.choices,
      "Constrain the text to exactly one of A,B,... (comma-separated, or the flag repeated)");
  choice->delimiter(',');
  const std::vector<CLI::Option*> constraints = {schema, object, regex, grammar, choice};
  for (std::size_t i = 0; i < constraints.size(); ++i) {
    for (std::size_t j = i + 1; j < constraints.size(); ++j)
      constraints[i]->excludes(constraints[j]);
  }
  cmd->add_option("--json-whitespace", options.json_whitespace,
                  "Whitespace --json-schema and --json-object allow between JSON tokens: compact "
                  "(none, the default) or flexible (spaces and newlines, at most 16 in a row)")
      ->check(CLI::IsMember({"compact", "flexible"}));
  cmd->add_flag("--json", options.json,
                "Print one JSON object at the end instead of streaming: prompt_ids, token_ids, "
                "text, finish_reason (stop: an end token; length: --max-tokens), backend, "
                "kv_dtype, timings (load_seconds, prefill_seconds, decode_seconds, "
                "decode_steps, decode_tokens (after the first), tokens_per_second = decode tokens "
                "per second), and with --speculative-config the tokens proposed and kept");
  return cmd;
}

int run_generate(const GenerateOptions& options, std::ostream& out, std::ostream& err) {
  const auto fail = [&err](const Status& status) {
    err << kGenerate << ": " << status.to_string() << "\n";
    return exit_code(status);
  };
  if (!options.prompt && !options.chat && !options.prompt_ids) {
    return fail(Status::InvalidArgument("one of --prompt or --chat is required"));
  }
  Result<Layout> layout = parse_layout(options.layout);
  if (!layout.ok()) return fail(layout.status().with_context("--layout"));

  // The constraint's files before the model: a mistyped path is heard at once.
  Result<std::optional<std::pair<std::string, grammar::Constraint>>> constraint =
      constraint_of(options);
  if (!constraint.ok()) return fail(constraint.status());

  const Clock::time_point load_start = Clock::now();
  Result<LoadedModel> loaded =
      load_model(options.model_dir, options.backend, kGenerate, err, options.weights);
  if (!loaded.ok()) return fail(loaded.status());
  const model::ModelConfig& config = loaded->config;
  model::Model& model = *loaded->model;
  const tokenizer::Tokenizer& tok = *loaded->tokenizer;
  if (Status checked = check_kv_dtype(options.kv_dtype, model, config); !checked.ok()) {
    return fail(checked);
  }

  engine::KvSpaceOptions kv_options;
  kv_options.backend = model.backend();
  kv_options.kv_dtype = options.kv_dtype;
  kv_options.layout = *layout;
  kv_options.sequences = 1;  // the space adds the decode graphs' padding slot
  kv_options.max_context = options.max_context;
  kv_options.driver = loaded->driver.get();
  kv_options.governor = loaded->governor.get();
  Result<std::unique_ptr<engine::KvSpace>> kv = engine::KvSpace::create(config, kv_options);
  if (!kv.ok()) return fail(kv.status());
  const DType kv_dtype = (*kv)->options().kv_dtype;  // the default resolved
  if (Status applied = apply_kv_scales(options.kv_scales, kv_dtype, model); !applied.ok()) {
    return fail(applied);
  }
  const double load_seconds = seconds_since(load_start);

  Result<std::vector<std::int32_t>> prompt = prompt_tokens(options, config, tok);
  if (!prompt.ok()) return fail(prompt.status());

  engine::GenerateRequest request;
  request.prompt = *prompt;
  if (!options.ignore_eos) request.stop_ids = config.eos_token_ids;
  if (*constraint) {
    // Compiled against this model's vocabulary; the grammar allows the end tokens only where
    // it accepts (none with --ignore-eos: the text then runs to --max-tokens).
    const auto& [flag, wanted] = **constraint;
    Result<std::shared_ptr<const grammar::Vocabulary>> vocabulary =
        grammar::Vocabulary::from_tokenizer(tok, request.stop_ids);
    if (!vocabulary.ok()) return fail(vocabulary.status().with_context(flag));
    grammar::GrammarCache compiler(std::move(vocabulary).value());
    Result<std::shared_ptr<const grammar::CompiledGrammar>> compiled = compiler.get(wanted);
    if (!compiled.ok()) return fail(compiled.status().with_context(flag));
    request.grammar = std::move(compiled).value();
  }
  request.sampling.temperature = static_cast<float>(options.temperature);
  request.sampling.top_k = static_cast<std::uint32_t>(options.top_k);
  request.sampling.top_p = static_cast<float>(options.top_p);
  request.sampling.min_p = static_cast<float>(options.min_p);
  request.sampling.seed = options.seed;
  request.graphs = !options.no_graphs;
  const std::uint64_t context = engine::request_limits(model, **kv).context;
  // Declared before the engine runs, after the target's space: they go first.
  LoadedDraft draft;
  if (!options.speculative_config.empty()) {
    Result<engine::SpeculativeOptions> speculative =
        engine::parse_speculative_config(options.speculative_config);
    if (!speculative.ok()) return fail(speculative.status());
    request.speculative = *speculative;
    Result<LoadedDraft> loaded_draft = load_draft(*speculative, *loaded, **kv, kGenerate, err);
    if (!loaded_draft.ok()) return fail(loaded_draft.status());
    draft = std::move(loaded_draft).value();
    request.draft = draft.lent();
  }
  if (options.max_tokens) {
    request.max_tokens = static_cast<std::uint32_t>(*options.max_tokens);
  } else {
    request.max_tokens = kDefaultMaxTokens;
    if (request.prompt.size() < context && request.prompt.size() + kDefaultMaxTokens > context) {
      request.max_tokens = static_cast<std::uint32_t>(context - request.prompt.size());
      err << kGenerate << ": note: generating at most " << request.max_tokens
          << " tokens, what the context of " << context << " tokens leaves after the prompt\n";
    }
  }
  err << kGenerate << ": " << config.architecture << " (" << config.layers << " layers, vocab "
      << config.vocab_size << ") on " << model::to_string(model.backend()) << ", "
      << to_string(kv_dtype) << " KV, loaded in " << format_duration(load_seconds) << "; prompt of "
      << request.prompt.size() << " tokens\n";
  print_kv_scales(kv_dtype, model, kGenerate, err);

  tokenizer::StreamDecoder decoder(tok);
  const auto on_token = [&](std::int32_t token) {
    if (options.json) return true;
    out << clean_utf8(decoder.push(token)) << std::flush;
    return out.good();  // a closed stdout ends generation; run_cli reports it
  };
  Result<engine::GenerateResult> result = engine::generate(model, **kv, request, on_token);
  if (!result.ok()) {
    if (!options.json) out << clean_utf8(decoder.finish()) << std::endl;
    return fail(result.status().code() == StatusCode::kInvalidArgument
                    ? result.status().with_context("see --max-tokens and --max-context")
                    : result.status());
  }
  const engine::GenerateTimings& t = result->timings;
  const model::ExpertCacheStats cache = model.weight_stats().experts;
  const double tokens_per_second = t.decode_seconds > 0 ? t.decode_tokens / t.decode_seconds : 0;
  if (options.json) {
    nlohmann::ordered_json json;
    json["prompt_ids"] = request.prompt;
    json["token_ids"] = result->tokens;
    json["text"] = clean_utf8(tok.decode(result->tokens));
    json["finish_reason"] = finish_name(result->finish);
    json["backend"] = model::to_string(model.backend());
    json["kv_dtype"] = to_string(kv_dtype);
    json["timings"] = {
        {"load_seconds", load_seconds},       {"prefill_seconds", t.prefill_seconds},
        {"decode_seconds", t.decode_seconds}, {"decode_steps", t.decode_steps},
        {"decode_tokens", t.decode_tokens},   {"tokens_per_second", tokens_per_second}};
    if (request.speculative.enabled()) {
      json["speculative"] = {{"draft_tokens", t.draft_tokens},
                             {"accepted_tokens", t.accepted_tokens}};
    }
    if (cache.slots > 0) {
      json["expert_cache"] = {{"slots", cache.slots},
                              {"experts", cache.experts},
                              {"lookups", cache.lookups},
                              {"hits", cache.hits},
                              {"misses", cache.misses},
                              {"hit_rate", cache.hit_rate()},
                              {"bytes_copied", cache.bytes_copied},
                              {"copy_seconds", cache.copy_seconds}};
    }
    out << dump_json(json) << "\n";
  } else {
    out << clean_utf8(decoder.finish()) << "\n";
    err << kGenerate << ": " << result->tokens.size() << " tokens (" << finish_name(result->finish)
        << "); prefill " << format_duration(t.prefill_seconds) << ", decode "
        << format_rate(tokens_per_second, "tokens") << "\n";
    if (request.speculative.enabled()) {
      err << kGenerate << ": speculative: " << t.accepted_tokens << " of " << t.draft_tokens
          << " proposed tokens kept, " << t.decode_tokens << " tokens in " << t.decode_steps
          << " decode steps\n";
    }
    if (cache.slots > 0) {
      err << kGenerate << ": " << cache.describe(request.prompt.size() + result->tokens.size())
          << "\n";
    }
  }
  return kExitOk;
}

}  // namespace kvvm::cli
