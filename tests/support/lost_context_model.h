// A model whose GPU context is lost at forward call `lose_at` (1-based): that call and every
// later one fail with a sticky CUDA error (cudaErrorIllegalAddress), as every call on a real
// context does after a kernel or copy touched an unmapped address. Before it, the wrapped
// model answers.
#pragma once

#include <atomic>

#include "kvvm/model/model.h"

namespace kvvm::testing {

class LostContextModel final : public model::Model {
 public:
  LostContextModel(model::Model& inner, int lose_at)
      : Model(inner.config(), inner.limits()), inner_(inner), lose_at_(lose_at) {}
  model::Backend backend() const override { return inner_.backend(); }
  Status forward(const model::StepBatch& batch, const model::StepOutput& out) override {
    if (++calls_ >= lose_at_) {
      return Status::DriverError(
          "cudaStreamSynchronize failed: an illegal memory access was encountered",
          DriverFailure{"cudaStreamSynchronize", "cudaErrorIllegalAddress", 700});
    }
    return inner_.forward(batch, out);
  }
  int calls() const { return calls_; }

 private:
  model::Model& inner_;
  const int lose_at_;
  std::atomic<int> calls_{0};
};

}  // namespace kvvm::testing
