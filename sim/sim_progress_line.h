// `kvvm simulate`'s progress line: which system it replays, how far, how many requests are
// running, queued, admitted and rejected.
//
// Why its own header: it is the one part of the simulate command that writes to a terminal
// while the run goes on; the command itself only builds and reports. How the line is written
// (in place on a terminal, a line at a time in a log) is kit/progress_line.h's, shared with a
// checkpoint's load.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

#include "kit/progress_line.h"
#include "kit/text_table.h"        // fixed
#include "sim/replay_scheduler.h"  // RunSummary, StepSample

namespace kvvm::cli {

// The progress line of a system's run, from its second second of wall time on (a short run
// prints nothing): rewritten in place twice a second on a terminal, else (--progress into a
// log) one line every five seconds.
class SimProgressLine {
 public:
  SimProgressLine(std::ostream* err, std::string_view command, std::string system,
                  std::uint64_t requests, bool terminal)
      : line_(err, terminal),
        enabled_(err != nullptr),
        command_(command),
        system_(std::move(system)),
        requests_(requests),
        last_(std::chrono::steady_clock::now()) {}
  void operator()(std::uint64_t step, const RunSummary& so_far, double step_s) {
    if (!enabled_) return;
    const auto now = std::chrono::steady_clock::now();
    const std::chrono::milliseconds every(!printed_ ? 1000 : line_.terminal() ? 500 : 5000);
    if (now - last_ < every) return;
    last_ = now;
    printed_ = true;
    const StepSample& sample = so_far.series.back();
    line_.show(std::string(command_) + ": " + system_ + " at " +
               fixed(static_cast<double>(step) * step_s, 1) + " s simulated: running " +
               str(sample.running) + ", queued " + str(sample.queued) + ", admitted " +
               str(so_far.admitted) + "/" + str(requests_) + ", rejected " + str(so_far.rejected));
  }

 private:
  ProgressLine line_;  // cleared when the run's line goes
  bool enabled_;
  std::string_view command_;  // a literal: "kvvm simulate"
  std::string system_;
  std::uint64_t requests_;
  bool printed_ = false;
  std::chrono::steady_clock::time_point last_;
};

}  // namespace kvvm::cli
