// The output rate of a trace replay while the engine was loaded: the first to the last sample
// at kSteadyShare of the peak running.
#include "bench/drivers/engine/steady_rate.h"

#include <algorithm>
#include <cmath>

namespace kvvm::cli {

SteadyRate steady_rate(const std::vector<ReplaySample>& samples, double least_seconds) {
  SteadyRate rate;
  std::uint32_t peak = 0;
  for (const ReplaySample& sample : samples) peak = std::max(peak, sample.running);
  if (peak == 0) return rate;
  const auto needed = static_cast<std::uint32_t>(std::ceil(kSteadyShare * peak));
  const auto loaded = [&](const ReplaySample& sample) { return sample.running >= needed; };
  const auto first = std::find_if(samples.begin(), samples.end(), loaded);
  const auto last = std::find_if(samples.rbegin(), samples.rend(), loaded);
  rate.start_s = first->seconds;
  rate.end_s = last->seconds;
  const double seconds = rate.end_s - rate.start_s;
  if (seconds <= 0 || seconds < least_seconds) return rate;
  rate.tokens_per_s = static_cast<double>(last->tokens - first->tokens) / seconds;
  return rate;
}

}  // namespace kvvm::cli
