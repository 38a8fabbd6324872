#include "app.h"

#include <CLI/CLI.hpp>
#include <exception>
#include <ostream>

#include "bench/drivers/attention/decode_attention.h"
#include "bench/drivers/attention/kv_error.h"
#include "bench/drivers/attention/prefill_attention.h"
#include "bench/drivers/chat/chat_template_render.h"
#include "bench/drivers/engine/engine.h"
#include "bench/drivers/grammar/grammar_masks.h"
#include "bench/drivers/memory/growth.h"
#include "bench/drivers/memory/share.h"
#include "bench/drivers/serve/serve.h"
#include "bench/drivers/tokenizer/tokenizer_load.h"
#include "commands/chat_template_command.h"
#include "commands/generate_command.h"
#include "commands/info_command.h"
#include "commands/plan_command.h"
#include "commands/serve_command.h"
#include "commands/simulate_command.h"
#include "kit/cli_common.h"

namespace kvvm::cli {
namespace {

// Parses `args` and runs the subcommand; the caller checks `out` afterwards.
int parse_and_run(const std::vector<std::string>& args, const std::string& version,
                  std::ostream& out, std::ostream& err) {
  CLI::App app(
      "kvvm keeps an LLM's KV cache in virtual memory: each sequence gets a stable virtual "
      "address range reserved once, and physical memory is committed under it granule by "
      "granule as the sequence grows, so growth never copies and never moves a pointer. It "
      "runs on NVIDIA GPUs (the CUDA driver's virtual memory API) and on the host (Linux "
      "memory files and mmap).",
      "kvvm");
  app.set_version_flag("--version", "kvvm " + version);
  app.require_subcommand(1);
  app.footer(
      "Main job: 'kvvm serve --model DIR' serves a Hugging Face checkpoint with OpenAI's API "
      "(scripts/run.sh serves the demo model models/kvvm-adder); 'kvvm simulate' replays a "
      "request trace through kvvm beside the preallocate and paged-16 baselines. Run 'kvvm "
      "SUBCOMMAND --help' for one.");

  InfoOptions info_options;
  CLI::App* info = add_info_command(app, info_options);
  PlanOptions plan_options;
  CLI::App* plan = add_plan_command(app, plan_options);
  BenchGrowthOptions bench_growth_options;
  CLI::App* bench_growth = add_bench_command(app, bench_growth_options);
  BenchShareOptions bench_share_options;
  CLI::App* bench_share =
      add_bench_share_command(*app.get_subcommand("bench"), bench_share_options);
  BenchDecodeOptions bench_decode_options;
  CLI::App* bench_decode =
      add_bench_decode_command(*app.get_subcommand("bench"), bench_decode_options);
  BenchPrefillOptions bench_prefill_options;
  CLI::App* bench_prefill =
      add_bench_prefill_command(*app.get_subcommand("bench"), bench_prefill_options);
  BenchEngineOptions bench_engine_options;
  CLI::App* bench_engine =
      add_bench_engine_command(*app.get_subcommand("bench"), bench_engine_options);
  BenchServeOptions bench_serve_options;
  CLI::App* bench_serve =
      add_bench_serve_command(*app.get_subcommand("bench"), bench_serve_options);
  BenchKvErrorOptions bench_kv_error_options;
  CLI::App* bench_kv_error =
      add_bench_kv_error_command(*app.get_subcommand("bench"), bench_kv_error_options);
  BenchTokenizerLoadOptions bench_tokenizer_load_options;
  CLI::App* bench_tokenizer_load =
      add_bench_tokenizer_load_command(*app.get_subcommand("bench"), bench_tokenizer_load_options);
  BenchGrammarOptions bench_grammar_options;
  CLI::App* bench_grammar =
      add_bench_grammar_command(*app.get_subcommand("bench"), bench_grammar_options);
  BenchChatTemplateOptions bench_chat_template_options;
  CLI::App* bench_chat_template =
      add_bench_chat_template_command(*app.get_subcommand("bench"), bench_chat_template_options);
  SimulateOptions simulate_options;
  CLI::App* simulate = add_simulate_command(app, simulate_options);
  GenerateOptions generate_options;
  CLI::App* generate = add_generate_command(app, generate_options);
  ServeOptions serve_options;
  CLI::App* serve = add_serve_command(app, serve_options);
  ChatTemplateOptions chat_template_options;
  CLI::App* chat_template = add_chat_template_command(app, chat_template_options);

  // CLI11 answers a misspelt subcommand with "A subcommand is required", which does not say
  // what was wrong: name the word and the subcommands it could have been.
  if (const std::string unknown = unknown_subcommand(app, args); !unknown.empty()) {
    err << "kvvm: " << unknown << "\nRun with --help for more information.\n";
    return kExitUsage;
  }
  try {
    std::vector<std::string> reversed(args.rbegin(), args.rend());  // what CLI11 expects
    app.parse(reversed);
  } catch (const CLI::ParseError& error) {
    // --help and --version arrive here too, with exit code 0; app.exit prints them to `out`
    // and real errors (with "Run with --help") to `err`.
    return app.exit(error, out, err) == 0 ? kExitOk : kExitUsage;
  }

  try {
    if (info->parsed()) return run_info(info_options, out, err);
    if (plan->parsed()) return run_plan(plan_options, out, err);
    if (simulate->parsed()) return run_simulate(simulate_options, out, err);
    if (generate->parsed()) return run_generate(generate_options, out, err);
    if (serve->parsed()) return run_serve(serve_options, out, err);
    if (chat_template->parsed()) return run_chat_template(chat_template_options, out, err);
    if (bench_share->parsed()) return run_bench_share(bench_share_options, out, err);
    if (bench_decode->parsed()) return run_bench_decode(bench_decode_options, out, err);
    if (bench_prefill->parsed()) return run_bench_prefill(bench_prefill_options, out, err);
    if (bench_engine->parsed()) return run_bench_engine(bench_engine_options, out, err);
    if (bench_serve->parsed()) return run_bench_serve(bench_serve_options, out, err);
    if (bench_kv_error->parsed()) return run_bench_kv_error(bench_kv_error_options, out, err);
    if (bench_tokenizer_load->parsed()) {
      return run_bench_tokenizer_load(bench_tokenizer_load_options, out, err);
    }
    if (bench_grammar->parsed()) return run_bench_grammar(bench_grammar_options, out, err);
    if (bench_chat_template->parsed()) {
      return run_bench_chat_template(bench_chat_template_options, out, err);
    }
    if (bench_growth->parsed()) return run_bench_growth(bench_growth_options, out, err);
  } catch (const std::exception& error) {
    err << "kvvm: internal error: " << error.what() << "\n";
    return kExitFailure;
  }
  return kExitUsage;
}

}  // namespace

int run_cli(const std::vector<std::string>& args, const std::string& version, std::ostream& out,
            std::ostream& err) {
  const int code = parse_and_run(args, version, out, err);
  // A report that did not arrive (a full disk, a closed pipe) is a failure, whatever the
  // subcommand computed.
  if (Status written = check_written(out, "standard output"); !written.ok()) {
    err << "kvvm: " << written.message() << "\n";
    return code == kExitOk ? kExitFailure : code;
  }
  return code;
}

}  // namespace kvvm::cli
