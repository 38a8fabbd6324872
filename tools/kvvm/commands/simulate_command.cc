#include "commands/simulate_command.h"

#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "kit/byte_size.h"
#include "kit/model_loading.h"  // resolve_model_geometry
#include "kit/text_table.h"
#include "kit/value_parsers.h"
#include "kvvm/kv/geometry.h"
#include "kvvm/vmm/cuda_driver.h"
#include "kvvm/vmm/host_driver.h"
#include "sim/arena_model.h"
#include "sim/baselines.h"
#include "sim/sim_progress_line.h"

namespace kvvm::cli {
namespace {

constexpr const char* kSimulate = "kvvm simulate";
// Addresses the arena may reserve for its slots: far below the 128 TiB of a 47-bit user
// address space (and a GPU's), so other reservations still fit.
constexpr std::uint64_t kMaxReservedBytes = std::uint64_t{16} << 40;
constexpr std::size_t kMaxErrorLines = 20;
// Bounds of the generator's options, so what it makes fits in memory: every request is held
// (with its token ids when a prefix cache runs) and every system records a sample per step.
constexpr std::uint64_t kMaxSimulatedRequests = 1'000'000;
constexpr std::uint64_t kMaxArrivalSteps = 10'000'000;
constexpr double kMaxSimulatedSeconds = 365.0 * 86400.0;  // --duration, --think-s, --max-queue-wait
constexpr double kMaxStepMs = 3'600'000;                  // an hour per decode step
constexpr double kMaxLogNormalMu = 30;  // e^30 tokens: clamped to the context anyway
constexpr double kMaxLogNormalSigma = 10;
constexpr std::uint64_t kMaxCommitAhead = std::uint64_t{1} << 20;
constexpr std::uint64_t kMaxPagedBlocks = std::uint64_t{1} << 23;  // llama-3-8b: 16 TiB

// Like open_driver, but the host driver does not populate its handles (see the header).
Result<std::unique_ptr<Driver>> open_simulation_driver(const SimulateOptions& options,
                                                       std::ostream& err) {
  return open_driver(options.backend, options.device,
                     static_cast<std::size_t>(options.host_granule), kSimulate, err,
                     /*populate=*/false);
}

TraceFigures trace_figures(const Trace& trace, std::string source) {
  TraceFigures figures;
  figures.source = std::move(source);
  figures.requests = trace.requests.size();
  figures.prefix_groups = trace.groups.size();
  figures.skipped_lines = trace.errors.size();
  double prompt = 0, output = 0;
  for (const TraceRequest& request : trace.requests) {
    prompt += static_cast<double>(request.prompt_tokens);
    output += static_cast<double>(request.output_tokens);
    figures.max_prompt_tokens = std::max(figures.max_prompt_tokens, request.prompt_tokens);
    figures.max_output_tokens = std::max(figures.max_output_tokens, request.output_tokens);
    figures.last_arrival_s = std::max(figures.last_arrival_s, request.arrival_s);
  }
  if (!trace.requests.empty()) {
    figures.mean_prompt_tokens = prompt / static_cast<double>(trace.requests.size());
    figures.mean_output_tokens = output / static_cast<double>(trace.requests.size());
  }
  return figures;
}

Result<Trace> load_trace(const SimulateOptions& options, std::ostream& err) {
  if (options.trace.empty()) {
    TraceGeneratorOptions generator = options.generator;
    generator.max_context = options.max_context;
    if (options.chat.conversations > 0) return generate_chat_trace(generator, options.chat);
    return generate_trace(generator);
  }
  std::ifstream in(options.trace);
  if (!in) return Status::InvalidArgument("--trace: cannot open '" + options.trace + "'");
  Result<Trace> trace = read_jsonl_trace(in, options.trace, options.max_context);
  if (!trace.ok()) return trace;
  for (std::size_t i = 0; i < trace->errors.size() && i < kMaxErrorLines; ++i) {
    err << trace->errors[i] << "\n";
  }
  if (trace->errors.size() > kMaxErrorLines) {
    err << options.trace << ": ... and " << trace->errors.size() - kMaxErrorLines
        << " more malformed lines\n";
  }
  if (!trace->errors.empty()) {
    err << kSimulate << ": " << trace->errors.size() << " of " << trace->lines_read
        << " trace lines skipped; replaying the other " << trace->requests.size() << "\n";
  }
  return trace;
}

// What the generator would make, bounded before it runs: its trace, and the per-step time
// series every system records, are held in memory, so a huge count or a tiny rate must be an
// error naming the limit, not an allocation failure.
Status check_generator(const SimulateOptions& options) {
  // Rates and durations as given (1e-09, not 0.000000): number().
  const TraceGeneratorOptions& g = options.generator;
  if (!(g.rate > 0) || !std::isfinite(g.rate)) {
    return Status::InvalidArgument("--rate must be a positive number of requests per second, got " +
                                   number(g.rate));
  }
  double requests = 0;  // expected
  double arrival_span_s = 0;
  std::string what;
  if (options.chat.conversations > 0) {
    requests = static_cast<double>(options.chat.conversations) * options.chat.turns;
    arrival_span_s = static_cast<double>(options.chat.conversations) / g.rate +
                     options.chat.turns * options.chat.think_s;
    what = "--conversations " + str(options.chat.conversations) + " x --turns " +
           str(options.chat.turns);
  } else if (g.duration_s) {
    requests = *g.duration_s * g.rate;
    arrival_span_s = *g.duration_s;
    what = "--duration " + number(*g.duration_s) + " s x --rate " + number(g.rate);
  } else {
    requests = static_cast<double>(g.requests);
    arrival_span_s = static_cast<double>(g.requests) / g.rate;
    what = "--requests " + str(g.requests);
  }
  if (!(requests <= static_cast<double>(kMaxSimulatedRequests))) {
    return Status::InvalidArgument(what + " asks for " + fixed(requests, 0) +
                                   " requests; the limit is " + str(kMaxSimulatedRequests));
  }
  const double steps = arrival_span_s / (options.step_ms / 1000.0);
  if (!(steps <= static_cast<double>(kMaxArrivalSteps))) {
    return Status::InvalidArgument(
        "the arrivals span " + fixed(arrival_span_s, 1) + " simulated seconds (" + what +
        (g.duration_s ? "" : ", --rate " + number(g.rate)) + ") = " + fixed(steps, 0) +
        " steps of --step-ms " + number(options.step_ms) + "; the limit is " +
        str(kMaxArrivalSteps) + " steps: shorten the arrivals or raise --step-ms");
  }
  return Status::Ok();
}

Status check_options(const SimulateOptions& options) {
  if (!(options.step_ms > 0) || !std::isfinite(options.step_ms)) {
    return Status::InvalidArgument("--step-ms must be a positive number of milliseconds, got " +
                                   fixed(options.step_ms, 3));
  }
  if (!(options.max_queue_wait_s >= 0) || !std::isfinite(options.max_queue_wait_s)) {
    return Status::InvalidArgument("--max-queue-wait must be >= 0 seconds, got " +
                                   fixed(options.max_queue_wait_s, 3));
  }
  if (options.budget == 0)
    return Status::InvalidArgument("--budget must be at least 1 byte, got 0");
  if (options.max_context < 2) {
    return Status::InvalidArgument("--max-context must be at least 2 tokens, got " +
                                   str(options.max_context));
  }
  if (options.device < 0) {
    return Status::InvalidArgument("--device must be >= 0, got " + std::to_string(options.device));
  }
  if (options.trace.empty()) return check_generator(options);
  return check_input_file("--trace", options.trace);
}

// What a system's builder needs of the run.
struct SystemContext {
  Driver& driver;
  const SimulateOptions& options;
  const LayoutPlan& plan;
  SimulateReport& report;  // budget and max_slots as they run (a builder may lower max_slots)
  std::ostream& err;
};

// kvvm's real arena on the driver, declared prefix groups or the automatic prefix cache.
Result<std::unique_ptr<MemoryModel>> build_arena(SystemContext& c, bool prefix_cache) {
  ArenaModelOptions arena{.plan = c.plan,
                          .budget = c.report.budget,
                          .max_slots = static_cast<std::uint32_t>(c.report.max_slots),
                          .sharing = c.options.sharing,
                          .pool_bytes = c.options.pool_bytes,
                          .commit_ahead_windows = c.options.commit_ahead,
                          .prefix_cache = prefix_cache};
  Result<std::unique_ptr<ArenaModel>> model = ArenaModel::create(c.driver, arena);
  // Slots chosen for the trace may ask for more addresses than the driver will reserve at
  // once: halve them (queueing on "every slot taken" instead) and say so.
  while (!model.ok() && c.options.max_slots == 0 && arena.max_slots > 1 &&
         model.status().code() != StatusCode::kInvalidArgument) {
    arena.max_slots /= 2;
    model = ArenaModel::create(c.driver, arena);
    if (model.ok()) {
      c.err << kSimulate << ": note: " << c.report.max_slots << " slots of "
            << format_bytes(c.plan.slot_stride) << " could not be reserved; using "
            << arena.max_slots << "\n";
      c.report.max_slots = arena.max_slots;
    }
  }
  if (!model.ok()) return model.status();
  return std::unique_ptr<MemoryModel>(std::move(model).value());
}

std::uint64_t bytes_per_token(const SystemContext& c) { return c.plan.geometry.bytes_per_token(); }

// An accounting model (they cannot fail to build).
template <typename Model, typename... Args>
Result<std::unique_ptr<MemoryModel>> accounting(Args... args) {
  return std::unique_ptr<MemoryModel>(std::make_unique<Model>(args...));
}

// One system of the comparison: adding one is adding a row to kSystems.
struct SystemRow {
  const char* name;   // its column; the model's name()
  bool arena;         // replays kvvm's arena on the driver (else accounting only: fast)
  bool prefix_cache;  // admits through a prefix cache over token ids
  Result<std::unique_ptr<MemoryModel>> (*build)(SystemContext&);
  // What the report keeps of the model besides its run; null: nothing.
  void (*keep)(const MemoryModel&, SimulateReport&);
};

// The columns, in this order; kvvm first (the plot draws its live bytes from the first).
const SystemRow kSystems[] = {
    {"kvvm", true, false, [](SystemContext& c) { return build_arena(c, false); },
     [](const MemoryModel& m, SimulateReport& r) {
       r.kvvm = static_cast<const ArenaModel&>(m).report();
     }},
    {"kvvm+cache", true, true, [](SystemContext& c) { return build_arena(c, true); },
     [](const MemoryModel& m, SimulateReport& r) {
       r.kvvm_cache = static_cast<const ArenaModel&>(m).report();
     }},
    {"paged-16+cache", false, true,
     [](SystemContext& c) {
       return accounting<PagedCacheModel>(c.report.budget, kPagedBlockTokens, bytes_per_token(c));
     },
     nullptr},
    {"paged-16", false, false,
     [](SystemContext& c) {
       return accounting<PagedModel>(c.report.budget, kPagedBlockTokens, bytes_per_token(c));
     },
     nullptr},
    {"preallocate", false, false,
     [](SystemContext& c) {
       return accounting<PreallocateModel>(c.report.budget, c.options.max_context,
                                           bytes_per_token(c));
     },
     nullptr},
};

// --prefix-cache: off runs no prefix-cache system, on runs both. auto runs paged-16+cache
// always, since vLLM turns its prefix caching on by default (so it is a vLLM user's baseline),
// and kvvm+cache, a second replay through the arena, with the multi-turn generator only.
bool selected(const SystemRow& row, const SimulateOptions& options) {
  if (!row.prefix_cache) return true;
  if (options.prefix_cache == "off") return false;
  if (options.prefix_cache == "on") return true;
  return !row.arena || (options.chat.conversations > 0 && options.trace.empty());
}

}  // namespace

CLI::App* add_simulate_command(CLI::App& app, SimulateOptions& options) {
  CLI::App* sim = app.add_subcommand(
      "simulate",
      "Replay a request trace through kvvm's real arena (CUDA when a GPU is present, else the "
      "host driver) with admission through the governor, and, on the same trace in the same "
      "run, through three baselines: paged-16+cache (blocks of 16 tokens with vLLM's automatic "
      "prefix caching, on by default in vLLM), paged-16 (the same without it) and preallocate "
      "(max context per request). Reports admitted, queued and rejected "
      "requests, peak and mean concurrency, committed and live bytes, waste, bytes saved by "
      "sharing, driver calls and commit time, side by side.");
  add_backend_options(*sim, options.backend, options.device, options.host_granule,
                      "Host backend granule (default 2M, a current GPU's); handles are sized, not "
                      "populated, so the budget need not fit in RAM");
  sim->add_option("--model", options.model,
                  "A built-in model (see kvvm plan --help) or a Hugging Face config.json "
                  "(default llama-3-8b)");
  sim->add_option("--kv-dtype,--dtype", options.dtype,
                  "KV element type: fp16, bf16, fp8 or fp32 (default: the config's "
                  "torch_dtype; fp16 for built-in models). fp8 is e4m3, one byte per element: "
                  "half a 16-bit type's bytes per token, in kvvm's arena and in the baselines' "
                  "blocks alike (vLLM's fp8 blocks are 16 tokens of one-byte elements). --dtype "
                  "is the old name");
  sim->add_option("--layout", options.layout,
                  "head-major, seq-major or token-major (default token-major)");
  sim->add_option("--budget", options.budget,
                  "KV memory budget for every system, e.g. 40G (default 40G; on a GPU capped to "
                  "its free memory, with a note)")
      ->transform(byte_size_validator(kMaxBudgetBytes, "the addresses kvvm's arena reserves"));
  sim->add_option("--max-context", options.max_context,
                  "Max tokens per sequence: the slot size, and what preallocate reserves per "
                  "request (default 8192; K = 1024)")
      ->transform(token_count_validator());
  CLI::Option* trace = sim->add_option(
      "--trace", options.trace,
      "Replay this JSONL trace instead of generating one: one object per line, "
      "{\"arrival\": s, \"prompt_tokens\": n | \"prompt\": [ids], "
      "\"output_tokens\": n, \"prefix_group\": \"name\", \"prefix_tokens\": n} (the "
      "last two together or not at all); malformed lines are reported as "
      "FILE:LINE and skipped, and the exit status is then 3");
  TraceGeneratorOptions& g = options.generator;
  CLI::Option* requests =
      sim->add_option("--requests", g.requests, "Generated requests (default 3000)")
          ->transform(count_validator(1, kMaxSimulatedRequests));
  CLI::Option* duration =
      sim->add_option_function<double>(
             "--duration", [&g](const double& seconds) { g.duration_s = seconds; },
             "Generate arrivals for this many seconds instead of a request count")
          ->transform(number_validator(0, kMaxSimulatedSeconds, /*min_exclusive=*/true));
  CLI::Option* rate =
      sim->add_option("--rate", g.rate, "Poisson arrival rate, requests per second (default 30)")
          ->transform(number_validator(0, kMaxRate, /*min_exclusive=*/true));
  CLI::Option* tenants =
      sim->add_option("--tenants", g.tenants,
                      "Tenants; each request picks one uniformly, and its prompt starts with the "
                      "tenant's system prompt, shared (default 4; 0: no shared prefix)")
          ->transform(count_validator(0, kMaxPrefixGroups));
  CLI::Option* system_prompt =
      sim->add_option("--system-prompt-tokens", g.system_prompt_tokens,
                      "Tokens of each tenant's system prompt (default 512)")
          ->transform(token_count_validator());
  const CLI::Validator mu = number_validator(-kMaxLogNormalMu, kMaxLogNormalMu);
  const CLI::Validator sigma = number_validator(0, kMaxLogNormalSigma);
  CLI::Option* prompt_mu =
      sim->add_option("--prompt-mu", g.prompt_mu,
                      "Log-normal mu of the user prompt length (default ln(161.31) - 1.0^2/2 = "
                      "4.583: ShareGPT's mean prompt per the vLLM paper)")
          ->transform(mu);
  CLI::Option* prompt_sigma = sim->add_option("--prompt-sigma", g.prompt_sigma,
                                              "Log-normal sigma of the prompt (default 1.0)")
                                  ->transform(sigma);
  CLI::Option* output_mu =
      sim->add_option("--output-mu", g.output_mu,
                      "Log-normal mu of the output length (default ln(337.99) - 0.8^2/2 = 5.503: "
                      "ShareGPT's mean output per the vLLM paper)")
          ->transform(mu);
  CLI::Option* output_sigma = sim->add_option("--output-sigma", g.output_sigma,
                                              "Log-normal sigma of the output (default 0.8)")
                                  ->transform(sigma);
  CLI::Option* seed =
      sim->add_option("--seed", g.seed, "Generator seed (default 1)")
          ->transform(count_validator(0, std::numeric_limits<std::uint64_t>::max()));
  CLI::Option* conversations =
      sim->add_option(
             "--conversations", options.chat.conversations,
             "Multi-turn chat trace instead: this many conversations, arriving at --rate "
             "per second, each of a tenant (--tenants, --system-prompt-tokens); every turn "
             "resends the whole conversation, as chat templates do; user messages follow "
             "--prompt-mu/sigma, replies --output-mu/sigma (default 0: single-turn trace)")
          ->transform(count_validator(0, kMaxSimulatedRequests));
  CLI::Option* turns =
      sim->add_option("--turns", options.chat.turns, "Turns per conversation (default 8)")
          ->transform(count_validator(1, kMaxTurns));
  CLI::Option* think =
      sim->add_option("--think-s", options.chat.think_s,
                      "Mean think time (exponential) between a turn's completion and the next "
                      "turn's arrival, in simulated seconds (default 5)")
          ->transform(number_validator(0, kMaxSimulatedSeconds));
  // Options that would be dropped without a word are refused, naming both: a trace file
  // replaces the generator; a count and a duration, or the multi-turn generator and either,
  // each say how many requests to make.
  for (CLI::Option* generator_option :
       {requests, duration, rate, tenants, system_prompt, prompt_mu, prompt_sigma, output_mu,
        output_sigma, seed, conversations, turns, think}) {
    trace->excludes(generator_option);
  }
  requests->excludes(duration);
  conversations->excludes(requests)->excludes(duration);
  turns->needs(conversations);
  think->needs(conversations);
  sim->add_option("--prefix-cache", options.prefix_cache,
                  "Run kvvm+cache (the arena through the automatic prefix cache) and "
                  "paged-16+cache (vLLM-style block-hash prefix caching) on the same trace: on, "
                  "off or auto (default auto: paged-16+cache always, as vLLM's prefix caching "
                  "is on by default; kvvm+cache with --conversations); traces without token "
                  "ids get made-up ones, a prefix group's prefix the same in each request")
      ->check(CLI::IsMember({"auto", "on", "off"}));
  sim->add_option("--step-ms", options.step_ms,
                  "Simulated duration of one decode step, in which every running sequence grows "
                  "by one token (default 50)")
      ->transform(number_validator(0, kMaxStepMs, /*min_exclusive=*/true));
  sim->add_option("--max-queue-wait", options.max_queue_wait_s,
                  "Seconds (simulated) a request may wait in the queue before it is rejected, "
                  "as a server answers 429 (default 30)")
      ->transform(number_validator(0, kMaxSimulatedSeconds));
  sim->add_flag("!--no-sharing", options.sharing,
                "kvvm admits every request plainly (no shared prefixes)");
  sim->add_option("--commit-ahead", options.commit_ahead,
                  "kvvm's commit-ahead windows per fragment (default 0: committed bytes are "
                  "exactly the layout arithmetic's)")
      ->transform(count_validator(0, kMaxCommitAhead));
  sim->add_option("--pool", options.pool_bytes,
                  "Unmapped handles kvvm's pool keeps for reuse (charged to the budget, given "
                  "back under pressure; default 256M)")
      ->transform(byte_size_validator(kMaxBudgetBytes, "the most a budget may be"));
  sim->add_option("--max-slots", options.max_slots,
                  "kvvm's slots (default 0: one per request, up to 16 TiB of addresses)")
      ->transform(count_validator(0, std::numeric_limits<std::uint32_t>::max()));
  sim->add_flag("--json", options.json, "Machine-readable summary (JSON) on stdout");
  sim->add_option("--csv", options.csv,
                  "Write the time series to this file ('-': stdout, after the summary): one row "
                  "per step, running / queued / committed / live / saved bytes per system");
  sim->add_option("--plot", options.plot,
                  "Draw concurrency and committed memory over time for every system into "
                  "this PNG (needs gnuplot: Debian package gnuplot-nox)");
  sim->add_option("--save-trace", options.save_trace,
                  "Write the replayed trace as JSONL (replay it with --trace)");
  sim->add_flag("--progress", options.progress,
                "Progress line on stderr even when it is not a terminal");
  sim->footer(
      "Simulated time: a step is one decode iteration (--step-ms); arrivals join a FIFO queue; "
      "admission commits the whole prompt; a request waits while the budget is short and is "
      "rejected after --max-queue-wait; a sequence that cannot grow preempts the youngest "
      "(recomputed later). Exit status: 0 ok, 1 a call failed, 2 bad usage, 3 ran but trace "
      "lines were skipped.");
  return sim;
}

std::vector<std::string> simulated_systems(const SimulateOptions& options) {
  std::vector<std::string> names;
  for (const SystemRow& row : kSystems) {
    if (selected(row, options)) names.emplace_back(row.name);
  }
  return names;
}

Result<SimulateReport> make_simulation(const SimulateOptions& options, std::ostream& err,
                                       std::ostream* progress_err) {
  const auto started = std::chrono::steady_clock::now();
  KVVM_RETURN_IF_ERROR(check_options(options));
  std::optional<DType> dtype;
  if (!options.dtype.empty()) {
    Result<DType> parsed = parse_dtype(options.dtype);
    if (!parsed.ok()) return parsed.status().with_context("--kv-dtype (--dtype)");
    dtype = *parsed;
  }
  Result<Layout> layout = parse_layout(options.layout);
  if (!layout.ok()) return layout.status().with_context("--layout");
  Result<Geometry> geometry = resolve_model_geometry(options.model, dtype);
  if (!geometry.ok()) return geometry.status().with_context("--model");
  // paged-16+cache keeps a record per block of the budget, so the blocks are bounded here.
  const std::uint64_t block_bytes = kPagedBlockTokens * geometry->bytes_per_token();
  if (options.budget / block_bytes > kMaxPagedBlocks) {
    return Status::InvalidArgument(
        "--budget " + str(options.budget) + " bytes (" + format_bytes(options.budget) + ") is " +
        str(options.budget / block_bytes) + " paged blocks of " + format_bytes(block_bytes) +
        " for " + geometry->name + "; the limit is " + str(kMaxPagedBlocks) + " blocks (" +
        format_bytes(kMaxPagedBlocks * block_bytes) + ")");
  }
  KVVM_ASSIGN_OR_RETURN(Trace trace, load_trace(options, err));
  if (std::ranges::any_of(kSystems, [&](const SystemRow& row) {
        return row.prefix_cache && selected(row, options);
      })) {
    synthesize_ids(trace);
  }
  if (trace.requests.empty()) {
    return Status::InvalidArgument("the trace holds no request to replay");
  }
  if (!options.save_trace.empty()) {
    std::ofstream out(options.save_trace);
    write_jsonl_trace(trace, out);
    if (!out)
      return Status::InvalidArgument("--save-trace: cannot write '" + options.save_trace + "'");
  }

  KVVM_ASSIGN_OR_RETURN(std::unique_ptr<Driver> driver, open_simulation_driver(options, err));
  SimulateReport report;
  report.driver = driver->info();
  report.granule = driver->granule();
  KVVM_ASSIGN_OR_RETURN(LayoutPlan plan,
                        plan_layout(*geometry, *layout, report.granule, options.max_context));
  report.plan = plan;
  report.requested_budget = options.budget;
  report.budget = options.budget;
  if (report.driver.backend == "cuda") {
    const std::uint64_t usable = usable_memory(report.driver) / report.granule * report.granule;
    if (report.budget > usable) {
      report.budget = usable;
      err << kSimulate << ": note: --budget " << format_bytes(options.budget) << " capped to "
          << format_bytes(usable) << ": the GPU has " << format_bytes(report.driver.free_bytes)
          << " free\n";
    }
  }
  report.max_slots = options.max_slots;
  if (report.max_slots == 0) {
    report.max_slots = std::min<std::uint64_t>(
        {trace.requests.size(), std::max<std::uint64_t>(1, kMaxReservedBytes / plan.slot_stride),
         std::numeric_limits<std::uint32_t>::max()});
  }
  report.sharing = options.sharing;
  report.step_s = options.step_ms / 1000.0;
  report.max_queue_wait_s = options.max_queue_wait_s;
  report.trace = trace_figures(trace, !options.trace.empty() ? options.trace
                                      : options.chat.conversations > 0
                                          ? "multi-turn chat, " + str(options.chat.conversations) +
                                                " conversations x " + str(options.chat.turns) +
                                                " turns (seed " + str(options.generator.seed) + ")"
                                          : "generated (seed " + str(options.generator.seed) + ")");
  report.preallocate_capacity =
      preallocate_capacity(report.budget, options.max_context, geometry->bytes_per_token());

  const SchedulerOptions scheduler{report.step_s, options.max_queue_wait_s,
                                   geometry->bytes_per_token()};
  SystemContext context{*driver, options, plan, report, err};
  for (const SystemRow& row : kSystems) {
    if (!selected(row, options)) continue;
    Result<std::unique_ptr<MemoryModel>> model = row.build(context);
    if (!model.ok()) return model.status().with_context(row.name);
    if ((*model)->name() != row.name) {
      return Status::Internal(std::string("the table's system ") + row.name + " built " +
                              (*model)->name());
    }
    Result<RunSummary> run = [&] {
      SimProgressLine line(progress_err, kSimulate, row.name, trace.requests.size(),
                           ::isatty(STDERR_FILENO) == 1);
      return run_schedule(
          trace, **model, scheduler,
          [&](std::uint64_t step, const RunSummary& so_far) { line(step, so_far, report.step_s); });
    }();
    if (!run.ok()) return run.status().with_context(row.name);
    if (row.keep != nullptr) row.keep(**model, report);
    report.runs.push_back(std::move(run).value());
  }  // each model goes here: an arena's handles return before the next one takes the budget
  report.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  return report;
}

int run_simulate(const SimulateOptions& options, std::ostream& out, std::ostream& err) {
  const auto fail = [&err](const Status& status, int code) {
    err << kSimulate << ": " << status.to_string() << "\n";
    return code;
  };
  const bool tty = ::isatty(STDERR_FILENO) == 1;
  Result<SimulateReport> report =
      make_simulation(options, err, options.progress || tty ? &err : nullptr);
  if (!report.ok()) {
    const StatusCode code = report.status().code();
    const bool usage = code == StatusCode::kInvalidArgument || code == StatusCode::kUnavailable;
    return fail(report.status(), usage ? kExitUsage : kExitFailure);
  }
  if (options.json) {
    out << dump_json(simulate_json(*report)) << "\n";
  } else {
    print_simulate(*report, out);
  }
  if (!options.csv.empty()) {
    if (options.csv == "-") {
      write_series_csv(*report, out);
    } else {
      Status written = write_file(options.csv, "--csv",
                                  [&report](std::ostream& csv) { write_series_csv(*report, csv); });
      if (!written.ok()) {
        return fail(written,
                    written.code() == StatusCode::kInvalidArgument ? kExitUsage : kExitFailure);
      }
    }
  }
  if (!options.plot.empty()) {
    Status plotted = plot_series(*report, options.plot, options.gnuplot);
    if (!plotted.ok()) {
      return fail(plotted, plotted.code() == StatusCode::kUnavailable ? kExitUsage : kExitFailure);
    }
  }
  return report->trace.skipped_lines > 0 ? kExitSkippedLines : kExitOk;
}

}  // namespace kvvm::cli
