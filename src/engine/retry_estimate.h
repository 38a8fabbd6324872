// RetryEstimate: when a request refused as overloaded should come back, and how long a new one
// would wait. The queue ahead of it drains at the rate requests recently left it (admitted);
// that rate is measured over the last few admissions rather than assumed, so the estimate
// follows the load. It is bounded by the drain measured while requests waited: admissions into
// places that were free (a cold engine filling up, a queue that ran empty) are arrivals passing
// through, not the queue draining, and alone they make the rate look as fast as the arrivals
// just when a queue forms. How far the predictions fell short of the waits that followed is
// measured too (margin): a bound compared with a prediction times the margin refuses at arrival the
// requests the queue would otherwise refuse after making them wait.
#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>

namespace kvvm::engine {

class RetryEstimate {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr double kMinSeconds = 1;
  static constexpr double kMaxSeconds = 3600;

  // A request left the queue (was admitted) at `when`.
  void note_admission(Clock::time_point when);
  // A step ended at `now`: since the last call requests were waiting (`backlog`, as the last
  // step left the queue), and `admitted` of them were admitted. Counts toward the drain
  // while backlogged, both sums decaying by e^(-t / kBacklogDecay).
  void note_step(Clock::time_point now, bool backlog, std::uint32_t admitted);
  static constexpr double kBacklogDecay = 30;  // seconds
  // Seconds until `waiting` requests ahead have been admitted: at the recent rate, else (no
  // recent admission) one second per `parallel` of them. Clamped to [1, 3600].
  double seconds(std::uint64_t waiting, std::uint32_t parallel, Clock::time_point now) const;
  // Seconds a request queued now waits behind the `ahead` requests already queued, at the
  // measured rate, unclamped. nullopt while no rate is measured (fewer than two admissions in
  // the window, or none yet): a guess must never refuse anyone.
  std::optional<double> predicted_wait(std::uint64_t ahead, Clock::time_point now) const;

  // A request predicted at submit to wait `predicted` seconds was admitted after `waited`.
  // Predictions below `floor` count as `floor`: a wait far past a near-zero prediction but well
  // inside the bound it is checked against says little about the predictions near the bound.
  void note_wait(double predicted, double waited, double floor);
  // The largest waited / predicted of the last kWaitSamples admissions noted, within
  // [1, kMaxMargin]: 1 until a wait outlasted its prediction.
  double margin() const;
  static constexpr double kMaxMargin = 8;

 private:
  // Admissions per second over the window, at most the backlog's (admitted + 1) / seconds
  // once requests have waited: n admissions in t seconds of waiting say the drain is not
  // much faster than (n + 1) / t. nullopt when the window measures none.
  std::optional<double> rate(Clock::time_point now) const;

  // Admissions older than this say nothing about the rate now.
  static constexpr std::chrono::seconds kWindow{60};
  static constexpr std::size_t kSamples = 64;
  std::array<Clock::time_point, kSamples> times_{};  // a ring of the latest admissions
  std::size_t next_ = 0;
  std::size_t count_ = 0;
  // Waited over predicted, for the latest admissions that had a prediction.
  static constexpr std::size_t kWaitSamples = 32;
  std::array<double, kWaitSamples> shortfalls_{};
  std::size_t next_shortfall_ = 0;
  // The decayed seconds spent with requests waiting, and the admissions out of that backlog.
  double backlog_seconds_ = 0, backlog_admissions_ = 0;
  std::optional<Clock::time_point> last_step_;
};

}  // namespace kvvm::engine
