// The streamed layers' copy schedule (model/cuda_weight_ring.h says why it is shaped so).
#include "model/cuda/cuda_weight_ring.h"

#include <utility>

#include "model/cuda/cuda_status.h"

namespace kvvm::model::detail {

Result<std::unique_ptr<WeightRing>> WeightRing::create(const DeviceWeights& weights) {
  const WeightStore& store = weights.store();
  if (store.split().streamed_layers == 0) return std::unique_ptr<WeightRing>();
  std::unique_ptr<WeightRing> ring(new WeightRing(weights));
  ring->order_ = store.streamed_layers();
  ring->slots_ = store.split().ring_slots;
  ring->bytes_ = store.split().sizes.layer_bytes;
  KVVM_RETURN_IF_ERROR(
      cuda_call("cudaStreamCreateWithFlags",
                cudaStreamCreateWithFlags(&ring->copy_stream_, cudaStreamNonBlocking)));
  auto event = [](cudaEvent_t* out) {
    return cuda_call("cudaEventCreateWithFlags",
                     cudaEventCreateWithFlags(out, cudaEventDisableTiming));
  };
  KVVM_RETURN_IF_ERROR(event(&ring->start_));
  ring->copied_.assign(ring->order_.size(), nullptr);
  ring->read_.assign(ring->order_.size(), nullptr);
  for (std::size_t i = 0; i < ring->order_.size(); ++i) {
    KVVM_RETURN_IF_ERROR(event(&ring->copied_[i]));
    KVVM_RETURN_IF_ERROR(event(&ring->read_[i]));
  }
  return ring;
}

WeightRing::~WeightRing() {
  if (copy_stream_ != nullptr) (void)cudaStreamSynchronize(copy_stream_);
  for (cudaEvent_t e : copied_) {
    if (e != nullptr) (void)cudaEventDestroy(e);
  }
  for (cudaEvent_t e : read_) {
    if (e != nullptr) (void)cudaEventDestroy(e);
  }
  if (start_ != nullptr) (void)cudaEventDestroy(start_);
  if (copy_stream_ != nullptr) (void)cudaStreamDestroy(copy_stream_);
}

Status WeightRing::copy(std::uint32_t index) {
  const std::uint32_t layer = order_[index];
  void* to = reinterpret_cast<void*>(weights_.store().layer(layer));
  KVVM_RETURN_IF_ERROR(cuda_call(
      "cudaMemcpyAsync",
      cudaMemcpyAsync(to, weights_.staged(layer), bytes_, cudaMemcpyHostToDevice, copy_stream_)));
  ++copies_;
  return cuda_call("cudaEventRecord", cudaEventRecord(copied_[index], copy_stream_));
}

Status WeightRing::begin(cudaStream_t compute) {
  // Everything before the step (the previous step's reads of every slot included) is done
  // before the first copies start.
  KVVM_RETURN_IF_ERROR(cuda_call("cudaEventRecord", cudaEventRecord(start_, compute)));
  KVVM_RETURN_IF_ERROR(
      cuda_call("cudaStreamWaitEvent", cudaStreamWaitEvent(copy_stream_, start_, 0)));
  for (std::uint32_t i = 0; i < slots_ && i < order_.size(); ++i) KVVM_RETURN_IF_ERROR(copy(i));
  return Status::Ok();
}

Status WeightRing::before_layer(std::uint32_t layer, cudaStream_t compute) {
  if (!weights_.store().streamed(layer)) return Status::Ok();
  const std::uint32_t index = weights_.store().streamed_index(layer);
  return cuda_call("cudaStreamWaitEvent", cudaStreamWaitEvent(compute, copied_[index], 0));
}

Status WeightRing::after_layer(std::uint32_t layer, cudaStream_t compute) {
  if (!weights_.store().streamed(layer)) return Status::Ok();
  const std::uint32_t index = weights_.store().streamed_index(layer);
  const std::uint32_t next = index + slots_;
  if (next >= order_.size()) return Status::Ok();
  KVVM_RETURN_IF_ERROR(cuda_call("cudaEventRecord", cudaEventRecord(read_[index], compute)));
  KVVM_RETURN_IF_ERROR(
      cuda_call("cudaStreamWaitEvent", cudaStreamWaitEvent(copy_stream_, read_[index], 0)));
  return copy(next);
}

}  // namespace kvvm::model::detail
