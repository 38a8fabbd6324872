// StepTimeModel: how long a step takes as a function of the tokens it computes, fitted from
// the steps the engine ran, so the scheduler can size a decoding step's prefill share to a
// time-per-output-token target (EngineOptions::tpot_target), and raise it to what the prompts
// waiting for their first token need to meet a time-to-first-token target
// (EngineOptions::ttft_target).
//
// Why a line: a step's time is a fixed part (launches, weight reads, host work) plus a part
// that grows with its tokens (prefill rows' matrix work, their attention). The fit is a least
// squares line over every step seen, each older step weighing kDecay times the next, so it
// follows a load that changes (longer contexts, another batch) without a window to tune.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <span>

namespace kvvm::engine {

class StepTimeModel {
 public:
  static constexpr double kDecay = 0.95;
  // Tokens, squared, the steps' token counts must spread over (weighted variance) before a
  // slope is trusted: steps of one size say nothing about the cost of a token.
  static constexpr double kMinSpread = 1.0;

  // A prompt still without its first token, as deadline_share sees it.
  struct PromptDue {
    std::uint32_t tokens_left = 0;  // prompt tokens still to compute
    // Until its deadline (submitted + ttft_target - now); negative: already late; infinity: no
    // deadline, only tokens served ahead of the prompts behind it (a preempted answer
    // recomputed).
    double seconds_left = 0;
  };

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

  // The smallest prefill share S in [1, most] a step holding `decodes` decode tokens needs so
  // that, if every step until then also computed S prompt tokens of `prompts` (in the order
  // the scheduler serves them: prompt i finishes after ceil(C_i / S) steps, C_i the tokens
  // left of prompts 0..i) and took predict(decodes + S), each prompt finishes within its
  // seconds_left. `most` is first lowered to the prompts' tokens in all (a larger share has
  // nothing more to compute). Only the prompts that can still make it at S = most count: one
  // already late, or one that cannot make it even at `most`, is left out (chasing it would
  // only slow the others); its tokens still count for those behind it. 0 when no prompt
  // constrains (none counts, or no tokens at all); nullopt until fitted (as prefill_share).
  //
  // Why the smallest: a larger share costs the running answers' time per token at every step;
  // the time-to-first-token target buys only what a deadline needs. ceil makes a prompt's time
  // not monotone in S (more tokens a step can still take as many steps, each longer), so the
  // answer is searched exactly, not bisected (O(prompts) a candidate, candidates few).
  std::optional<std::uint32_t> deadline_share(std::uint32_t decodes,
                                              std::span<const PromptDue> prompts,
                                              std::uint32_t most) const;

 private:
  struct Line {
    double fixed = 0;      // seconds
    double per_token = 0;  // seconds
  };
  std::optional<Line> line() const;
  // Seconds of a step of `tokens` on `l`.
  static double seconds(const Line& l, std::uint64_t tokens) {
    return l.fixed + l.per_token * static_cast<double>(tokens);
  }

  // Weighted sums of the observations (x: tokens, y: seconds).
  double weight_ = 0, x_ = 0, xx_ = 0, y_ = 0, xy_ = 0;
};

}  // namespace kvvm::engine
