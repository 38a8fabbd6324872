// `kvvm bench share`: see bench/drivers/memory/share.h.
#include "bench/drivers/memory/share.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "kit/byte_size.h"
#include "kit/model_loading.h"  // resolve_model_geometry
#include "kit/text_table.h"
#include "kit/value_parsers.h"
#include "kvvm/kv/arena.h"
#include "kvvm/kv/arena_stack.h"
#include "kvvm/kv/geometry.h"
#include "kvvm/kv/layout.h"

namespace kvvm::cli {
namespace {

double elapsed_us(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start)
      .count();
}

std::string mib(std::uint64_t bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f MiB", static_cast<double>(bytes) / (1 << 20));
  return text;
}

// The boundary bytes (per fragment) a prefix of `tokens` leaves in its partial window.
std::uint64_t boundary_of(const LayoutPlan& plan, std::uint64_t tokens) {
  return tokens * plan.contiguous_bytes_per_token % plan.granule;
}

struct Rig {
  std::unique_ptr<Driver> driver;
  std::unique_ptr<ArenaStack> stack;
  Arena* arena = nullptr;  // stack's
};

Status make_rig(Rig& rig, const LayoutPlan& plan, std::uint32_t slots, std::uint64_t budget) {
  KVVM_ASSIGN_OR_RETURN(
      auto stack,
      ArenaStack::create(
          *rig.driver, ArenaStackOptions{.tier_name = "bench share",
                                         .budget_bytes = budget,
                                         .pool = PoolOptions{.max_pooled_bytes = 64 * plan.granule},
                                         .arena = ArenaOptions{.plan = plan, .max_slots = slots}}));
  rig.stack = std::move(stack);
  rig.arena = &rig.stack->arena();
  return Status::Ok();
}

Result<ShareSavings> measure_savings(Arena& arena, const BenchShareOptions& options) {
  const LayoutPlan& plan = arena.plan();
  auto owner = arena.admit(options.prefix + options.extra);
  if (!owner.ok()) return owner.status().with_context("the publisher");
  KVVM_ASSIGN_OR_RETURN(auto prefix, arena.publish(*owner, options.prefix));
  std::vector<SlotId> slots{*owner};
  for (std::uint32_t i = 1; i < options.sequences; ++i) {
    auto sharer = arena.admit_shared(*prefix, options.prefix + options.extra);
    if (!sharer.ok()) return sharer.status().with_context("sharer " + std::to_string(i));
    slots.push_back(*sharer);
  }
  const ArenaStats stats = arena.stats();
  ShareSavings savings;
  savings.model = plan.geometry.name;
  savings.layout = std::string(to_string(plan.layout));
  savings.granule = plan.granule;
  savings.prefix_tokens = options.prefix;
  savings.sequences = options.sequences;
  savings.shared_windows = prefix->info().windows_per_fragment;
  savings.committed_bytes = stats.committed_bytes;
  savings.physical_bytes = stats.physical_bytes;
  savings.saved_bytes = stats.shared_saved_bytes;
  savings.predicted_saved_bytes = (options.sequences - 1) * prefix->info().shared_bytes;
  savings.boundary_bytes = prefix->info().boundary_bytes;
  for (SlotId slot : slots) KVVM_RETURN_IF_ERROR(arena.release(slot));
  return savings;
}

// Times `step` `repetitions` times, with `setup` (untimed) before each.
Result<TimingSummary> time_each(std::uint32_t repetitions, const std::function<Status()>& setup,
                                const std::function<Status()>& step) {
  std::vector<double> samples;
  for (std::uint32_t i = 0; i < repetitions; ++i) {
    KVVM_RETURN_IF_ERROR(setup());
    const auto start = std::chrono::steady_clock::now();
    KVVM_RETURN_IF_ERROR(step());
    samples.push_back(elapsed_us(start));
  }
  return summarize(samples);
}

Result<ShareCosts> measure_costs(Arena& arena, Driver& driver, const BenchShareOptions& options) {
  const LayoutPlan& plan = arena.plan();
  ShareCosts costs;
  costs.fragments = plan.fragments;
  // Two prefixes near the requested length: one whose partial window is almost full, one
  // ending on (or nearest to) a window boundary.
  const std::uint64_t per_window =
      std::max<std::uint64_t>(1, plan.granule / plan.contiguous_bytes_per_token);
  std::uint64_t with = options.prefix, without = options.prefix;
  for (std::uint64_t p = options.prefix; p <= options.prefix + 2 * per_window + 2; ++p) {
    if (boundary_of(plan, p) > boundary_of(plan, with)) with = p;
    if (boundary_of(plan, p) < boundary_of(plan, without)) without = p;
  }
  const std::uint64_t longest = std::max(with, without) + 1;
  auto owner = arena.admit(longest);
  if (!owner.ok()) return owner.status().with_context("cost publisher");
  KVVM_ASSIGN_OR_RETURN(auto prefix_with, arena.publish(*owner, with));
  KVVM_ASSIGN_OR_RETURN(auto prefix_without, arena.publish(*owner, without));
  costs.boundary_bytes = prefix_with->info().boundary_bytes - prefix_without->info().boundary_bytes;
  // Both admissions commit one private window per fragment; only the copy differs.
  const auto admit_cost = [&](const SharedPrefix& prefix,
                              std::uint64_t tokens) -> Result<TimingSummary> {
    std::optional<SlotId> last;
    auto timed = time_each(
        options.repetitions, [&]() -> Status { return last ? arena.release(*last) : Status::Ok(); },
        [&]() -> Status {
          KVVM_ASSIGN_OR_RETURN(auto admitted, arena.admit_shared(prefix, tokens));
          last = admitted;
          return Status::Ok();
        });
    if (last) KVVM_RETURN_IF_ERROR(arena.release(*last));
    return timed;
  };
  // The copy alone: one granule between two mapped windows, then a fence waited for.
  {
    auto target = arena.admit(1);
    if (!target.ok()) return target.status().with_context("copy target");
    auto copy = time_each(
        options.repetitions, [] { return Status::Ok(); },
        [&]() -> Status {
          KVVM_RETURN_IF_ERROR(driver.copy(arena.slot_base(*target), arena.slot_base(*owner),
                                           plan.granule, nullptr));
          return driver.drain(nullptr);
        });
    if (!copy.ok()) return copy.status();
    costs.granule_copy = *copy;
    KVVM_RETURN_IF_ERROR(arena.release(*target));
  }
  KVVM_ASSIGN_OR_RETURN(auto a, admit_cost(*prefix_with, with));
  costs.admit_with_boundary = a;
  KVVM_ASSIGN_OR_RETURN(
      auto b, admit_cost(*prefix_without, boundary_of(plan, without) == 0 ? without + 1 : without));
  costs.admit_without_boundary = b;

  // Copy-on-write: a fresh child shares the owner's windows; rewinding to window 0 and
  // writing one token copies that window in every fragment.
  std::optional<SlotId> child;
  auto cow = time_each(
      options.repetitions,
      [&]() -> Status {
        if (child) KVVM_RETURN_IF_ERROR(arena.release(*child));
        KVVM_ASSIGN_OR_RETURN(auto forked, arena.fork(*owner, longest));
        child = forked;
        return arena.rewind(*child, 1);
      },
      [&]() -> Status { return arena.ensure(*child, 2); });
  if (!cow.ok()) return cow.status();
  costs.copy_on_write = *cow;
  if (child) KVVM_RETURN_IF_ERROR(arena.release(*child));
  // The same window when no one else maps it: republished, then written in place. On a GPU a
  // released child whose fence had not completed still maps the owner's windows: wait, then
  // reclaim those slots so the owner is alone.
  KVVM_RETURN_IF_ERROR(driver.synchronize());
  for (int tries = 0; tries < 4096 && arena.stats().finished_slots > 0; ++tries) {
    (void)arena.reclaim(1);
  }
  const std::uint64_t copies_before = arena.stats().cow_copies;
  auto in_place = time_each(
      options.repetitions,
      [&]() -> Status {
        KVVM_RETURN_IF_ERROR(arena.ensure(*owner, per_window + 2));
        auto published = arena.publish(*owner, per_window + 1);  // window 0 at least
        if (!published.ok()) return published.status();
        return arena.rewind(*owner, 1);
      },
      [&]() -> Status { return arena.ensure(*owner, 2); });
  if (!in_place.ok()) return in_place.status();
  costs.in_place = *in_place;
  costs.in_place_copies = arena.stats().cow_copies - copies_before;
  KVVM_RETURN_IF_ERROR(arena.release(*owner));
  return costs;
}

nlohmann::json timing_json(const TimingSummary& t) {
  return {{"samples", t.samples}, {"median_us", t.median_us}, {"p99_us", t.p99_us}};
}

}  // namespace

