// The output rate of an open-loop trace replay while the engine was loaded, beside the whole
// run's rate.
//
// Why: a trace of a fixed number of requests at twice the rate arrives in half the time, but
// its ramp (the engine filling) and its drain (the longest answers finishing in ever smaller
// batches) last as long. Over the whole run (first arrival to last token) they weigh twice as
// much at twice the rate, so the whole-run rate can fall past saturation while the engine's
// rate when loaded does not. The loaded rate leaves both out.
#pragma once

#include <cstdint>
#include <vector>

namespace kvvm::cli {

// The replay's state at one moment: seconds since the replay began (the trace's time zero), tokens
// delivered so far, requests running.
struct ReplaySample {
  double seconds = 0;
  std::uint64_t tokens = 0;
  std::uint32_t running = 0;
};

// The loaded window: from the first sample to the last that held kSteadyShare of the most
// running any sample saw (samples come about every tenth of a second and may miss the exact
// peak). A dip inside the window counts: it is the loaded engine's own loss.
inline constexpr double kSteadyShare = 0.9;

struct SteadyRate {
  double start_s = 0, end_s = 0;  // the window
  double tokens_per_s = 0;        // its tokens over its length; 0 when under the least asked for
};

// `samples` in time order, tokens never decreasing.
SteadyRate steady_rate(const std::vector<ReplaySample>& samples, double least_seconds);

}  // namespace kvvm::cli
