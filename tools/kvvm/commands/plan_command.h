// `kvvm plan`: the layout arithmetic of docs/ARCHITECTURE.md for one model, with no driver and
// no GPU.
// For each layout it prints what a sequence commits (for one token and at the context), where
// granule rounding stops mattering, whether a prefix can be shared and at what cost, how many
// sequences a budget admits with and without sharing, and the KvView strides a kernel gets;
// each figure with its unit and the formula behind it, so anyone can check it by hand.
//
// Why a separate report step: make_plan computes, plan_json and print_plan render, run_plan
// is the whole subcommand, so the tests check numbers on the report and wording on the text.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kvvm/base/status.h"
#include "kvvm/kv/geometry.h"
#include "kvvm/kv/kv_view.h"
#include "kvvm/kv/layout.h"
#include "kvvm/model/weight_memory.h"

namespace CLI {
class App;
class Validator;
}  // namespace CLI

namespace kvvm::cli {

struct PlanOptions {
  std::string model = "llama-3-8b";  // a built-in name or a path to a config.json
  std::string dtype;                 // --kv-dtype; empty: torch_dtype, fp16 for built-ins
  std::string layout = "all";        // head-major, seq-major, token-major or all
  std::uint64_t granule = std::uint64_t{2} << 20;  // bytes
  std::uint64_t context = 8192;  // tokens per sequence; also the slot's max context
  std::uint64_t prefix = 0;      // tokens shared by every sequence
  std::uint64_t budget = std::uint64_t{40} << 30;  // bytes
  std::optional<std::uint64_t> concurrency;        // sequences to size memory for
  // --weight-budget: the weights' device bytes; then --budget is the device's, shared by the
  // weights and the KV, and the KV gets what the weights leave.
  std::optional<std::uint64_t> weight_budget;
  bool json = false;
};

// Adds the `plan` subcommand and its options to `app`, binding them to `options` (which must
// outlive the parse). Malformed sizes or token counts throw CLI11's parse errors; values
// that parse but make no sense (a granule of 0) are refused by make_plan.
CLI::App* add_plan_command(CLI::App& app, PlanOptions& options);

// Everything `kvvm plan` reports for one layout.
struct LayoutFigures {
  LayoutPlan plan;                      // fragments, contiguous bytes, strides
  PrefixShareability prefix;            // for options.prefix tokens
  Concurrency concurrency;              // at options.context under options.budget
  std::uint64_t one_token_windows = 0;  // per fragment
  std::uint64_t context_windows = 0;    // per fragment, at options.context
  std::optional<std::uint64_t> bytes_for_n_without_sharing;  // with --concurrency N
  std::optional<std::uint64_t> bytes_for_n_with_sharing;
  KvView view;  // base 0
};

struct PlanReport {
  Geometry geometry;
  std::uint64_t granule = 0;
  std::uint64_t context = 0;
  std::uint64_t prefix = 0;
  std::uint64_t budget = 0;
  std::optional<std::uint64_t> sequences;  // --concurrency
  bool all_layouts = false;                // --layout all: the side-by-side table
  // With --weight-budget: the weights' split (in the model's 16-bit type) and the device budget
  // it came out of; `budget` is then what the KV gets.
  std::optional<model::WeightSplit> weights;
  std::string weight_quant;  // to_string(WeightQuant) of the checkpoint, with `weights`
  std::uint64_t device_budget = 0;
  std::vector<LayoutFigures> layouts;
};

// Resolves the model and computes every figure. InvalidArgument (naming the option and the
// value) for an unknown model, dtype or layout, a config.json that does not fit, a zero
// granule, context, budget or --concurrency, a prefix not shorter than the context, or
// memory for N sequences past 64 bits.
Result<PlanReport> make_plan(const PlanOptions& options);

// {"model": {name, layers, kv_heads, head_dim, dtype, element_bytes, bytes_per_token},
//  "granule_bytes", "context_tokens", "prefix_tokens", "budget_bytes", ["sequences"],
//  "layouts": [{layout, fragments, contiguous_bytes_per_token, bytes_per_token,
//               fragment_stride_bytes, slot_stride_bytes, commit_floor_1_token: {granules,
//               bytes}, commit_at_context: {granules, bytes}, crossover_tokens, prefix: {...},
//               concurrency: {...}, [memory_for_sequences: {...}], view: {...}}]}
// Every size is in bytes, every length in tokens, as the key names say.
nlohmann::ordered_json plan_json(const PlanReport& report);

// The human-readable form: units and formulas beside every figure; with all layouts, one
// table with a column per layout.
void print_plan(const PlanReport& report, std::ostream& out);

// The whole subcommand: results to `out`, errors to `err`. kExitOk, or kExitUsage with the
// status message for a request make_plan refuses.
int run_plan(const PlanOptions& options, std::ostream& out, std::ostream& err);

}  // namespace kvvm::cli
