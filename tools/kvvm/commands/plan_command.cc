#include "commands/plan_command.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <limits>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "kit/byte_size.h"
#include "kit/cli_common.h"
#include "kit/model_loading.h"  // resolve_model_geometry
#include "kit/text_table.h"
#include "kit/value_parsers.h"
#include "kvvm/model/kv_config.h"

namespace kvvm::cli {
namespace {

// The page: what every granule is a multiple of. A granule is what a driver maps at once: the
// host driver's is a multiple of the page (--host-granule), a GPU's its allocation granularity
// (2 MiB). The plan's arithmetic would take any count, but a plan for a granule no driver can
// map describes no machine.
constexpr std::uint64_t kPageBytes = 4096;

constexpr const char* kLegend =
    "L layers, H KV heads, D head dim, e bytes per element, G granule, n context tokens, "
    "P prefix tokens, B budget; x multiplies, ceil/floor round up/down, round_up(a, G) is a "
    "rounded up to a multiple of G";

std::string tokens(std::uint64_t count) { return str(count) + (count == 1 ? " token" : " tokens"); }

// A size in the largest binary unit that shows it exactly with at most two decimals, so a
// reader can redo the arithmetic from the printed figures: 1.50 GiB, but 1152 MiB rather
// than 1.12 GiB (1.125 GiB rounded).
std::string exact_size(std::uint64_t bytes) {
  static constexpr std::pair<std::uint64_t, const char*> kUnits[] = {
      {std::uint64_t{1} << 40, "TiB"},
      {std::uint64_t{1} << 30, "GiB"},
      {std::uint64_t{1} << 20, "MiB"},
      {std::uint64_t{1} << 10, "KiB"}};
  for (const auto& [unit, name] : kUnits) {
    if (bytes < unit) continue;
    const std::uint64_t whole = bytes / unit;
    const std::uint64_t rest = bytes % unit;
    if (rest == 0) return str(whole) + " " + name;
    // rest * 100 < 2^47 for units up to 2^40: no overflow.
    if (rest * 100 % unit == 0) {
      char text[64];
      std::snprintf(text, sizeof text, "%llu.%02llu %s", static_cast<unsigned long long>(whole),
                    static_cast<unsigned long long>(rest * 100 / unit), name);
      return text;
    }
  }
  return str(bytes) + " B";
}

std::string bytes_exact(std::uint64_t bytes) {
  return exact_size(bytes) + " (" + str(bytes) + " B)";
}

std::string granules_and_bytes(std::uint64_t granules, std::uint64_t granule) {
  return str(granules) + (granules == 1 ? " granule = " : " granules = ") +
         exact_size(granules * granule);
}

// 8192 for a whole crossover, 10.67 for one a granule fills in a fraction of a token.
std::string crossover_text(double value) {
  if (value == std::floor(value) && value < 1e18) {
    return str(static_cast<std::uint64_t>(value));
  }
  char text[64];
  std::snprintf(text, sizeof text, "%.2f", value);
  return text;
}

std::string shape(Layout layout) {
  switch (layout) {
    case Layout::kHeadMajor:
      return "BNSH: [layer][k|v][head][token][dim]";
    case Layout::kSeqMajor:
      return "BSNH: [layer][k|v][token][head][dim]";
    case Layout::kTokenMajor:
      return "[token][layer][k|v][head][dim]";
  }
  return "";
}

// The per-layout formulas, symbolic and with this geometry's numbers.
struct LayoutFormulas {
  std::string fragments, fragments_worked;
  std::string contiguous, contiguous_worked;
  std::string layer_stride, kv_stride, head_stride, token_stride;
};

LayoutFormulas formulas(const LayoutPlan& plan) {
  const Geometry& g = plan.geometry;
  const std::string l = str(g.layers), h = str(g.kv_heads), d = str(g.head_dim),
                    e = str(g.element_bytes()) + " B";
  switch (plan.layout) {
    case Layout::kHeadMajor:
      return {"L x 2 x H",
              "L x 2 x H = " + l + " x 2 x " + h,
              "D x e",
              "D x e = " + d + " x " + e,
              "2 x H x fragment stride",
              "H x fragment stride",
              "fragment stride",
              "D x e"};
    case Layout::kSeqMajor:
      return {"L x 2",
              "L x 2 = " + l + " x 2",
              "H x D x e",
              "H x D x e = " + h + " x " + d + " x " + e,
              "2 x fragment stride",
              "fragment stride",
              "D x e",
              "H x D x e"};
    case Layout::kTokenMajor:
      return {"1",
              "one fragment holds the whole sequence",
              "L x 2 x H x D x e",
              "L x 2 x H x D x e = " + l + " x 2 x " + h + " x " + d + " x " + e,
              "2 x H x D x e",
              "H x D x e",
              "D x e",
              "L x 2 x H x D x e"};
  }
  return {};
}

// A label, a value and the formula behind it: one line of the single-layout view.
struct Line {
  std::string label;
  std::string value;
  std::string formula;
};

void print_lines(const std::vector<Line>& lines, std::ostream& out) {
  std::size_t label_width = 0, value_width = 0;
  for (const Line& line : lines) {
    label_width = std::max(label_width, line.label.size());
    value_width = std::max(value_width, line.value.size());
  }
  for (const Line& line : lines) {
    out << "  " << pad_right(line.label, label_width + 2);
    if (line.formula.empty()) {
      out << line.value << "\n";
    } else {
      out << pad_right(line.value, value_width + 2) << line.formula << "\n";
    }
  }
}

void print_header(const PlanReport& report, std::ostream& out) {
  const Geometry& g = report.geometry;
  out << "model " << g.name << ": L = " << g.layers << " layers, H = " << g.kv_heads
      << " KV heads, D = " << g.head_dim << " head dim, " << to_string(g.dtype)
      << " (e = " << g.element_bytes() << " B); K and V both stored\n";
  out << "bytes per token: " << bytes_exact(g.bytes_per_token())
      << " = L x 2 x H x D x e = " << g.layers << " x 2 x " << g.kv_heads << " x " << g.head_dim
      << " x " << g.element_bytes() << " B\n";
  out << "granule G = " << bytes_exact(report.granule) << "; context n = " << tokens(report.context)
      << " (also the slot's max context)\n";
  if (report.weights) {
    out << report.weights->describe() << "; device budget " << bytes_exact(report.device_budget)
        << " less the weights' " << bytes_exact(report.weights->device_bytes)
        << " leaves the KV its budget B\n";
  }
  out << "prefix P = " << tokens(report.prefix) << "; budget B = " << bytes_exact(report.budget);
  if (report.sequences) out << "; sizing memory for " << *report.sequences << " sequences";
  out << "\n";
}

void print_one_layout(const PlanReport& report, const LayoutFigures& figures, std::ostream& out) {
  const LayoutPlan& plan = figures.plan;
  const LayoutFormulas f = formulas(plan);
  const std::string g = exact_size(plan.granule);
  const std::string contiguous = exact_size(plan.contiguous_bytes_per_token);
  const std::string n = str(report.context);
  const PrefixShareability& prefix = figures.prefix;
  const Concurrency& c = figures.concurrency;

  out << "\nlayout " << to_string(plan.layout) << " (" << shape(plan.layout) << ")\n";
  std::vector<Line> lines = {
      {"fragments per sequence", str(plan.fragments), f.fragments_worked},
      {"contiguous bytes per token", contiguous, f.contiguous_worked + ", in one fragment"},
      {"bytes per token", exact_size(plan.bytes_per_token),
       "fragments x contiguous = " + str(plan.fragments) + " x " + contiguous},
      {"fragment stride", exact_size(plan.fragment_stride),
       "round_up(n x contiguous, G) = round_up(" + n + " x " + contiguous + ", " + g + ")"},
      {"slot stride", exact_size(plan.slot_stride),
       "fragments x fragment stride = " + str(plan.fragments) + " x " +
           exact_size(plan.fragment_stride)},
      {"commit floor for 1 token",
       granules_and_bytes(plan.fragments * figures.one_token_windows, plan.granule),
       "fragments x ceil(1 x " + contiguous + " / " + g + ") granules = " + str(plan.fragments) +
           " x " + str(figures.one_token_windows)},
      {"commit at " + tokens(report.context),
       granules_and_bytes(plan.fragments * figures.context_windows, plan.granule),
       "fragments x ceil(" + n + " x " + contiguous + " / " + g +
           ") granules = " + str(plan.fragments) + " x " + str(figures.context_windows)},
      {"crossover", crossover_text(plan.crossover_tokens()) + " tokens",
       "G / contiguous = " + g + " / " + contiguous +
           "; shorter sequences commit more than their live bytes"},
  };
  if (report.prefix == 0) {
    lines.push_back({"prefix sharing", "none (--prefix 0)", ""});
  } else {
    lines.push_back({"prefix sharing, P = " + str(report.prefix),
                     prefix.shareable ? "shareable" : "refused",
                     "P x contiguous = " + str(report.prefix) + " x " + contiguous + " = " +
                         exact_size(prefix.fragment_bytes) + " per fragment, shareable iff >= G"});
    lines.push_back({"shareable granules/fragment", str(prefix.shareable_granules_per_fragment),
                     "floor(P x contiguous / G) = floor(" + exact_size(prefix.fragment_bytes) +
                         " / " + g + ")"});
    lines.push_back({"mapping operations", str(prefix.mapping_operations),
                     "fragments x shareable granules = " + str(plan.fragments) + " x " +
                         str(prefix.shareable_granules_per_fragment)});
    lines.push_back({"shared prefix", exact_size(prefix.shared_bytes),
                     "mapping operations x G, committed once for all sharers"});
    lines.push_back({"boundary bytes per sharer", exact_size(prefix.boundary_bytes_per_sharer),
                     "fragments x (P x contiguous mod G) = " + str(plan.fragments) + " x " +
                         exact_size(prefix.fragment_bytes % plan.granule) + ", held privately"});
  }
  const std::string budget = exact_size(report.budget);
  const std::string per_sequence = exact_size(c.per_sequence_bytes);
  const std::string private_bytes = exact_size(c.private_bytes);
  lines.push_back({"per sequence", per_sequence, "commit at n tokens"});
  lines.push_back(
      {"private per sequence", private_bytes,
       "per sequence - shared prefix = " + per_sequence + " - " + exact_size(c.prefix_bytes)});
  lines.push_back({"sequences in B, no sharing", str(c.without_sharing),
                   "floor(B / per sequence) = floor(" + budget + " / " + per_sequence + ")"});
  lines.push_back({"sequences in B, sharing", str(c.with_sharing),
                   "1 + floor((B - per sequence) / private) = 1 + floor((" + budget + " - " +
                       per_sequence + ") / " + private_bytes + ")"});
  if (report.sequences) {
    const std::string count = str(*report.sequences);
    const auto fits = [&report](std::uint64_t bytes) {
      return bytes <= report.budget ? "; fits in B" : "; exceeds B";
    };
    lines.push_back({"memory for " + count + ", no sharing",
                     exact_size(*figures.bytes_for_n_without_sharing),
                     count + " x per sequence" + fits(*figures.bytes_for_n_without_sharing)});
    lines.push_back(
        {"memory for " + count + ", sharing", exact_size(*figures.bytes_for_n_with_sharing),
         "shared prefix + " + count + " x private" + fits(*figures.bytes_for_n_with_sharing)});
  }
  const KvView& view = figures.view;
  lines.push_back({"KvView slot stride", str(view.slot_stride) + " B", "slot stride"});
  lines.push_back({"KvView layer stride", str(view.layer_stride) + " B", f.layer_stride});
  lines.push_back({"KvView K->V stride", str(view.kv_stride) + " B", f.kv_stride});
  lines.push_back({"KvView head stride", str(view.head_stride) + " B", f.head_stride});
  lines.push_back({"KvView token stride", str(view.token_stride) + " B", f.token_stride});
  print_lines(lines, out);
  if (report.prefix > 0 && !prefix.shareable) out << "  " << prefix.refusal_reason << "\n";
}

// One row of the side-by-side table: a value per layout and the formula they share.
struct TableRow {
  std::string label;
  std::vector<std::string> values;
  std::string formula;
};

template <typename ValueOf>
TableRow row(const PlanReport& report, std::string label, std::string formula, ValueOf value_of) {
  TableRow result{std::move(label), {}, std::move(formula)};
  for (const LayoutFigures& figures : report.layouts) result.values.push_back(value_of(figures));
  return result;
}

// "head: a | seq: b | token: c" when each layout has its own formula.
std::string per_layout(const PlanReport& report,
                       std::string (*pick)(const LayoutFormulas& formulas)) {
  std::string text;
  for (const LayoutFigures& figures : report.layouts) {
    if (!text.empty()) text += " | ";
    text += pick(formulas(figures.plan));
  }
  return text;
}

void print_table(const PlanReport& report, std::ostream& out) {
  using F = const LayoutFigures&;
  const std::string n = str(report.context);
  std::vector<TableRow> rows = {
      row(report, "fragments per sequence",
          per_layout(report, [](const LayoutFormulas& f) { return f.fragments; }),
          [](F x) { return str(x.plan.fragments); }),
      row(report, "contiguous bytes per token",
          per_layout(report, [](const LayoutFormulas& f) { return f.contiguous; }),
          [](F x) { return exact_size(x.plan.contiguous_bytes_per_token); }),
      row(report, "bytes per token", "fragments x contiguous",
          [](F x) { return exact_size(x.plan.bytes_per_token); }),
      row(report, "fragment stride", "round_up(n x contiguous, G)",
          [](F x) { return exact_size(x.plan.fragment_stride); }),
      row(report, "slot stride", "fragments x fragment stride",
          [](F x) { return exact_size(x.plan.slot_stride); }),
      row(report, "commit floor, 1 token (granules)", "fragments x ceil(1 x contiguous / G)",
          [](F x) { return str(x.plan.fragments * x.one_token_windows); }),
      row(report, "commit floor, 1 token", "granules x G",
          [](F x) { return exact_size(x.plan.commit_floor(1)); }),
      row(report, "commit at n = " + n + " (granules)", "fragments x ceil(n x contiguous / G)",
          [](F x) { return str(x.plan.fragments * x.context_windows); }),
      row(report, "commit at n = " + n, "granules x G = per sequence",
          [](F x) { return exact_size(x.concurrency.per_sequence_bytes); }),
      row(report, "crossover (tokens)", "G / contiguous",
          [](F x) { return crossover_text(x.plan.crossover_tokens()); }),
      row(report, "prefix P = " + str(report.prefix) + " shareable", "P x contiguous >= G",
          [](F x) { return std::string(x.prefix.shareable ? "yes" : "no"); }),
      row(report, "prefix bytes per fragment", "P x contiguous",
          [](F x) { return exact_size(x.prefix.fragment_bytes); }),
      row(report, "shareable granules/fragment", "floor(P x contiguous / G)",
          [](F x) { return str(x.prefix.shareable_granules_per_fragment); }),
      row(report, "mapping operations", "fragments x shareable granules",
          [](F x) { return str(x.prefix.mapping_operations); }),
      row(report, "shared prefix", "mapping operations x G, committed once",
          [](F x) { return exact_size(x.prefix.shared_bytes); }),
      row(report, "boundary bytes per sharer", "fragments x (P x contiguous mod G)",
          [](F x) { return exact_size(x.prefix.boundary_bytes_per_sharer); }),
      row(report, "private per sequence", "per sequence - shared prefix",
          [](F x) { return exact_size(x.concurrency.private_bytes); }),
      row(report, "sequences in B, no sharing", "floor(B / per sequence)",
          [](F x) { return str(x.concurrency.without_sharing); }),
      row(report, "sequences in B, sharing", "1 + floor((B - per sequence) / private)",
          [](F x) { return str(x.concurrency.with_sharing); }),
  };
  if (report.sequences) {
    const std::string count = str(*report.sequences);
    rows.push_back(row(report, "memory for " + count + ", no sharing", count + " x per sequence",
                       [](F x) { return exact_size(*x.bytes_for_n_without_sharing); }));
    rows.push_back(row(report, "memory for " + count + ", sharing",
                       "shared prefix + " + count + " x private",
                       [](F x) { return exact_size(*x.bytes_for_n_with_sharing); }));
  }
  rows.push_back(row(report, "KvView slot stride (B)", "slot stride",
                     [](F x) { return str(x.view.slot_stride); }));
  rows.push_back(row(report, "KvView layer stride (B)",
                     per_layout(report, [](const LayoutFormulas& f) { return f.layer_stride; }),
                     [](F x) { return str(x.view.layer_stride); }));
  rows.push_back(row(report, "KvView K->V stride (B)",
                     per_layout(report, [](const LayoutFormulas& f) { return f.kv_stride; }),
                     [](F x) { return str(x.view.kv_stride); }));
  rows.push_back(row(report, "KvView head stride (B)",
                     per_layout(report, [](const LayoutFormulas& f) { return f.head_stride; }),
                     [](F x) { return str(x.view.head_stride); }));
  rows.push_back(row(report, "KvView token stride (B)",
                     per_layout(report, [](const LayoutFormulas& f) { return f.token_stride; }),
                     [](F x) { return str(x.view.token_stride); }));

  std::vector<std::string> header{"figure"};
  for (const LayoutFigures& figures : report.layouts) {
    header.emplace_back(to_string(figures.plan.layout));
  }
  TextTable table(std::move(header), 1, "formula");
  for (const TableRow& table_row : rows) {
    std::vector<std::string> cells{table_row.label};
    cells.insert(cells.end(), table_row.values.begin(), table_row.values.end());
    table.add(std::move(cells), table_row.formula);
  }
  out << "\n";
  table.print(out);
  out << "\nwhere a formula differs by layout it is given as head-major | seq-major | "
         "token-major.\n";
  out << "sharing: the first sequence pays shared prefix + private, each further one private "
         "only.\n";
  for (const LayoutFigures& figures : report.layouts) {
    if (report.prefix > 0 && !figures.prefix.shareable) {
      out << figures.prefix.refusal_reason << "\n";
    }
  }
}

}  // namespace

CLI::App* add_plan_command(CLI::App& app, PlanOptions& options) {
  CLI::App* plan = app.add_subcommand(
      "plan",
      "Show, for one model and without a GPU, what each KV layout commits per sequence, "
      "whether a prefix can be shared and at what cost, how many sequences a budget admits, "
      "and the strides a kernel sees; every figure with its unit and formula.");
  plan->add_option(
      "--model", options.model, "A built-in model (" + [] {
        std::string names;
        for (const std::string& name : model::builtin_model_names()) {
          names += (names.empty() ? "" : ", ") + name;
        }
        return names;
      }() + ") or a path to a Hugging Face config.json (default llama-3-8b)");
  plan->add_option("--kv-dtype,--dtype", options.dtype,
                   "KV element type: fp16, bf16, fp8 or fp32 (default: the config's "
                   "torch_dtype; fp16 for built-in models). fp8 is e4m3, one byte per element: "
                   "half a 16-bit type's bytes per token, twice its tokens per granule. --dtype "
                   "is the old name");
  plan->add_option("--layout", options.layout,
                   "head-major, seq-major, token-major, or all for a side-by-side table "
                   "(default all)");
  plan->add_option("--granule", options.granule,
                   "Mapping granule, a multiple of the 4 KiB page, e.g. 4K, 2M (default 2M; the "
                   "driver's, see kvvm info)")
      ->transform(byte_size_validator());
  plan->add_option("--context", options.context,
                   "Tokens per sequence, also the slot's max context (default 8192; K = 1024)")
      ->transform(token_count_validator());
  plan->add_option("--prefix", options.prefix, "Tokens of prefix every sequence shares (default 0)")
      ->transform(token_count_validator());
  plan->add_option("--budget", options.budget, "Memory budget, e.g. 40G (default 40G)")
      ->transform(byte_size_validator(kMaxBudgetBytes, "the most a budget may be"));
  plan->add_option_function<std::uint64_t>(
          "--concurrency",
          [&options](const std::uint64_t& sequences) { options.concurrency = sequences; },
          "Also report the memory N sequences at --context need, with and without sharing")
      ->transform(count_validator(1, std::numeric_limits<std::uint64_t>::max()));
  plan->add_option_function<std::uint64_t>(
          "--weight-budget",
          [&options](const std::uint64_t& bytes) { options.weight_budget = bytes; },
          "Also place the model's weights (in its 16-bit type; an FP8 checkpoint's projections in "
          "e4m3 with their float32 scales) under this many device bytes, "
          "as `kvvm serve --weight-budget` would: which layers stay resident and which stream, "
          "the ring, the bytes copied per step (a mixture of experts: its dense part resident "
          "and its experts in a cache of slots, at least one layer's); --budget is then the "
          "device's, and the KV gets what the weights leave")
      ->transform(byte_size_validator(kMaxBudgetBytes, "the most a budget may be"));
  plan->add_flag("--json", options.json, "Machine-readable output (JSON) on stdout");
  plan->footer(std::string("Formulas use: ") + kLegend + ".");
  return plan;
}

Result<PlanReport> make_plan(const PlanOptions& options) {
  std::optional<DType> dtype;
  if (!options.dtype.empty()) {
    Result<DType> parsed = parse_dtype(options.dtype);
    if (!parsed.ok()) return parsed.status().with_context("--kv-dtype (--dtype)");
    dtype = *parsed;
  }
  std::vector<Layout> layouts;
  if (options.layout == "all") {
    layouts = all_layouts();
  } else {
    Result<Layout> parsed = parse_layout(options.layout);
    if (!parsed.ok()) return parsed.status().with_context("--layout (or 'all')");
    layouts = {*parsed};
  }
  if (options.granule == 0) {
    return Status::InvalidArgument("--granule must be at least 1 byte, got 0");
  }
  if (options.granule % kPageBytes != 0) {
    return Status::InvalidArgument(
        "--granule " + str(options.granule) + " (" + format_bytes(options.granule) +
        ") is not a positive multiple of 4 KiB, the page: a granule is what a driver maps at "
        "once, a multiple of the page on the host (--host-granule) or a GPU's granularity "
        "(2 MiB); e.g. 4K, 64K, 2M");
  }
  if (options.context == 0) {
    return Status::InvalidArgument("--context must be at least 1 token, got 0");
  }
  if (options.budget == 0) {
    return Status::InvalidArgument("--budget must be at least 1 byte, got 0");
  }
  if (options.prefix >= options.context) {
    return Status::InvalidArgument("--prefix " + str(options.prefix) +
                                   " must be shorter than --context " + str(options.context) +
                                   ": every sequence holds at least one token of its own");
  }
  if (options.concurrency && *options.concurrency == 0) {
    return Status::InvalidArgument("--concurrency must be at least 1 sequence, got 0");
  }
  Result<Geometry> geometry = resolve_model_geometry(options.model, dtype);
  if (!geometry.ok()) return geometry.status().with_context("--model");

  PlanReport report;
  std::uint64_t kv_budget = options.budget;
  if (options.weight_budget) {
    Result<model::ModelConfig> config = resolve_model_config(options.model);
    if (!config.ok()) return config.status().with_context("--model");
    const DType weights = config->dtype == DType::kFp16 ? DType::kFp16 : DType::kBf16;
    // As the CUDA backend places a mixture: its experts cached, at least a layer's of them.
    Result<model::WeightSplit> split = model::plan_weight_split(
        model::weight_sizes(*config, weights), options.granule, *options.weight_budget, 0,
        model::ExpertPlacement::kCache, config->moe.experts);
    if (!split.ok()) return split.status().with_context("--weight-budget");
    if (split->device_bytes >= options.budget) {
      return Status::InvalidArgument("--budget " + exact_size(options.budget) +
                                     ": the weights take " + exact_size(split->device_bytes) +
                                     " of it, leaving nothing for the KV cache");
    }
    kv_budget = options.budget - split->device_bytes;
    report.weights = *split;
    report.weight_quant = std::string(model::to_string(config->weight_quant));
    report.device_budget = options.budget;
  }
  report.geometry = *geometry;
  report.granule = options.granule;
  report.context = options.context;
  report.prefix = options.prefix;
  report.budget = kv_budget;
  report.sequences = options.concurrency;
  report.all_layouts = layouts.size() > 1;
  for (Layout layout : layouts) {
    KVVM_ASSIGN_OR_RETURN(LayoutPlan plan,
                          plan_layout(*geometry, layout, options.granule, options.context));
    LayoutFigures figures;
    figures.plan = plan;
    figures.prefix = prefix_shareability(plan, options.prefix);
    figures.concurrency = admissible_concurrency(plan, options.context, options.prefix, kv_budget);
    figures.one_token_windows = plan.windows_per_fragment(1);
    figures.context_windows = plan.windows_per_fragment(options.context);
    figures.view = plan.view(0);
    if (options.concurrency) {
      figures.bytes_for_n_without_sharing =
          figures.concurrency.bytes_without_sharing(*options.concurrency);
      figures.bytes_for_n_with_sharing =
          figures.concurrency.bytes_with_sharing(*options.concurrency);
      if (!figures.bytes_for_n_without_sharing || !figures.bytes_for_n_with_sharing) {
        return Status::InvalidArgument("--concurrency " + str(*options.concurrency) + " x " +
                                       str(figures.concurrency.per_sequence_bytes) +
                                       " bytes per sequence does not fit in 64 bits");
      }
    }
    report.layouts.push_back(std::move(figures));
  }
  return report;
}

// {"bf16": bytes, "fp8": bytes, "fp32": bytes}: what each stored type takes.
nlohmann::ordered_json bytes_by_dtype(const model::WeightSizes& sizes) {
  nlohmann::ordered_json out = nlohmann::ordered_json::object();
  for (const auto& [type, bytes] : sizes.bytes_by_type()) out[type] = bytes;
  return out;
}

nlohmann::ordered_json plan_json(const PlanReport& report) {
  const Geometry& g = report.geometry;
  nlohmann::ordered_json json;
  json["model"] = {{"name", g.name},
                   {"layers", g.layers},
                   {"kv_heads", g.kv_heads},
                   {"head_dim", g.head_dim},
                   {"dtype", to_string(g.dtype)},
                   {"element_bytes", g.element_bytes()},
                   {"bytes_per_token", g.bytes_per_token()}};
  json["granule_bytes"] = report.granule;
  json["context_tokens"] = report.context;
  json["prefix_tokens"] = report.prefix;
  json["budget_bytes"] = report.budget;
  if (report.sequences) json["sequences"] = *report.sequences;
  if (report.weights) {
    const model::WeightSplit& w = *report.weights;
    json["weights"] = {{"device_budget_bytes", report.device_budget},
                       {"device_bytes", w.device_bytes},
                       {"layers", w.sizes.layers},
                       {"streamed_layers", w.streamed_layers},
                       {"ring_slots", w.ring_slots},
                       {"layer_block_bytes", w.layer_block},
                       {"streamed_bytes_per_step", w.streamed_bytes_per_step},
                       {"host_staging_bytes", w.host_staging_bytes},
                       {"quantization", report.weight_quant},
                       {"bytes_by_dtype", bytes_by_dtype(w.sizes)},
                       {"expert_bytes", w.sizes.expert_total()},
                       {"dense_bytes", w.sizes.dense_total()},
                       {"expert_slots", w.expert_slots},
                       {"placement", w.describe()}};
  }
  nlohmann::ordered_json layouts = nlohmann::ordered_json::array();
  for (const LayoutFigures& figures : report.layouts) {
    const LayoutPlan& plan = figures.plan;
    const PrefixShareability& prefix = figures.prefix;
    const Concurrency& c = figures.concurrency;
    nlohmann::ordered_json layout;
    layout["layout"] = to_string(plan.layout);
    layout["fragments"] = plan.fragments;
    layout["contiguous_bytes_per_token"] = plan.contiguous_bytes_per_token;
    layout["bytes_per_token"] = plan.bytes_per_token;
    layout["fragment_stride_bytes"] = plan.fragment_stride;
    layout["slot_stride_bytes"] = plan.slot_stride;
    layout["commit_floor_1_token"] = {{"granules", plan.fragments * figures.one_token_windows},
                                      {"bytes", plan.commit_floor(1)}};
    layout["commit_at_context"] = {{"granules", plan.fragments * figures.context_windows},
                                   {"bytes", c.per_sequence_bytes}};
    layout["crossover_tokens"] = plan.crossover_tokens();
    layout["prefix"] = {{"tokens", prefix.prefix_tokens},
                        {"shareable", prefix.shareable},
                        {"fragment_bytes", prefix.fragment_bytes},
                        {"shareable_granules_per_fragment", prefix.shareable_granules_per_fragment},
                        {"mapping_operations", prefix.mapping_operations},
                        {"boundary_bytes_per_sharer", prefix.boundary_bytes_per_sharer},
                        {"shared_bytes", prefix.shared_bytes},
                        {"refusal_reason", prefix.refusal_reason}};
    layout["concurrency"] = {{"per_sequence_bytes", c.per_sequence_bytes},
                             {"prefix_bytes", c.prefix_bytes},
                             {"private_bytes", c.private_bytes},
                             {"without_sharing", c.without_sharing},
                             {"with_sharing", c.with_sharing}};
    if (report.sequences) {
      layout["memory_for_sequences"] = {
          {"sequences", *report.sequences},
          {"bytes_without_sharing", *figures.bytes_for_n_without_sharing},
          {"bytes_with_sharing", *figures.bytes_for_n_with_sharing}};
    }
    const KvView& view = figures.view;
    layout["view"] = {{"slot_stride", view.slot_stride},   {"layer_stride", view.layer_stride},
                      {"kv_stride", view.kv_stride},       {"head_stride", view.head_stride},
                      {"token_stride", view.token_stride}, {"element_bytes", view.element_bytes},
                      {"head_dim", view.head_dim}};
    layouts.push_back(std::move(layout));
  }
  json["layouts"] = std::move(layouts);
  return json;
}

void print_plan(const PlanReport& report, std::ostream& out) {
  print_header(report, out);
  if (report.all_layouts) {
    print_table(report, out);
  } else {
    for (const LayoutFigures& figures : report.layouts) print_one_layout(report, figures, out);
  }
  out << "\nsymbols: " << kLegend << ".\n";
}

int run_plan(const PlanOptions& options, std::ostream& out, std::ostream& err) {
  Result<PlanReport> report = make_plan(options);
  if (!report.ok()) {
    // Everything make_plan refuses is something the command line asked for.
    err << "kvvm plan: " << report.status().to_string() << "\n";
    return report.status().code() == StatusCode::kInvalidArgument ? kExitUsage : kExitFailure;
  }
  if (options.json) {
    out << dump_json(plan_json(*report)) << "\n";
  } else {
    print_plan(*report, out);
  }
  return kExitOk;
}

}  // namespace kvvm::cli
