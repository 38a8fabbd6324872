// StepTimeModel: how long a step takes as a function of the tokens it computes, fitted from
// the steps the engine ran, so the scheduler can size a decoding step's prefill share to a
// time-per-output-token target (EngineOptions::tpot_target).
//
// Why a line: a step's time is a fixed part (launches, weight reads, host work) plus a part
// that grows with its tokens (prefill rows' matrix work, their attention). The fit is a least
// squares line over every step seen, each older step weighing kDecay times the next, so it
// follows a load that changes (longer contexts, another batch) without a window to tune.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>

namespace kvvm::engine {

class StepTimeModel {
 public:
  static constexpr double kDecay = 0.95;
  // Tokens, squared, the steps' token counts must spread over (weighted variance) before a
  // slope is trusted: steps of one size say nothing about the cost of a token.
  static constexpr double kMinSpread = 1.0;

  // A step of `tokens` tokens took `took`.
  void observe(std::uint32_t tokens, std::chrono::nanoseconds took);

  // Seconds a step of `tokens` tokens is predicted to take; nullopt until fitted (two sizes of
  // step seen, and a positive cost per token).
  std::optional<double> predict(std::uint32_t tokens) const;

  // The most prefill tokens a step that already holds `decodes` decode tokens can add and stay
  // within `target` (at least `floor`, so prompts advance when the decodes alone reach it);
  // nullopt until fitted.
  std::optional<std::uint32_t> prefill_share(std::chrono::nanoseconds target, std::uint32_t decodes,
                                             std::uint32_t floor) const;

 private:
  struct Line {
    double fixed = 0;      // seconds
    double per_token = 0;  // seconds
  };
  std::optional<Line> line() const;

  // Weighted sums of the observations (x: tokens, y: seconds).
  double weight_ = 0, x_ = 0, xx_ = 0, y_ = 0, xy_ = 0;
};

}  // namespace kvvm::engine
