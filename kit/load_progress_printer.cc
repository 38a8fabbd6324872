#include "kit/load_progress_printer.h"

#include <string>

#include "base/format.h"
#include "kvvm/base/bytes.h"

namespace kvvm::cli {
namespace {

// A terminal's line is rewritten at most this often between shards: often enough to see it
// move, rarely enough that printing costs nothing beside the reading.
constexpr std::chrono::milliseconds kTerminalEvery(100);

}  // namespace

std::string load_progress_text(const model::LoadProgress& p) {
  const double rate = p.seconds > 0 ? static_cast<double>(p.bytes) / p.seconds : -1;
  const std::uint64_t percent = p.total_bytes == 0 ? 100 : p.bytes * 100 / p.total_bytes;
  const double left = rate > 0 ? static_cast<double>(p.total_bytes - p.bytes) / rate : -1;
  return "loading weights: " + str(p.shards_done) + "/" + str(p.shards) + " shards, " +
         format_bytes(p.bytes) + " / " + format_bytes(p.total_bytes) + " (" + str(percent) +
         "%), " + format_byte_rate(rate) + ", " + format_duration(left) + " left";
}

LoadProgressPrinter::LoadProgressPrinter(std::ostream& err, std::string_view command, bool terminal)
    : line_(&err, terminal), command_(command) {}

void LoadProgressPrinter::operator()(const model::LoadProgress& progress) {
  if (line_.terminal()) {
    const auto now = std::chrono::steady_clock::now();
    if (!progress.shard_done && now - last_ < kTerminalEvery) return;
    last_ = now;
  } else if (!progress.shard_done) {
    return;
  }
  line_.show(std::string(command_) + ": " + load_progress_text(progress));
}

}  // namespace kvvm::cli
