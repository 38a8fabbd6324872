// kvvm: the command-line tool. This file only wires subcommands to CLI11; each subcommand
// lives in its own *_command.cc, built into kvvm_cli_lib so the test binary calls it directly.
#include <CLI/CLI.hpp>
#include <exception>
#include <iostream>
#include <string>

#include "bench_attention.h"
#include "bench_command.h"
#include "bench_share.h"
#include "info_command.h"
#include "plan_command.h"
#include "simulate_command.h"

#ifndef KVVM_VERSION_STRING
#define KVVM_VERSION_STRING "unknown"
#endif

int main(int argc, char** argv) {
  using kvvm::cli::kExitFailure;
  using kvvm::cli::kExitOk;
  using kvvm::cli::kExitUsage;

  CLI::App app(
      "kvvm keeps an LLM's KV cache in virtual memory: each sequence gets a stable virtual "
      "address range reserved once, and physical memory is committed under it granule by "
      "granule as the sequence grows, so growth never copies and never moves a pointer. It "
      "runs on NVIDIA GPUs (the CUDA driver's virtual memory API) and on the host (Linux "
      "memory files and mmap).",
      "kvvm");
  app.set_version_flag("--version", std::string("kvvm ") + KVVM_VERSION_STRING);
  app.require_subcommand(1);
  app.footer(
      "Main job: 'kvvm simulate' replays a request trace through kvvm beside the preallocate "
      "and paged-16 baselines. Run 'kvvm SUBCOMMAND --help' for one.");

  kvvm::cli::InfoOptions info_options;
  CLI::App* info = kvvm::cli::add_info_command(app, info_options);
  kvvm::cli::PlanOptions plan_options;
  CLI::App* plan = kvvm::cli::add_plan_command(app, plan_options);
  kvvm::cli::BenchGrowthOptions bench_growth_options;
  CLI::App* bench_growth = kvvm::cli::add_bench_command(app, bench_growth_options);
  kvvm::cli::BenchShareOptions bench_share_options;
  CLI::App* bench_share =
      kvvm::cli::add_bench_share_command(*app.get_subcommand("bench"), bench_share_options);
  kvvm::cli::BenchDecodeOptions bench_decode_options;
  CLI::App* bench_decode =
      kvvm::cli::add_bench_decode_command(*app.get_subcommand("bench"), bench_decode_options);
  kvvm::cli::SimulateOptions simulate_options;
  CLI::App* simulate = kvvm::cli::add_simulate_command(app, simulate_options);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    // --help and --version arrive here too, with exit code 0; app.exit prints them to stdout
    // and real errors (with "Run with --help") to stderr.
    return app.exit(error) == 0 ? kExitOk : kExitUsage;
  }

  try {
    if (info->parsed()) return kvvm::cli::run_info(info_options, std::cout, std::cerr);
    if (plan->parsed()) return kvvm::cli::run_plan(plan_options, std::cout, std::cerr);
    if (simulate->parsed()) {
      return kvvm::cli::run_simulate(simulate_options, std::cout, std::cerr);
    }
    if (bench_share->parsed()) {
      return kvvm::cli::run_bench_share(bench_share_options, std::cout, std::cerr);
    }
    if (bench_decode->parsed()) {
      return kvvm::cli::run_bench_decode(bench_decode_options, std::cout, std::cerr);
    }
    if (bench_growth->parsed()) {
      return kvvm::cli::run_bench_growth(bench_growth_options, std::cout, std::cerr);
    }
  } catch (const std::exception& error) {
    std::cerr << "kvvm: internal error: " << error.what() << "\n";
    return kExitFailure;
  }
  return kExitUsage;
}
