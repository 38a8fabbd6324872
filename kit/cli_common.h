// What every kvvm subcommand shares: exit codes, the backend options and opening the driver
// they ask for, validators for numeric options, JSON rendering that never throws, and checked
// output (a write that failed, to stdout or to a file, is an error, never a silent exit 0).
//
// Why the validators live here: CLI11 reads integers with strtoull in base 0, so "-1" wraps to
// a huge unsigned and "010" is octal. Every numeric option goes through one of these instead,
// so each refuses a sign, reads decimal only and states its bounds in the error.
#pragma once

#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <iosfwd>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "kvvm/base/status.h"
#include "kvvm/vmm/driver.h"

namespace CLI {
class App;
class Validator;
}  // namespace CLI

namespace kvvm::cli {

// Exit codes of every kvvm subcommand.
inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;  // a driver or kvvm call failed at run time
inline constexpr int kExitUsage = 2;    // the command line asked for something impossible

// The exit code of a command that failed with `status`: what the command line got wrong
// (InvalidArgument; Unavailable: a backend or budget this machine cannot give; NotFound: a
// file it named) is kExitUsage, what failed while running kExitFailure.
inline int exit_code(const Status& status) {
  switch (status.code()) {
    case StatusCode::kInvalidArgument:
    case StatusCode::kUnavailable:
    case StatusCode::kNotFound:
      return kExitUsage;
    default:
      return kExitFailure;
  }
}

// Limits the commands' options share: a request rate (per second), a request count, and a
// token count (the engine counts a request's tokens in 32 bits).
inline constexpr double kMaxRate = 1e6;
inline constexpr std::uint64_t kMaxRequests = 1'000'000;
inline constexpr std::uint64_t kMaxTokens = std::numeric_limits<std::uint32_t>::max();

// Which driver to open. kAuto: CUDA when a GPU is usable, else the host driver.
enum class BackendChoice { kAuto, kCuda, kHost };

// The largest CUDA device ordinal --device accepts.
inline constexpr std::uint64_t kMaxDeviceOrdinal = 1023;

// Opens the driver a subcommand's --backend / --device / --host-granule ask for. An explicit
// --backend cuda without a usable GPU is Unavailable; a bad host granule InvalidArgument. With
// kAuto, a GPU that cannot be opened falls back to the host driver with a note on `err`
// naming `command`. `populate` is the host driver's: false sizes handles without touching
// their memory (a simulation that never writes KV bytes).
Result<std::unique_ptr<Driver>> open_driver(BackendChoice backend, int device,
                                            std::size_t host_granule, std::string_view command,
                                            std::ostream& err, bool populate = true);

// Adds --backend (auto, cuda or host), --device and --host-granule (a multiple of the page size
// whatever the backend, at most kMaxHostGranuleBytes) to `command`, bound to the given fields;
// `host_granule_help` says what the granule is and defaults to for this command.
void add_backend_options(CLI::App& command, BackendChoice& backend, int& device,
                         std::uint64_t& host_granule, const std::string& host_granule_help);

// A whole number in [min, max] written in decimal digits only: no sign, no base prefix, no
// fraction; leading zeros are decimal ("010" is ten). InvalidArgument naming the text and the
// bounds otherwise.
Result<std::uint64_t> parse_count(std::string_view text, std::uint64_t min, std::uint64_t max);

// A finite decimal number in [min, max] (or (min, max] when `min_exclusive`); no hex, inf or
// nan. InvalidArgument naming the text and the bounds otherwise.
Result<double> parse_number(std::string_view text, double min, double max,
                            bool min_exclusive = false);

// --tpot-target-ms and --ttft-target-ms (serve, bench engine): at most a minute; as
// EngineOptions takes them, rounded to the microsecond.
inline constexpr double kMaxTpotTargetMs = 60000;
inline std::chrono::microseconds tpot_target(double ms) {
  return std::chrono::microseconds(static_cast<std::int64_t>(std::llround(ms * 1000)));
}

// A duration option given in seconds (--max-queue-wait, --drain-timeout), to the millisecond.
inline std::chrono::milliseconds seconds_to_millis(double seconds) {
  return std::chrono::milliseconds(std::llround(seconds * 1000.0));
}

// CLI11 transforms over parse_count / parse_number: they rewrite the value to plain decimal
// before CLI11 converts it, and their errors reach the user prefixed with the option's name.
CLI::Validator count_validator(std::uint64_t min, std::uint64_t max);
CLI::Validator number_validator(double min, double max, bool min_exclusive = false);

// `json` rendered with two-space indents; invalid UTF-8 (a file name from the command line is
// any bytes) is replaced by U+FFFD instead of throwing.
std::string dump_json(const nlohmann::ordered_json& json);

// Flushes `out` and says whether everything written to it arrived; `name` says what it is
// ("standard output", a file name) in the error.
Status check_written(std::ostream& out, std::string_view name);

// Writes a file through `write`, then flushes and closes it: InvalidArgument naming `option`
// and `path` when it cannot be opened, Unavailable when a write or the close failed (a full
// disk).
Status write_file(const std::string& path, std::string_view option,
                  const std::function<void(std::ostream&)>& write);

// A file to read that `option` names: InvalidArgument naming both and why (no such file, a
// directory, no permission) when it cannot be read, so the command stops before its first step.
Status check_input_file(std::string_view option, const std::string& path);

// When `args` (the command line without the program name) names a subcommand `app` does not
// have, where one is expected: "unknown subcommand 'simulat' of kvvm; expected one of: info,
// plan, bench, simulate". Empty otherwise. Only words before the first option are looked at,
// which is where every kvvm subcommand is named.
std::string unknown_subcommand(const CLI::App& app, const std::vector<std::string>& args);

// Memory a benchmark or simulation lets itself use out of what the driver reports free: on a GPU
// all but 1/16 (at least 512 MiB) for the context and the kernel; on the host half, since the
// machine runs other things and a memory file's bytes are real.
std::uint64_t usable_memory(const DriverInfo& info);

}  // namespace kvvm::cli
