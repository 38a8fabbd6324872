#include "sim/report.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <ostream>
#include <sstream>
#include <string_view>

#include "kit/byte_size.h"
#include "kit/text_table.h"

namespace kvvm::cli {
namespace {

std::string percent(double ratio) { return fixed(ratio * 100.0, 2) + " %"; }

std::uint64_t commits(const ArenaStats& stats) {
  std::uint64_t total = 0;
  for (std::uint64_t count : stats.commit_latency_us_log2) total += count;
  return total;
}

nlohmann::ordered_json run_json(const RunSummary& run) {
  return {
      {"name", run.name},
      {"requests", run.requests},
      {"admitted", run.admitted},
      {"queued", run.queued},
      {"rejected", run.rejected},
      {"rejected_too_large", run.rejected_too_large},
      {"completed", run.completed},
      {"aborted", run.aborted},
      {"preemptions", run.preemptions},
      {"peak_concurrency", run.peak_concurrency},
      {"mean_concurrency", run.mean_concurrency},
      {"mean_wait_s", run.mean_wait_s},
      {"p99_wait_s", run.p99_wait_s},
      {"steps", run.steps},
      {"simulated_s", run.simulated_s},
      {"peak_committed_bytes", run.peak_committed},
      {"mean_committed_bytes", run.mean_committed},
      {"peak_live_bytes", run.peak_live},
      {"mean_live_bytes", run.mean_live},
      {"waste_ratio", run.waste_ratio},
      {"peak_used_bytes", run.peak_used},
      {"peak_saved_bytes", run.peak_saved},
      {"mean_saved_bytes", run.mean_saved},
      {"abandoned", run.abandoned},
      {"prefix_cache", run.cache.enabled
                           ? nlohmann::ordered_json{{"queries", run.cache.queries},
                                                    {"hits", run.cache.hits},
                                                    {"hit_rate", run.cache.hit_rate()},
                                                    {"saved_bytes", run.cache.saved_bytes()},
                                                    {"evictions", run.cache.evictions},
                                                    {"published", run.cache.published},
                                                    {"cached_bytes_at_end", run.cache.cached_bytes}}
                           : nlohmann::ordered_json()}};
}

const RunSummary* find_run(const SimulateReport& report, const std::string& name) {
  for (const RunSummary& run : report.runs) {
    if (run.name == name) return &run;
  }
  return nullptr;
}

// A column name: '-' dropped, '+' as '_' (paged-16+cache: paged16_cache).
std::string column_name(std::string name) {
  std::erase(name, '-');
  std::replace(name.begin(), name.end(), '+', '_');
  return name;
}

// Single quotes for gnuplot strings (a quote inside is doubled) and for sh (closed, escaped,
// reopened).
std::string gnuplot_quote(const std::string& text) {
  std::string quoted = "'";
  for (char c : text) quoted += c == '\'' ? std::string("''") : std::string(1, c);
  return quoted + "'";
}
std::string shell_quote(const std::string& text) {
  std::string quoted = "'";
  for (char c : text) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return quoted + "'";
}

// The program's path: as given when it names a path, else the first executable on PATH.
std::optional<std::string> find_program(const std::string& name) {
  if (name.find('/') != std::string::npos) {
    if (::access(name.c_str(), X_OK) == 0) return name;
    return std::nullopt;
  }
  const char* path = std::getenv("PATH");
  std::stringstream dirs(path == nullptr ? "/usr/bin:/bin" : path);
  std::string dir;
  while (std::getline(dirs, dir, ':')) {
    const std::string candidate = (dir.empty() ? "." : dir) + "/" + name;
    if (::access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return std::nullopt;
}

}  // namespace

double histogram_percentile_us(const std::vector<std::uint64_t>& buckets, double q) {
  std::uint64_t total = 0;
  for (std::uint64_t count : buckets) total += count;
  if (total == 0) return 0;
  const double wanted = q / 100.0 * static_cast<double>(total);
  std::uint64_t seen = 0;
  for (std::size_t i = 0; i < buckets.size(); ++i) {
    seen += buckets[i];
    if (static_cast<double>(seen) >= wanted) return static_cast<double>(std::uint64_t{2} << i);
  }
  return static_cast<double>(std::uint64_t{2} << (buckets.size() - 1));
}

nlohmann::ordered_json simulate_json(const SimulateReport& report) {
  const Geometry& g = report.plan.geometry;
  nlohmann::ordered_json json;
  json["backend"] = report.driver.backend;
  json["device"] = report.driver.device_name;
  json["model"] = {{"name", g.name},
                   {"layers", g.layers},
                   {"kv_heads", g.kv_heads},
                   {"head_dim", g.head_dim},
                   {"dtype", to_string(g.dtype)},
                   {"bytes_per_token", g.bytes_per_token()}};
  json["layout"] = to_string(report.plan.layout);
  json["granule_bytes"] = report.granule;
  json["max_context_tokens"] = report.plan.max_context;
  json["budget_bytes"] = report.budget;
  json["requested_budget_bytes"] = report.requested_budget;
  json["max_slots"] = report.max_slots;
  json["sharing"] = report.sharing;
  json["step_s"] = report.step_s;
  json["max_queue_wait_s"] = report.max_queue_wait_s;
  const TraceFigures& t = report.trace;
  json["trace"] = {{"source", t.source},
                   {"requests", t.requests},
                   {"prefix_groups", t.prefix_groups},
                   {"skipped_lines", t.skipped_lines},
                   {"mean_prompt_tokens", t.mean_prompt_tokens},
                   {"mean_output_tokens", t.mean_output_tokens},
                   {"max_prompt_tokens", t.max_prompt_tokens},
                   {"max_output_tokens", t.max_output_tokens},
                   {"last_arrival_s", t.last_arrival_s}};
  json["preallocate_capacity"] = report.preallocate_capacity;
  nlohmann::ordered_json systems = nlohmann::ordered_json::array();
  for (const RunSummary& run : report.runs) systems.push_back(run_json(run));
  json["systems"] = std::move(systems);
  const ArenaModelReport& k = report.kvvm;
  const auto calls = [&](DriverOp op) { return k.calls.of(op); };
  nlohmann::ordered_json kvvm = {
      {"driver_calls",
       {{"create", calls(DriverOp::kCreate)},
        {"map", calls(DriverOp::kMap)},
        {"set_access", calls(DriverOp::kSetAccess)},
        {"unmap", calls(DriverOp::kUnmap)},
        {"release", calls(DriverOp::kRelease)},
        {"total", k.calls.total()}}},
      {"commits", commits(k.arena)},
      {"commit_us_p50", histogram_percentile_us(k.arena.commit_latency_us_log2, 50)},
      {"commit_us_p99", histogram_percentile_us(k.arena.commit_latency_us_log2, 99)},
      {"arena_calls", k.arena_calls},
      {"arena_call_seconds", k.arena_call_seconds},
      {"shared_admissions", k.shared_admissions},
      {"publishes", k.publishes},
      {"publish_refusals", k.publish_refusals}};
  if (k.publish_refusals > 0) kvvm["publish_refusal_reason"] = k.publish_refusal_reason;
  kvvm["stale_prefixes"] = k.stale_prefixes;
  kvvm["refused_budget"] = k.refused_budget;
  kvvm["refused_slots"] = k.refused_slots;
  kvvm["grow_refusals"] = k.grow_refusals;
  kvvm["reused_admissions"] = k.arena.reused_admissions;
  kvvm["tier"] = {{"limit", k.tier.limit},
                  {"peak", k.tier.peak},
                  {"refusals", k.tier.refusals},
                  {"reclaimed", k.tier.reclaimed}};
  kvvm["pool"] = {{"pooled_bytes", k.pool.pooled_bytes},
                  {"creates", k.pool.creates},
                  {"releases", k.pool.releases},
                  {"hits", k.pool.pool_hits}};
  json["kvvm"] = std::move(kvvm);
  if (report.kvvm_cache) {
    const ArenaModelReport& c = *report.kvvm_cache;
    json["kvvm_cache"] = {{"driver_calls", c.calls.total()},
                          {"arena_calls", c.arena_calls},
                          {"arena_call_seconds", c.arena_call_seconds},
                          {"refused_budget", c.refused_budget},
                          {"grow_refusals", c.grow_refusals},
                          {"tier",
                           {{"limit", c.tier.limit},
                            {"peak", c.tier.peak},
                            {"refusals", c.tier.refusals},
                            {"reclaimed", c.tier.reclaimed}}}};
  }
  json["wall_s"] = report.wall_s;
  return json;
}

void print_simulate(const SimulateReport& report, std::ostream& out) {
  const Geometry& g = report.plan.geometry;
  const TraceFigures& t = report.trace;
  out << "kvvm simulate: " << g.name << " (" << to_string(g.dtype) << " KV, "
      << format_bytes(g.bytes_per_token()) << " per token), " << to_string(report.plan.layout)
      << ", granule " << format_bytes(report.granule) << ", max context " << report.plan.max_context
      << " tokens\n";
  out << "backend " << report.driver.backend << " (" << report.driver.device_name << "); budget "
      << format_bytes(report.budget);
  if (report.budget != report.requested_budget) {
    out << " (asked " << format_bytes(report.requested_budget)
        << ", capped: see the note on stderr)";
  }
  out << "; sharing " << (report.sharing ? "on" : "off") << "; step " << fixed(report.step_s, 3)
      << " s; rejected after " << fixed(report.max_queue_wait_s, 1) << " s in the queue\n";
  out << "trace: " << t.source << ": " << t.requests << " requests over "
      << fixed(t.last_arrival_s, 1) << " s, " << t.prefix_groups << " prefix groups, prompt "
      << fixed(t.mean_prompt_tokens, 1) << " tokens mean (max " << t.max_prompt_tokens
      << "), output " << fixed(t.mean_output_tokens, 1) << " mean (max " << t.max_output_tokens
      << ")";
  if (t.skipped_lines > 0) out << "; " << t.skipped_lines << " malformed lines skipped";
  out << "\n\n";

  struct Row {
    std::string label;
    std::vector<std::string> values;
  };
  std::vector<Row> rows;
  const auto add = [&](std::string label, auto value_of) {
    Row row{std::move(label), {}};
    for (const RunSummary& run : report.runs) row.values.push_back(value_of(run));
    rows.push_back(std::move(row));
  };
  using R = const RunSummary&;
  add("admitted", [](R r) { return str(r.admitted); });
  add("queued (waited >= 1 step)", [](R r) { return str(r.queued); });
  add("rejected (429)", [](R r) { return str(r.rejected); });
  add("  of which too large for the budget", [](R r) { return str(r.rejected_too_large); });
  add("completed", [](R r) { return str(r.completed); });
  add("preemptions (recomputed)", [](R r) { return str(r.preemptions); });
  add("aborted (cannot grow even alone)", [](R r) { return str(r.aborted); });
  add("peak concurrency", [](R r) { return str(r.peak_concurrency); });
  add("mean concurrency (while arriving)", [](R r) { return fixed(r.mean_concurrency, 1); });
  add("queue wait mean / p99 (s)",
      [](R r) { return fixed(r.mean_wait_s, 2) + " / " + fixed(r.p99_wait_s, 2); });
  add("peak committed", [](R r) { return format_bytes(r.peak_committed); });
  add("mean committed (while arriving)",
      [](R r) { return format_bytes(static_cast<std::uint64_t>(r.mean_committed)); });
  add("mean live (while arriving)",
      [](R r) { return format_bytes(static_cast<std::uint64_t>(r.mean_live)); });
  add("waste (committed - live) / live", [](R r) { return percent(r.waste_ratio); });
  add("peak saved by sharing", [](R r) { return format_bytes(r.peak_saved); });
  add("mean saved by sharing (while arriving)",
      [](R r) { return format_bytes(static_cast<std::uint64_t>(r.mean_saved)); });
  add("peak budget used", [](R r) { return format_bytes(r.peak_used); });
  add("simulated time (s)", [](R r) { return fixed(r.simulated_s, 1); });
  bool cached = false, closed_loop = false;
  for (const RunSummary& run : report.runs) {
    cached = cached || run.cache.enabled;
    closed_loop = closed_loop || run.abandoned > 0;
  }
  if (closed_loop) {
    add("turns abandoned (an earlier turn failed)", [](R r) { return str(r.abandoned); });
  }
  if (cached) {
    const auto cache_value = [&](auto value_of) {
      return [value_of](R r) { return r.cache.enabled ? value_of(r.cache) : std::string("-"); };
    };
    using C = const CacheFigures&;
    add("prefix cache hit rate (hits / queries)",
        cache_value([](C c) { return percent(c.hit_rate()); }));
    add("  hit tokens", cache_value([](C c) { return str(c.hits); }));
    add("  prompt tokens looked up", cache_value([](C c) { return str(c.queries); }));
    add("  KV not recomputed (hits x bytes/token)",
        cache_value([](C c) { return format_bytes(c.saved_bytes()); }));
    add("  entered the cache (windows / blocks)",
        cache_value([](C c) { return str(c.published); }));
    add("  evicted (windows / blocks)", cache_value([](C c) { return str(c.evictions); }));
  }

  std::size_t label_width = 0;
  std::vector<std::size_t> widths;
  for (const RunSummary& run : report.runs) widths.push_back(run.name.size());
  for (const Row& row : rows) {
    label_width = std::max(label_width, row.label.size());
    for (std::size_t i = 0; i < row.values.size(); ++i) {
      widths[i] = std::max(widths[i], row.values[i].size());
    }
  }
  out << pad_right("", label_width);
  for (std::size_t i = 0; i < report.runs.size(); ++i) {
    out << "  " << pad_left(report.runs[i].name, widths[i]);
  }
  out << "\n";
  for (const Row& row : rows) {
    out << pad_right(row.label, label_width);
    for (std::size_t i = 0; i < row.values.size(); ++i) {
      out << "  " << pad_left(row.values[i], widths[i]);
    }
    out << "\n";
  }

  const ArenaModelReport& k = report.kvvm;
  const auto calls = [&](DriverOp op) { return str(k.calls.of(op)); };
  out << "\nkvvm: driver calls " << k.calls.total() << " (create " << calls(DriverOp::kCreate)
      << ", map " << calls(DriverOp::kMap) << ", set_access " << calls(DriverOp::kSetAccess)
      << ", unmap " << calls(DriverOp::kUnmap) << ", release " << calls(DriverOp::kRelease) << "); "
      << commits(k.arena) << " commits, p50 <= "
      << fixed(histogram_percentile_us(k.arena.commit_latency_us_log2, 50), 0)
      << " us, p99 <= " << fixed(histogram_percentile_us(k.arena.commit_latency_us_log2, 99), 0)
      << " us; " << fixed(k.arena_call_seconds, 2) << " s wall in " << k.arena_calls
      << " arena calls\n";
  out << "kvvm: " << k.shared_admissions << " shared admissions, " << k.publishes
      << " prefixes published, " << k.stale_prefixes << " found stale and published again, "
      << k.publish_refusals << " publish refusals";
  if (k.publish_refusals > 0) out << " (" << k.publish_refusal_reason << ")";
  out << "; admissions refused for budget " << k.refused_budget << ", for slots " << k.refused_slots
      << "; growth refused " << k.grow_refusals << "\n";
  out << "kvvm: budget tier peak " << format_bytes(k.tier.peak) << " of "
      << format_bytes(k.tier.limit) << ", " << format_bytes(k.tier.reclaimed)
      << " reclaimed under pressure; pool " << k.pool.creates << " creates, " << k.pool.pool_hits
      << " hits\n";
  if (report.kvvm_cache) {
    const ArenaModelReport& c = *report.kvvm_cache;
    out << "kvvm+cache: driver calls " << c.calls.total() << "; " << fixed(c.arena_call_seconds, 2)
        << " s wall in " << c.arena_calls << " arena and cache calls; budget tier peak "
        << format_bytes(c.tier.peak) << ", " << format_bytes(c.tier.reclaimed)
        << " reclaimed under pressure (cache evictions, pool)\n";
  }
  out << "preallocate capacity: floor(budget / (max context x bytes per token)) = floor("
      << format_bytes(report.budget) << " / (" << report.plan.max_context << " x "
      << format_bytes(g.bytes_per_token()) << ")) = " << report.preallocate_capacity
      << " sequences\n";
  const auto ratio = [](double a, double b) {
    return b == 0 ? std::string("n/a") : fixed(a / b, 2) + "x";
  };
  // kvvm against each baseline (the systems that are not kvvm's), in the table's order.
  const RunSummary* kvvm = find_run(report, "kvvm");
  std::vector<const RunSummary*> baselines;
  for (const RunSummary& run : report.runs) {
    if (run.name.rfind("kvvm", 0) != 0) baselines.push_back(&run);
  }
  if (kvvm != nullptr && !baselines.empty()) {
    const auto against = [&](const char* what, auto figure) {
      out << "kvvm " << what << ": ";
      for (std::size_t i = 0; i < baselines.size(); ++i) {
        out << (i == 0 ? "" : ", ") << ratio(figure(*kvvm), figure(*baselines[i])) << " "
            << baselines[i]->name << "'s";
      }
      out << "\n";
    };
    against("peak concurrency", [](R r) { return static_cast<double>(r.peak_concurrency); });
    against("mean concurrency", [](R r) { return r.mean_concurrency; });
    against("completed", [](R r) { return static_cast<double>(r.completed); });
  }
  const RunSummary* kc = find_run(report, "kvvm+cache");
  const RunSummary* pc = find_run(report, "paged-16+cache");
  if (kc != nullptr && pc != nullptr) {
    const double hits = static_cast<double>(kc->cache.hits);
    const double base = static_cast<double>(pc->cache.hits);
    out << "kvvm+cache vs paged-16+cache: hit tokens " << ratio(hits, base) << " ("
        << (base == 0 ? std::string("n/a") : fixed((hits - base) / base * 100.0, 2) + " %")
        << "), peak concurrency " << ratio(kc->peak_concurrency, pc->peak_concurrency)
        << ", mean concurrency " << ratio(kc->mean_concurrency, pc->mean_concurrency) << "\n";
  }
  out << "committed: mapped under running sequences, a shared window once per sequence mapping "
         "it; budget used: physical bytes charged (shared ones once, pooled handles included).\n"
         "waste: committed beyond the live tokens' bytes, over live, summed over every step. "
         "Means: over the steps while requests arrive.\nwall time "
      << fixed(report.wall_s, 1) << " s\n";
}

void write_series_csv(const SimulateReport& report, std::ostream& out) {
  out << "step,time_s";
  for (const RunSummary& run : report.runs) {
    const std::string name = column_name(run.name);
    for (const char* column :
         {"running", "queued", "committed_bytes", "live_bytes", "saved_bytes"}) {
      out << "," << name << "_" << column;
    }
  }
  out << "\n";
  std::uint64_t steps = 0;
  for (const RunSummary& run : report.runs)
    steps = std::max<std::uint64_t>(steps, run.series.size());
  for (std::uint64_t step = 0; step < steps; ++step) {
    out << step << "," << fixed(static_cast<double>(step) * report.step_s, 3);
    for (const RunSummary& run : report.runs) {
      const StepSample sample = step < run.series.size() ? run.series[step] : StepSample{};
      out << "," << sample.running << "," << sample.queued << "," << sample.committed << ","
          << sample.live << "," << sample.saved;
    }
    out << "\n";
  }
}

Status plot_series(const SimulateReport& report, const std::string& png,
                   const std::string& gnuplot) {
  const std::optional<std::string> program = find_program(gnuplot);
  if (!program) {
    return Status::Unavailable("--plot needs gnuplot ('" + gnuplot +
                               "' not found on PATH); on Debian: apt-get install gnuplot-nox");
  }
  namespace fs = std::filesystem;
  std::error_code ignored;
  const fs::path dir = fs::temp_directory_path(ignored) /
                       ("kvvm-plot-" + std::to_string(::getpid()) + "-" +
                        std::to_string(reinterpret_cast<std::uintptr_t>(&report)));
  fs::create_directories(dir, ignored);
  const std::string data = (dir / "series.csv").string();
  const std::string script = (dir / "plot.gp").string();
  const std::string log = (dir / "gnuplot.log").string();
  {
    std::ofstream csv(data);
    write_series_csv(report, csv);
    std::ofstream gp(script);
    gp << "set terminal png size 1200,900\n"
       << "set output " << gnuplot_quote(png) << "\n"
       << "set datafile separator ','\n"
       << "set key top right\nset grid\n"
       << "set multiplot layout 2,1 title "
       << gnuplot_quote("kvvm simulate: " + report.plan.geometry.name + ", budget " +
                        format_bytes(report.budget) + ", max context " +
                        std::to_string(report.plan.max_context))
       << "\n"
       << "set xlabel 'simulated time (s)'\nset ylabel 'running sequences'\n"
       << "plot ";
    // The baselines first, so kvvm's line is drawn on top where they coincide.
    std::vector<std::size_t> order;
    for (std::size_t i = 1; i < report.runs.size(); ++i) order.push_back(i);
    if (!report.runs.empty()) order.push_back(0);
    const auto plot = [&](const std::string& column) {
      for (std::size_t n = 0; n < order.size(); ++n) {
        const std::size_t i = order[n];
        gp << (n == 0 ? gnuplot_quote(data) : std::string("''")) << " using 2:"
           << (column.empty() ? std::to_string(3 + 5 * i)
                              : "($" + std::to_string(5 + 5 * i) + column + ")")
           << " every ::1 with lines lw 2 title " << gnuplot_quote(report.runs[i].name)
           << (n + 1 < order.size() || !column.empty() ? ", " : "\n");
      }
    };
    plot("");
    gp << "set ylabel 'committed memory (GiB)'\nplot ";
    plot("/1073741824");
    gp << "'' using 2:($6/1073741824) every ::1 with lines dt 2 title 'kvvm live'\n"
       << "unset multiplot\n";
  }
  const std::string command =
      shell_quote(*program) + " " + shell_quote(script) + " >" + shell_quote(log) + " 2>&1";
  const int status = std::system(command.c_str());
  std::string output;
  {
    std::ifstream in(log);
    std::stringstream text;
    text << in.rdbuf();
    output = text.str();
  }
  fs::remove_all(dir, ignored);
  if (status != 0) {
    return Status::Internal("gnuplot failed writing " + png + " (exit status " +
                            std::to_string(status) + "): " + output);
  }
  return Status::Ok();
}

}  // namespace kvvm::cli
