#include "bench/drivers/memory/growth.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <limits>
#include <memory>
#include <numeric>
#include <ostream>
#include <stdexcept>
#include <string_view>
#include <utility>

#include "kit/byte_size.h"
#include "kit/model_loading.h"  // resolve_model_geometry
#include "kit/op_timing.h"
#include "kit/text_table.h"
#include "kit/value_parsers.h"
#include "kvvm/kv/arena.h"
#include "kvvm/kv/arena_stack.h"
#include "kvvm/model/kv_config.h"
#include "kvvm/vmm/cuda_driver.h"
#include "kvvm/vmm/host_driver.h"

namespace kvvm::cli {
namespace {

constexpr std::uint64_t kMiB = std::uint64_t{1} << 20;
// Bounds of the numeric options.
constexpr std::uint64_t kMaxBenchSequences = std::uint64_t{1} << 20;
constexpr std::uint64_t kMaxBenchAhead = std::uint64_t{1} << 20;
constexpr std::uint64_t kMaxBenchSteps = std::uint64_t{1} << 24;
constexpr std::uint64_t kMaxKernelUs = 10'000'000;

// What the options resolve to, validated before any driver is opened.
struct Request {
  std::vector<Geometry> models;
  std::vector<Layout> layouts;
  Geometry decode_model;
  Layout decode_layout = Layout::kTokenMajor;
};

bool wants_all_models(const std::vector<std::string>& models) {
  return models.empty() || std::find(models.begin(), models.end(), "all") != models.end();
}

Result<Request> resolve_request(const BenchGrowthOptions& options) {
  if (options.tokens < 2) {
    return Status::InvalidArgument(
        "--tokens must be at least 2 (sequences start at 1 token "
        "and grow), got " +
        str(options.tokens));
  }
  if (options.sequences == 0) {
    return Status::InvalidArgument("--sequences must be at least 1, got 0");
  }
  if (options.ahead == 0) {
    return Status::InvalidArgument(
        "--ahead must be at least 1 window (the table always shows 0 beside it), got 0");
  }
  if (options.steps == 0) return Status::InvalidArgument("--steps must be at least 1, got 0");
  if (options.kernel_us == 0) {
    return Status::InvalidArgument("--kernel-us must be at least 1 microsecond, got 0");
  }
  if (options.device < 0) {
    return Status::InvalidArgument("--device must be >= 0, got " + std::to_string(options.device));
  }
  Request request;
  if (options.layout == "all") {
    request.layouts = all_layouts();
  } else {
    Result<Layout> layout = parse_layout(options.layout);
    if (!layout.ok()) return layout.status().with_context("--layout (or 'all')");
    request.layouts = {*layout};
    request.decode_layout = *layout;
  }
  const bool all = wants_all_models(options.models);
  std::vector<std::string> names = all ? model::builtin_model_names() : options.models;
  // A name beside 'all' still counts: an unknown one is refused like any other, a config.json
  // path is run too, and a built-in is run once.
  for (const std::string& name : options.models) {
    if (all && name != "all" && std::find(names.begin(), names.end(), name) == names.end()) {
      names.push_back(name);
    }
  }
  for (const std::string& name : names) {
    Result<Geometry> geometry = resolve_model_geometry(name, std::nullopt);
    if (!geometry.ok()) return geometry.status().with_context("--model (or 'all')");
    request.models.push_back(*geometry);
  }
  if (all) {
    Result<Geometry> geometry = resolve_model_geometry("llama-3-8b", std::nullopt);
    if (!geometry.ok()) return geometry.status().with_context("the decode loop's model");
    request.decode_model = *geometry;
  } else {
    request.decode_model = request.models.front();
  }
  return request;
}

DriverCallDelta delta(const DriverCallCounts& before, const DriverCallCounts& after) {
  const auto diff = [&](DriverOp op) { return after.of(op) - before.of(op); };
  return {diff(DriverOp::kCreate), diff(DriverOp::kMap), diff(DriverOp::kSetAccess),
          diff(DriverOp::kUnmap), diff(DriverOp::kRelease)};
}

std::string seq_text(std::uint32_t sequences) {
  return str(sequences) + (sequences == 1 ? " sequence" : " sequences");
}

// One combination: a fresh ArenaStack (limit `row.memory_bytes`); admit, grow round-robin
// timing every ensure, then read the counters.
Status measure_growth(Driver& driver, const LayoutPlan& plan, const BenchGrowthOptions& options,
                      GrowthRow& row) {
  const std::string what =
      row.model + " " + std::string(to_string(row.layout)) + ", ahead " + str(row.ahead_windows);
  Result<std::unique_ptr<ArenaStack>> created = ArenaStack::create(
      driver, ArenaStackOptions{.tier_name = "bench",
                                .budget_bytes = row.memory_bytes,
                                .arena = ArenaOptions{.plan = plan,
                                                      .max_slots = options.sequences,
                                                      .commit_ahead_windows = row.ahead_windows}});
  if (!created.ok()) return created.status().with_context(what);
  Arena& arena = (*created)->arena();

  const DriverCallCounts before = driver.counts();
  std::vector<SlotId> slots;
  for (std::uint32_t s = 0; s < options.sequences; ++s) {
    Result<SlotId> slot = arena.admit(1);
    if (!slot.ok()) {
      return slot.status().with_context(what + ": admitting sequence " + str(s + 1) + " of " +
                                        str(options.sequences));
    }
    slots.push_back(*slot);
  }
  std::vector<double> samples_ns;
  samples_ns.reserve((options.tokens - 1) * options.sequences);
  for (std::uint64_t tokens = 2; tokens <= options.tokens; ++tokens) {
    for (SlotId slot : slots) {
      const auto start = std::chrono::steady_clock::now();
      Status grown = arena.ensure(slot, tokens);
      const auto stop = std::chrono::steady_clock::now();
      if (!grown.ok()) return grown.with_context(what);
      samples_ns.push_back(std::chrono::duration<double, std::nano>(stop - start).count());
    }
  }
  arena.wait_until_idle();
  const ArenaStats stats = arena.stats();
  row.ensures = stats.ensures;
  row.ensures_committing = stats.ensures_committing;
  row.ahead_commits = stats.ahead_commits;
  row.committed_bytes = stats.committed_bytes;
  row.driver_calls = delta(before, stats.driver_calls);
  row.ensure_ns = summarize_latency(samples_ns);
  return Status::Ok();
}

// --- rendering ---------------------------------------------------------------------------

nlohmann::ordered_json latency_json(const LatencySummary& summary) {
  return {{"samples", summary.samples},
          {"mean", summary.mean},
          {"p50", summary.p50},
          {"p99", summary.p99},
          {"max", summary.max}};
}

void print_decode(const DecodeReport& decode, std::ostream& out) {
  if (!decode.ran) {
    out << "decode loop: " << decode.reason << "\n";
    return;
  }
  out << "decode loop: " << decode.model << " " << to_string(decode.layout) << ", "
      << seq_text(decode.sequences) << " growing one token per step from " << decode.start_tokens
      << " to " << decode.final_tokens << " tokens; " << decode.warmup_steps << " warm-up + "
      << decode.steps << " timed steps; per step a spin kernel of " << decode.kernel_us
      << " us reads " << format_bytes(decode.read_bytes)
      << " of slot 0, every sequence's ensure(+1 token) runs, then the stream is synchronized\n";
  TextTable table(
      {"variant", "ahead", "p50 us", "p99 us", "max us", "mean us", "committing", "ahead commits"},
      1);
  for (const DecodeVariant& v : decode.variants) {
    table.add({v.name, str(v.ahead_windows), fixed(v.step_us.p50, 1), fixed(v.step_us.p99, 1),
               fixed(v.step_us.max, 1), fixed(v.step_us.mean, 1), str(v.ensures_committing),
               str(v.ahead_commits)});
  }
  table.print(out);
  for (const DecodeRatio& ratio : decode.ratios) {
    out << ratio.name << " = " << fixed(ratio.value, 3);
    if (ratio.goal) {
      out << " (goal <= " << fixed(*ratio.goal, 2) << "): " << (ratio.met ? "met" : "NOT met");
    }
    out << "\n";
  }
  out << "committing / ahead commits: ensures that had to map, and the worker's commits, during "
         "the timed steps\n";
}

}  // namespace

std::optional<std::uint64_t> bench_memory_bytes(const LayoutPlan& plan, std::uint32_t sequences,
                                                std::uint64_t tokens, std::uint32_t ahead) {
  const std::uint64_t max_windows = plan.fragment_stride / plan.granule;
  const std::uint64_t windows =
      std::min(plan.windows_per_fragment(tokens) + std::uint64_t{ahead}, max_windows);
  constexpr std::uint64_t kMax = std::numeric_limits<std::uint64_t>::max();
  std::uint64_t bytes = windows;
  for (const std::uint64_t factor : {plan.fragments, plan.granule, std::uint64_t{sequences}}) {
    if (factor != 0 && bytes > kMax / factor) return std::nullopt;
    bytes *= factor;
  }
  return bytes;
}

CLI::App* add_bench_command(CLI::App& app, BenchGrowthOptions& options) {
  CLI::App* bench = app.add_subcommand(
      "bench", "Measure kvvm on this machine's driver; 'kvvm bench growth --help' for one.");
  bench->require_subcommand(1);
  CLI::App* growth = bench->add_subcommand(
      "growth",
      "Per-token growth cost for every model x layout, commit-ahead off and on: time each "
      "Arena::ensure while sequences grow one token at a time; on a GPU also a decode loop "
      "comparing step-time p99 with growth against pre-committed memory (goal <= 1.02x).");
  add_backend_options(*growth, options.backend, options.device, options.host_granule,
                      "Host driver granule, a multiple of the page size (host backend; default "
                      "2M, so windows look like a GPU's)");
  growth
      ->add_option("--model", options.models,
                   "A built-in model or a config.json path; repeatable; 'all' = every built-in "
                   "geometry, beside any other named (default all)")
      ->allow_extra_args(false);
  growth->add_option("--layout", options.layout,
                     "head-major, seq-major, token-major or all (default all)");
  growth
      ->add_option("--tokens", options.tokens,
                   "Tokens each sequence grows to, also the max context (default 4096; K = 1024)")
      ->transform(token_count_validator());
  growth->add_option("--sequences", options.sequences, "Sequences growing at once (default 8)")
      ->transform(count_validator(1, kMaxBenchSequences));
  growth
      ->add_option("--ahead", options.ahead,
                   "Commit-ahead windows per fragment; rows for 0 and this (default 2)")
      ->transform(count_validator(1, kMaxBenchAhead));
  growth->add_option("--steps", options.steps, "Timed decode-loop steps (default 512)")
      ->transform(count_validator(1, kMaxBenchSteps));
  growth
      ->add_option("--kernel-us", options.kernel_us,
                   "Decode-loop kernel time per step in microseconds (default 200)")
      ->transform(count_validator(1, kMaxKernelUs));
  growth->add_flag("--json", options.json, "Machine-readable output (JSON) on stdout");
  growth->footer(
      "ensure times are per call (one token of one sequence) in nanoseconds; step times in "
      "microseconds; p50/p99 interpolate linearly between ranks (numpy.percentile's default).");
  return growth;
}

Result<BenchGrowthReport> run_growth_benchmark(Driver& driver, const BenchGrowthOptions& options) {
  KVVM_ASSIGN_OR_RETURN(Request request, resolve_request(options));
  BenchGrowthReport report;
  report.driver = driver.info();
  report.granule = driver.granule();
  report.tokens = options.tokens;
  report.sequences = options.sequences;
  report.ahead = options.ahead;
  for (const Geometry& geometry : request.models) {
    for (const Layout layout : request.layouts) {
      Result<LayoutPlan> plan = plan_layout(geometry, layout, report.granule, options.tokens);
      if (!plan.ok()) return plan.status().with_context(geometry.name);
      for (const std::uint32_t ahead : {std::uint32_t{0}, options.ahead}) {
        GrowthRow row;
        row.model = geometry.name;
        row.layout = layout;
        row.ahead_windows = ahead;
        row.fragments = plan->fragments;
        row.bytes_per_token = plan->bytes_per_token;
        const std::optional<std::uint64_t> needed =
            bench_memory_bytes(*plan, options.sequences, options.tokens, ahead);
        const DriverInfo now = driver.info();  // free memory as it is now, after earlier rows
        const std::uint64_t usable = usable_memory(now);
        if (!needed || *needed > usable) {
          row.skipped = "needs " + (needed ? format_bytes(*needed) : "over 2^64 B") + " for " +
                        seq_text(options.sequences) + " of " + str(options.tokens) + " tokens (" +
                        str(plan->fragments) + " fragments x " + format_bytes(report.granule) +
                        " granules); " + format_bytes(usable) + " usable of " +
                        format_bytes(now.free_bytes) + " free";
        } else {
          row.memory_bytes = *needed;
          KVVM_RETURN_IF_ERROR(measure_growth(driver, *plan, options, row));
        }
        report.rows.push_back(std::move(row));
      }
    }
  }
  if (report.driver.backend != "cuda" || !decode_loop_built()) {
    report.decode.reason = kDecodeNeedsKernels;
    return report;
  }
  Result<DecodeReport> decode =
      run_decode_loop(driver, request.decode_model, request.decode_layout, options);
  if (!decode.ok()) return decode.status().with_context("decode loop");
  report.decode = std::move(decode).value();
  return report;
}

nlohmann::ordered_json bench_growth_json(const BenchGrowthReport& report) {
  nlohmann::ordered_json json;
  json["benchmark"] = "growth";
  json["backend"] = report.driver.backend;
  json["device"] = {{"name", report.driver.device_name}, {"ordinal", report.driver.device_ordinal}};
  json["granule_bytes"] = report.granule;
  json["tokens"] = report.tokens;
  json["sequences"] = report.sequences;
  json["ahead_windows"] = {0, report.ahead};
  nlohmann::ordered_json rows = nlohmann::ordered_json::array();
  for (const GrowthRow& row : report.rows) {
    nlohmann::ordered_json item;
    item["model"] = row.model;
    item["layout"] = to_string(row.layout);
    item["ahead_windows"] = row.ahead_windows;
    item["fragments"] = row.fragments;
    item["bytes_per_token"] = row.bytes_per_token;
    item["memory_bytes"] = row.memory_bytes;
    item["skipped"] = row.skipped.has_value();
    if (row.skipped) {
      item["reason"] = *row.skipped;
    } else {
      item["ensures"] = row.ensures;
      item["ensures_committing"] = row.ensures_committing;
      item["ahead_commits"] = row.ahead_commits;
      item["committed_bytes"] = row.committed_bytes;
      item["driver_calls"] = {{"create", row.driver_calls.create},
                              {"map", row.driver_calls.map},
                              {"set_access", row.driver_calls.set_access},
                              {"unmap", row.driver_calls.unmap},
                              {"release", row.driver_calls.release}};
      item["ensure_ns"] = latency_json(row.ensure_ns);
    }
    rows.push_back(std::move(item));
  }
  json["growth"] = std::move(rows);
  const DecodeReport& decode = report.decode;
  nlohmann::ordered_json loop;
  loop["ran"] = decode.ran;
  if (!decode.ran) {
    loop["reason"] = decode.reason;
  } else {
    loop["model"] = decode.model;
    loop["layout"] = to_string(decode.layout);
    loop["sequences"] = decode.sequences;
    loop["start_tokens"] = decode.start_tokens;
    loop["final_tokens"] = decode.final_tokens;
    loop["warmup_steps"] = decode.warmup_steps;
    loop["steps"] = decode.steps;
    loop["kernel_us"] = decode.kernel_us;
    loop["read_bytes"] = decode.read_bytes;
    nlohmann::ordered_json variants = nlohmann::ordered_json::array();
    for (const DecodeVariant& v : decode.variants) {
      variants.push_back({{"name", v.name},
                          {"growth", v.growth},
                          {"ahead_windows", v.ahead_windows},
                          {"step_us", latency_json(v.step_us)},
                          {"ensures_committing", v.ensures_committing},
                          {"ahead_commits", v.ahead_commits}});
    }
    loop["variants"] = std::move(variants);
    nlohmann::ordered_json ratios = nlohmann::ordered_json::array();
    for (const DecodeRatio& ratio : decode.ratios) {
      nlohmann::ordered_json item{{"name", ratio.name}, {"value", ratio.value}};
      if (ratio.goal) {
        item["goal"] = *ratio.goal;
        item["met"] = ratio.met;
      }
      ratios.push_back(std::move(item));
    }
    loop["ratios"] = std::move(ratios);
  }
  json["decode_loop"] = std::move(loop);
  return json;
}

void print_bench_growth(const BenchGrowthReport& report, std::ostream& out) {
  out << "kvvm bench growth: " << report.driver.backend << " backend (" << report.driver.device_name
      << "), granule " << format_bytes(report.granule) << "\n";
  out << "growth: " << seq_text(report.sequences) << " admitted with 1 token, grown one token "
      << "per step (round-robin) to " << report.tokens << " tokens; commit-ahead 0 and "
      << report.ahead << " windows per fragment\n\n";
  TextTable table(
      {"model", "layout", "ahead", "fragments", "memory", "ensures", "committing", "ahead commits",
       "create", "map", "set_access", "mean ns", "p50 ns", "p99 ns", "max ns"},
      2);
  for (const GrowthRow& row : report.rows) {
    std::vector<std::string> cells{row.model, std::string(to_string(row.layout)),
                                   str(row.ahead_windows), str(row.fragments)};
    if (row.skipped) {
      table.add(std::move(cells), "skipped: " + *row.skipped);
      continue;
    }
    for (std::string cell :
         {format_bytes(row.memory_bytes), str(row.ensures), str(row.ensures_committing),
          str(row.ahead_commits), str(row.driver_calls.create), str(row.driver_calls.map),
          str(row.driver_calls.set_access), fixed(row.ensure_ns.mean, 0),
          fixed(row.ensure_ns.p50, 0), fixed(row.ensure_ns.p99, 0), fixed(row.ensure_ns.max, 0)}) {
      cells.push_back(std::move(cell));
    }
    table.add(std::move(cells));
  }
  table.print(out);
  out << "\nper ensure = per token of one sequence, in ns (steady_clock around the call); "
         "memory = the tier limit (every sequence at full length plus commit-ahead); "
         "committing = ensures that had to map; create/map/set_access = driver calls during "
         "admission and growth, commit-ahead included\n\n";
  print_decode(report.decode, out);
}

int run_bench_growth(const BenchGrowthOptions& options, std::ostream& out, std::ostream& err) {
  const auto fail = [&err](const Status& status, int code) {
    err << "kvvm bench growth: " << status.to_string() << "\n";
    return code;
  };
  // Refuse a bad command line before opening (and initializing) any driver.
  if (Result<Request> request = resolve_request(options); !request.ok()) {
    return fail(request.status(), kExitUsage);
  }
  Result<std::unique_ptr<Driver>> driver =
      open_driver(options.backend, options.device, options.host_granule, "kvvm bench", err);
  if (!driver.ok()) {
    const StatusCode code = driver.status().code();
    const bool usage = code == StatusCode::kUnavailable || code == StatusCode::kInvalidArgument;
    return fail(driver.status(), usage ? kExitUsage : kExitFailure);
  }
  Result<BenchGrowthReport> report = run_growth_benchmark(**driver, options);
  if (!report.ok()) return fail(report.status(), kExitFailure);
  const bool any_ran = std::any_of(report->rows.begin(), report->rows.end(),
                                   [](const GrowthRow& row) { return !row.skipped; });
  if (options.json) {
    out << dump_json(bench_growth_json(*report)) << "\n";
  } else {
    print_bench_growth(*report, out);
  }
  if (!any_ran) {
    return fail(Status::ResourceExhausted("no model x layout combination fits in the usable "
                                          "memory (see the reasons above)",
                                          Exhaustion{}),
                kExitFailure);
  }
  return kExitOk;
}

}  // namespace kvvm::cli