CLI::App* add_bench_share_command(CLI::App& bench, BenchShareOptions& options) {
  CLI::App* share = bench.add_subcommand(
      "share",
      "Prefix sharing through the real arena: physical memory saved by N sequences sharing a "
      "published prefix (against the layout arithmetic's prediction), and the cost per granule "
      "of the boundary copy (and the bare device copy), copy-on-write and an in-place write "
      "unlock, with pooled handles.");
  add_backend_options(*share, options.backend, options.device, options.host_granule,
                      "Host driver granule (host backend; default 2M, like a GPU's)");
  share->add_option("--model", options.model,
                    "A built-in model or a config.json path (default qwen2.5-14b)");
  share->add_option("--layout", options.layout,
                    "head-major, seq-major or token-major (default token-major)");
  share->add_option("--prefix", options.prefix, "Shared prefix tokens (default 2048; K = 1024)")
      ->transform(token_count_validator());
  share->add_option("--extra", options.extra, "Private tokens per sequence (default 256)")
      ->transform(token_count_validator());
  share
      ->add_option("--sequences", options.sequences,
                   "Sequences sharing the prefix, the publisher included (default 8)")
      ->transform(count_validator(2, 4096));
  share->add_option("--repetitions", options.repetitions, "Timed samples per cost (default 64)")
      ->transform(count_validator(1, 100000));
  share->add_flag("--json", options.json, "Print JSON instead of text");
  return share;
}

