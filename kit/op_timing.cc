#include "kit/op_timing.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <stdexcept>
#include <string>

namespace kvvm::cli {

double percentile(std::vector<double> samples, double q) {
  if (samples.empty()) throw std::invalid_argument("percentile of no samples");
  if (!(q >= 0.0 && q <= 100.0)) {
    throw std::invalid_argument("percentile " + std::to_string(q) + " outside [0, 100]");
  }
  std::sort(samples.begin(), samples.end());
  // Rank h in [0, n-1]; the value sits between the samples at floor(h) and floor(h) + 1.
  const double h = (static_cast<double>(samples.size()) - 1.0) * q / 100.0;
  const auto lower = static_cast<std::size_t>(std::floor(h));
  const std::size_t upper = std::min(lower + 1, samples.size() - 1);
  const double fraction = h - static_cast<double>(lower);
  return samples[lower] + fraction * (samples[upper] - samples[lower]);
}

TimingSummary summarize(const std::vector<double>& samples_us) {
  TimingSummary summary;
  summary.samples = samples_us.size();
  summary.median_us = percentile(samples_us, 50.0);
  summary.p99_us = percentile(samples_us, 99.0);
  return summary;
}

std::vector<double> add_samples(const std::vector<double>& a, const std::vector<double>& b) {
  if (a.size() != b.size()) {
    throw std::invalid_argument("add_samples: series of " + std::to_string(a.size()) + " and " +
                                std::to_string(b.size()) + " samples");
  }
  std::vector<double> sum(a.size());
  for (std::size_t i = 0; i < a.size(); ++i) sum[i] = a[i] + b[i];
  return sum;
}

LatencySummary summarize_latency(const std::vector<double>& samples) {
  if (samples.empty()) throw std::invalid_argument("summarize_latency of no samples");
  LatencySummary summary;
  summary.samples = samples.size();
  summary.mean =
      std::accumulate(samples.begin(), samples.end(), 0.0) / static_cast<double>(samples.size());
  summary.p50 = percentile(samples, 50.0);
  summary.p99 = percentile(samples, 99.0);
  summary.max = *std::max_element(samples.begin(), samples.end());
  return summary;
}

}  // namespace kvvm::cli
