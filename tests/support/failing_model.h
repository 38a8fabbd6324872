// A model that answers as the one it wraps, except that forward call `fail_at` (1-based)
// fails with `error`, and, when `sticky`, every later call too: what a lost GPU context does
// (after an illegal address every call on the context fails the same way).
#pragma once

#include <atomic>
#include <utility>

#include "kvvm/model/model.h"

namespace kvvm::testing {

class FailingModel final : public model::Model {
 public:
  FailingModel(model::Model& inner, int fail_at, Status error, bool sticky = false)
      : Model(inner.config(), inner.limits()),
        inner_(inner),
        fail_at_(fail_at),
        error_(std::move(error)),
        sticky_(sticky) {}
  model::Backend backend() const override { return inner_.backend(); }
  Status forward(const model::StepBatch& batch, const model::StepOutput& out) override {
    const int call = ++calls_;
    if (call == fail_at_ || (sticky_ && call > fail_at_)) return error_;
    return inner_.forward(batch, out);
  }
  int calls() const { return calls_; }

 private:
  model::Model& inner_;
  const int fail_at_;
  const Status error_;
  const bool sticky_;
  std::atomic<int> calls_{0};
};

// The error a step meets on a lost context, as the CUDA model reports it.
inline Status illegal_address() {
  return Status::DriverError(
      "cudaStreamSynchronize failed: an illegal memory access was encountered",
      DriverFailure{"cudaStreamSynchronize", "cudaErrorIllegalAddress", 700});
}

}  // namespace kvvm::testing
