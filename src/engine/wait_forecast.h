// WaitForecast: how long a request queued now waits for a running place, played out from the
// work the places' holders and the requests ahead of it have left.
//
// The rate the queue drained at recently (RetryEstimate) cannot see a wave of long answers
// that holds every place: admissions stop for longer than any recent gap between them, and the
// requests accepted on that rate are refused later, in the queue. The work left can: each
// running answer frees its place after its steps left (its prompt's chunks and the tokens it
// is expected to generate still, OutputLengths), and each request in line takes the first
// place to free and holds it for its own steps. The stepping thread plays that out after every
// step into the step at which each position in line gets a place; a submit reads its position
// there, in seconds at the measured step period; positions past the line are played out on
// demand, each request holding a typical answer's steps.
//
// What it does not see: admissions held back by the KV budget or a step's prefill share, and
// the choices of an n > 1 request that take places when their prompt is computed. The engine
// takes the larger of this forecast and the rate's prediction.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

namespace kvvm::engine {

class WaitForecast {
 public:
  using Clock = std::chrono::steady_clock;
  // Positions played out at most; past them, a turnover share each (steps()).
  static constexpr std::size_t kMaxPositions = 1 << 16;

  // Replaces the forecast, made at `at`: `places` running places; `busy` the steps until each
  // occupied one frees; `queued` the steps each request in line, in order, will hold a place;
  // requests not yet in line hold `typical` steps; a step takes `step_seconds`.
  void build(std::uint32_t places, std::span<const double> busy, std::span<const double> queued,
             double typical, double step_seconds, Clock::time_point at);
  // No forecast: nothing learned yet, or forecasting off.
  void clear();
  // Steps from when it was made until the request at position `ahead` in line (0: the next)
  // gets a place, playing out the positions up to it not yet played (past kMaxPositions, the
  // last plus a turnover share, typical / places, for each further one). nullopt without a
  // forecast.
  std::optional<double> steps(std::uint64_t ahead);
  // The same in seconds from `now`: the steps at the step period, less the time since it was
  // made (at least 0).
  std::optional<double> wait(std::uint64_t ahead, Clock::time_point now);

 private:
  // The request at the next position takes the first place to free and holds it `holds`.
  void take(double holds);

  std::vector<double> admitted_at_;  // the step each position played out gets a place
  std::vector<double> heap_;         // when each place frees, after the positions played out
  double typical_ = 0;
  double turnover_ = 0;  // steps a position past kMaxPositions adds
  double step_seconds_ = 0;
  Clock::time_point at_{};
  bool valid_ = false;
};

}  // namespace kvvm::engine