nlohmann::json bench_share_json(const ShareReport& report) {
  const ShareSavings& s = report.savings;
  const ShareCosts& c = report.costs;
  return {{"backend", report.backend},
          {"device", report.device},
          {"savings",
           {{"model", s.model},
            {"layout", s.layout},
            {"granule", s.granule},
            {"prefix_tokens", s.prefix_tokens},
            {"sequences", s.sequences},
            {"shared_windows_per_fragment", s.shared_windows},
            {"committed_bytes", s.committed_bytes},
            {"physical_bytes", s.physical_bytes},
            {"saved_bytes", s.saved_bytes},
            {"predicted_saved_bytes", s.predicted_saved_bytes},
            {"prediction_met", s.saved_bytes == s.predicted_saved_bytes},
            {"boundary_bytes_per_sharer", s.boundary_bytes}}},
          {"costs",
           {{"fragments", c.fragments},
            {"boundary_bytes", c.boundary_bytes},
            {"admit_with_boundary", timing_json(c.admit_with_boundary)},
            {"admit_without_boundary", timing_json(c.admit_without_boundary)},
            {"copy_on_write", timing_json(c.copy_on_write)},
            {"in_place", timing_json(c.in_place)},
            {"granule_copy", timing_json(c.granule_copy)},
            {"in_place_copies", c.in_place_copies}}}};
}

