// WeightRing: the streamed layers' copies of one step, on a copy stream of their own, ordered
// against the compute stream by events only, so an eager step and a captured graph run the same
// schedule (a captured graph then replays it with no host work and no driver call).
//
// Streamed layer s (in layer order) lives at its own addresses, which alias ring slot
// s mod R. Per step:
//   begin:            the copy stream waits for the step's start, then copies layers 0..R-1;
//   before layer(s):  the compute stream waits for layer s's copy;
//   after layer(s):   the compute stream marks s's last read; the copy stream waits for it and
//                     copies layer s + R into the same slot.
// So a slot is overwritten only after every read of its previous occupant (what racecheck must
// see), and each copy runs under the compute of the layers before it.
//
// Not thread-safe: the model's one step at a time.
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "kvvm/base/status.h"
#include "model/cuda/cuda_weights.h"

namespace kvvm::model::detail {

class WeightRing {
 public:
  // Null (and Ok) when nothing is streamed.
  static Result<std::unique_ptr<WeightRing>> create(const DeviceWeights& weights);
  ~WeightRing();
  WeightRing(const WeightRing&) = delete;
  WeightRing& operator=(const WeightRing&) = delete;

  Status begin(cudaStream_t compute);
  Status before_layer(std::uint32_t layer, cudaStream_t compute);
  Status after_layer(std::uint32_t layer, cudaStream_t compute);
  // Layer copies enqueued by eager steps (a graph's replays are not seen by the host).
  std::uint64_t copies() const { return copies_.load(std::memory_order_relaxed); }

 private:
  explicit WeightRing(const DeviceWeights& weights) : weights_(weights) {}
  Status copy(std::uint32_t index);

  const DeviceWeights& weights_;
  std::vector<std::uint32_t> order_;  // streamed layers
  std::uint32_t slots_ = 0;
  std::uint64_t bytes_ = 0;  // per layer
  cudaStream_t copy_stream_ = nullptr;
  cudaEvent_t start_ = nullptr;
  std::vector<cudaEvent_t> copied_;       // per streamed layer
  std::vector<cudaEvent_t> read_;         // per streamed layer: after its last read
  std::atomic<std::uint64_t> copies_{0};  // read by other threads (a server's /metrics)
};

}  // namespace kvvm::model::detail
