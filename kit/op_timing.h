// Timing helpers for the measured tables of `kvvm info` (and later `kvvm bench`): time one
// call with a monotonic clock, then summarize a series of samples by its median and p99.
//
// Why median and p99, not mean: driver calls have rare slow outliers (a page-table split, a
// TLB shootdown, a context switch) that would swamp a mean; the median is the typical cost,
// the p99 the tail a scheduler's step actually feels.
//
// Why linear interpolation between closest ranks (numpy.percentile's default): the median of
// an even count is then the usual mean of the two middle samples, and anyone can check a
// table against numpy.percentile(samples, [50, 99]).
#pragma once

#include <chrono>
#include <cstddef>
#include <vector>

namespace kvvm::cli {

// The q-th percentile (0 <= q <= 100) of `samples`, interpolating linearly between the two
// closest ranks. REQUIRES: samples non-empty and 0 <= q <= 100; breaking either is a
// programming error and throws std::invalid_argument.
double percentile(std::vector<double> samples, double q);

struct TimingSummary {
  std::size_t samples = 0;
  double median_us = 0;
  double p99_us = 0;
};

// REQUIRES: samples_us non-empty (throws std::invalid_argument otherwise).
TimingSummary summarize(const std::vector<double>& samples_us);

// The per-sample sum of series of equal length: the cost of doing the calls one after the
// other, sample by sample (a median of sums, not a sum of medians). REQUIRES: equal lengths
// (throws std::invalid_argument otherwise).
std::vector<double> add_samples(const std::vector<double>& a, const std::vector<double>& b);

// Calls `call` once, appends its wall time in microseconds (steady_clock) to `samples_us`,
// and returns what it returned. The clock is read right around the call so nothing else
// (status checks, bookkeeping of the measurement) is counted.
template <typename F>
auto time_call(std::vector<double>& samples_us, F&& call) -> decltype(call()) {
  const auto start = std::chrono::steady_clock::now();
  auto result = call();
  const auto stop = std::chrono::steady_clock::now();
  samples_us.push_back(std::chrono::duration<double, std::micro>(stop - start).count());
  return result;
}

// Mean, p50, p99 (numpy's linear interpolation, as percentile) and max of a series, in the
// unit of the samples.
struct LatencySummary {
  std::size_t samples = 0;
  double mean = 0;
  double p50 = 0;
  double p99 = 0;
  double max = 0;
};
// REQUIRES: samples non-empty (std::invalid_argument otherwise).
LatencySummary summarize_latency(const std::vector<double>& samples);

}  // namespace kvvm::cli
