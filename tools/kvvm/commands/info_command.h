// `kvvm info`: what the memory driver says about itself (device, granularity, memory) and a
// measured table of what one granule costs, as raw driver calls and as kvvm's own
// transactions, so the overhead of kvvm's bookkeeping is a number anyone can reproduce.
//
// Why the two kinds side by side: a pooled commit should cost a map and a set_access and
// nothing more, a fresh commit a create, a map and a set_access; the ratio lines say how
// close kvvm gets (target: within 15 %), measured in the same run on the same driver.
//
// The pieces are separate functions so tests can call them on the host driver: gather_info
// collects, info_json and print_info render, run_info is the whole subcommand.
#pragma once

#include <cstddef>
#include <cstdint>
#include <iosfwd>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kit/byte_size.h"   // parse_byte_size and format_bytes, which info's users call too
#include "kit/cli_common.h"  // exit codes, BackendChoice, open_driver, which info's users call too
#include "kit/op_timing.h"
#include "kvvm/base/status.h"
#include "kvvm/vmm/driver.h"

namespace CLI {
class App;
}  // namespace CLI

namespace kvvm::cli {

// The most samples --granules takes: the table holds them all at once.
inline constexpr std::uint64_t kMaxTimingSamples = std::uint64_t{1} << 20;

struct InfoOptions {
  BackendChoice backend = BackendChoice::kAuto;
  int device = 0;                // CUDA device ordinal
  std::size_t host_granule = 0;  // host driver granule in bytes; 0: the page size
  std::size_t granules = 64;     // samples per row of the timing table; 1 to kMaxTimingSamples
  bool json = false;
  bool timing = true;
};

// Adds the `info` subcommand and its options to `app`, binding them to `options` (which
// must outlive the parse). Usage errors (a bad size, --granules 0) throw CLI11's parse errors.
CLI::App* add_info_command(CLI::App& app, InfoOptions& options);

enum class RowKind { kRaw, kOurs };
std::string_view to_string(RowKind kind);

struct TimingRow {
  std::string name;
  RowKind kind = RowKind::kRaw;
  TimingSummary summary;
};

// kvvm's median over the raw median it should approach; met when value <= target.
struct TimingRatio {
  std::string name;
  double value = 0;  // NaN when the raw median was 0 (below the clock's resolution)
  double target = 0;
  bool met = false;
};

struct TimingReport {
  std::size_t samples = 0;
  std::size_t granule_bytes = 0;
  std::vector<TimingRow> rows;
  std::vector<TimingRatio> ratios;
};

inline constexpr double kRatioTarget = 1.15;

// Times `samples` granules of each raw driver call and of kvvm's commit and release on
// `driver`. Needs samples x granule bytes of memory at once. Every call's status is checked:
// the first failure is returned (with what was being measured), never a number from it.
Result<TimingReport> measure_timing(Driver& driver, std::size_t samples);

// Everything `kvvm info` reports about one driver.
struct InfoReport {
  DriverInfo info;
  Granularity granularity;
  std::optional<TimingReport> timing;  // absent with --no-timing
};

// Queries `driver` and, when options.timing, measures the table (options.granules samples).
// InvalidArgument when options.granules is 0 or the measurement would need more memory than
// the driver reports free.
Result<InfoReport> gather_info(Driver& driver, const InfoOptions& options);

// In this key order (ordered_json keeps it, so the output reads like the human form):
// {"backend", "device": {name, ordinal, driver_version, vmm_supported},
//  "granularity": {minimum, recommended}, "memory": {free, total},
//  "timing": {samples, granule, rows: [{name, kind, median_us, p99_us}],
//             ratios: [{name, value, target, met}]}}; "timing" absent without a table.
nlohmann::ordered_json info_json(const InfoReport& report);

// The human-readable form: aligned columns, units stated.
void print_info(const InfoReport& report, std::ostream& out);

// The whole subcommand: results to `out`, errors (with numbers) to `err`. Returns kExitOk,
// kExitUsage (bad request: e.g. cuda asked for without a GPU) or kExitFailure.
int run_info(const InfoOptions& options, std::ostream& out, std::ostream& err);

}  // namespace kvvm::cli