void print_bench_share(const ShareReport& report, std::ostream& out) {
  const ShareSavings& s = report.savings;
  const ShareCosts& c = report.costs;
  out << "kvvm bench share on " << report.backend << " (" << report.device << ")\n\n";
  out << "Savings: " << s.model << ", " << s.layout << ", granule " << mib(s.granule) << ", "
      << s.sequences << " sequences sharing a " << s.prefix_tokens << "-token prefix ("
      << s.shared_windows << " whole window(s) per fragment, " << s.boundary_bytes
      << " boundary bytes per sharer)\n";
  out << "  committed (every mapping)   " << mib(s.committed_bytes) << "\n";
  out << "  physical (each handle once) " << mib(s.physical_bytes) << "\n";
  out << "  saved                       " << mib(s.saved_bytes) << "\n";
  out << "  predicted (" << s.sequences - 1 << " x the prefix's whole windows) "
      << mib(s.predicted_saved_bytes)
      << (s.saved_bytes == s.predicted_saved_bytes ? "  -> equal\n" : "  -> DIFFERENT\n");
  out << "\nCosts (pooled handles; median / p99 us over " << c.copy_on_write.samples << " samples; "
      << c.fragments << " fragment(s) per window):\n";
  TextTable table({"  operation", "median us", "p99 us"}, 1);
  const auto row = [&](const char* name, const TimingSummary& t) {
    table.add({std::string("  ") + name, fixed(t.median_us, 1), fixed(t.p99_us, 1)});
  };
  row("admit_shared, boundary copied", c.admit_with_boundary);
  row("admit_shared, no boundary", c.admit_without_boundary);
  row("copy-on-write of one window", c.copy_on_write);
  row("in-place unlock of one window", c.in_place);
  row("device copy of one granule + fence", c.granule_copy);
  table.print(out);
  out << "  (copies made during the in-place runs: " << c.in_place_copies << ")\n";
  if (c.boundary_bytes > 0) {
    const double per_granule =
        (c.admit_with_boundary.median_us - c.admit_without_boundary.median_us) *
        static_cast<double>(s.granule) / static_cast<double>(c.boundary_bytes);
    out << "  boundary copy per granule (difference of medians, scaled from " << c.boundary_bytes
        << " bytes): " << fixed(per_granule, 1) << " us\n";
  }
  out << "  copy-on-write per granule: "
      << fixed(c.copy_on_write.median_us / static_cast<double>(c.fragments), 1) << " us\n";
}

int run_bench_share(const BenchShareOptions& options, std::ostream& out, std::ostream& err) {
  Result<Geometry> geometry = resolve_model_geometry(options.model, std::nullopt);
  Result<Layout> layout = parse_layout(options.layout);
  if (!geometry.ok() || !layout.ok()) {
    err << "kvvm bench share: " << (geometry.ok() ? layout.status() : geometry.status()).to_string()
        << "\n";
    return kExitUsage;
  }
  Rig rig;
  Result<std::unique_ptr<Driver>> driver =
      open_driver(options.backend, options.device, options.host_granule, "kvvm bench", err);
  if (!driver.ok()) {
    err << "kvvm bench share: " << driver.status().to_string() << "\n";
    return kExitUsage;
  }
  rig.driver = std::move(driver).value();
  const std::uint64_t granule = rig.driver->granule();
  const std::uint64_t per_window =
      std::max<std::uint64_t>(1, granule / geometry->bytes_per_token());
  const std::uint64_t context = options.prefix + options.extra + 4 * per_window + 4;
  Result<LayoutPlan> plan = plan_layout(*geometry, *layout, granule, context);
  if (!plan.ok()) {
    err << "kvvm bench share: " << plan.status().to_string() << "\n";
    return kExitUsage;
  }
  const std::uint32_t slots = options.sequences + 2 * options.repetitions + 8;
  const std::uint64_t budget =
      (options.sequences + 8) * plan->commit_floor(context) + 128 * granule;
  if (Status made = make_rig(rig, *plan, slots, budget); !made.ok()) {
    err << "kvvm bench share: " << made.to_string() << "\n";
    return kExitFailure;
  }
  ShareReport report;
  const DriverInfo info = rig.driver->info();
  report.backend = info.backend;
  report.device = info.device_name;
  Result<ShareSavings> savings = measure_savings(*rig.arena, options);
  if (!savings.ok()) {
    err << "kvvm bench share: savings: " << savings.status().to_string() << "\n";
    return kExitFailure;
  }
  report.savings = *savings;
  Result<ShareCosts> costs = measure_costs(*rig.arena, *rig.driver, options);
  if (!costs.ok()) {
    err << "kvvm bench share: costs: " << costs.status().to_string() << "\n";
    return kExitFailure;
  }
  report.costs = *costs;
  if (options.json) {
    out << dump_json(bench_share_json(report)) << "\n";
  } else {
    print_bench_share(report, out);
  }
  return report.savings.saved_bytes == report.savings.predicted_saved_bytes ? kExitOk
                                                                            : kExitFailure;
}

}  // namespace kvvm::cli
