// Uploads a checkpoint's tensors to the device in the compute type. A tensor already in that
// type is copied straight from the mapping; another (F32, or the other 16-bit type) is
// converted on the host a slice at a time (round to nearest even, as torch's .to() does).
#include "model/cuda_weights.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "kernels/element.h"
#include "model/cuda_status.h"

namespace kvvm::model::detail {
namespace {

constexpr std::uint64_t kConvertElements = std::uint64_t{1} << 20;  // per host slice

DType element_of(TensorDType dtype) {
  switch (dtype) {
    case TensorDType::kF16:
      return DType::kFp16;
    case TensorDType::kBf16:
      return DType::kBf16;
    case TensorDType::kF32:
      return DType::kFp32;
    default:
      return DType::kUnset;
  }
}

Status check_tensor(const TensorView* tensor, const std::string& role,
                    const std::vector<std::uint64_t>& shape) {
  if (tensor == nullptr) {
    return Status::InvalidArgument("CUDA model: the weights have no " + role + " tensor");
  }
  if (element_of(tensor->dtype) == DType::kUnset) {
    return Status::InvalidArgument("CUDA model: tensor " + tensor->name + " has dtype " +
                                   std::string(to_string(tensor->dtype)) +
                                   "; the CUDA model reads BF16, F16 and F32");
  }
  if (tensor->shape != shape) {
    return Status::InvalidArgument("CUDA model: tensor " + tensor->name + " has shape " +
                                   shape_string(tensor->shape) + ", the config asks for " +
                                   shape_string(shape));
  }
  const std::uint64_t want = tensor->elements() * element_size(tensor->dtype);
  if (tensor->bytes != want || (want > 0 && tensor->data == nullptr)) {
    return Status::InvalidArgument("CUDA model: tensor " + tensor->name + " holds " +
                                   std::to_string(tensor->bytes) + " bytes, its shape needs " +
                                   std::to_string(want));
  }
  return Status::Ok();
}

// Copies the tensor to `device` (elements in `compute`, contiguous).
Status copy_tensor(const TensorView& tensor, DType compute, void* device) {
  const DType source = element_of(tensor.dtype);
  if (source == compute) {
    return cuda_call("cudaMemcpy",
                     cudaMemcpy(device, tensor.data, tensor.bytes, cudaMemcpyHostToDevice));
  }
  const std::uint64_t elements = tensor.elements();
  const std::uint32_t from_size = element_bytes(source), to_size = element_bytes(compute);
  std::vector<unsigned char> slice(std::min(elements, kConvertElements) * to_size);
  const auto* from = reinterpret_cast<const unsigned char*>(tensor.data);
  auto* to = static_cast<unsigned char*>(device);
  for (std::uint64_t done = 0; done < elements; done += kConvertElements) {
    const std::uint64_t count = std::min(kConvertElements, elements - done);
    for (std::uint64_t i = 0; i < count; ++i) {
      const float value = kernels::load_element(source, from + (done + i) * from_size);
      kernels::store_element(compute, value, slice.data() + i * to_size);
    }
    KVVM_RETURN_IF_ERROR(cuda_call(
        "cudaMemcpy",
        cudaMemcpy(to + done * to_size, slice.data(), count * to_size, cudaMemcpyHostToDevice)));
  }
  return Status::Ok();
}

}  // namespace

Result<void*> DeviceWeights::allocate(std::uint64_t size) {
  void* pointer = nullptr;
  const cudaError_t error = cudaMalloc(&pointer, std::max<std::uint64_t>(size, 16));
  if (error != cudaSuccess) {
    (void)cudaGetLastError();  // not sticky: keep it out of the next launch check
    return cuda_call("cudaMalloc", error)
        .with_context("CUDA model: weights (" + std::to_string(size) + " bytes more after " +
                      std::to_string(bytes) + ")");
  }
  allocations_.push_back(pointer);
  bytes += size;
  return pointer;
}

DeviceWeights::~DeviceWeights() {
  for (void* pointer : allocations_) (void)cudaFree(pointer);
}

Result<std::unique_ptr<DeviceWeights>> DeviceWeights::upload(const ModelConfig& config,
                                                             const ModelWeights& weights,
                                                             DType compute) {
  const std::uint64_t hidden = config.hidden_size, inter = config.intermediate_size;
  const std::uint64_t q_dim = std::uint64_t{config.heads} * config.head_dim;
  const std::uint64_t kv_dim = std::uint64_t{config.kv_heads} * config.head_dim;
  const std::uint64_t vocab = config.vocab_size;
  const std::uint32_t size = element_bytes(compute);
  std::unique_ptr<DeviceWeights> device(new DeviceWeights());

  // Checks, allocates and copies one tensor; `into` receives the device pointer.
  auto upload_one = [&](const TensorView* tensor, const std::string& role,
                        const std::vector<std::uint64_t>& shape, void*& into) -> Status {
    KVVM_RETURN_IF_ERROR(check_tensor(tensor, role, shape));
    Result<void*> memory = device->allocate(tensor->elements() * size);
    if (!memory.ok()) return memory.status();
    into = *memory;
    return copy_tensor(*tensor, compute, into);
  };

  KVVM_RETURN_IF_ERROR(upload_one(weights.embed, "embedding", {vocab, hidden}, device->embed));
  if (weights.layers.size() != config.layers) {
    return Status::InvalidArgument("CUDA model: the weights hold " +
                                   std::to_string(weights.layers.size()) + " layers, the config " +
                                   std::to_string(config.layers));
  }
  device->layers.resize(config.layers);
  for (std::uint32_t l = 0; l < config.layers; ++l) {
    const LayerWeights& w = weights.layers[l];
    DeviceLayer& d = device->layers[l];
    const std::string layer = "layer " + std::to_string(l) + " ";
    KVVM_RETURN_IF_ERROR(
        upload_one(w.input_norm, layer + "input_layernorm", {hidden}, d.input_norm));
    KVVM_RETURN_IF_ERROR(upload_one(w.q, layer + "q_proj", {q_dim, hidden}, d.q));
    KVVM_RETURN_IF_ERROR(upload_one(w.k, layer + "k_proj", {kv_dim, hidden}, d.k));
    KVVM_RETURN_IF_ERROR(upload_one(w.v, layer + "v_proj", {kv_dim, hidden}, d.v));
    if (config.qkv_bias) {
      KVVM_RETURN_IF_ERROR(upload_one(w.q_bias, layer + "q_proj bias", {q_dim}, d.q_bias));
      KVVM_RETURN_IF_ERROR(upload_one(w.k_bias, layer + "k_proj bias", {kv_dim}, d.k_bias));
      KVVM_RETURN_IF_ERROR(upload_one(w.v_bias, layer + "v_proj bias", {kv_dim}, d.v_bias));
    }
    KVVM_RETURN_IF_ERROR(upload_one(w.o, layer + "o_proj", {hidden, q_dim}, d.o));
    if (config.o_bias) {
      KVVM_RETURN_IF_ERROR(upload_one(w.o_bias, layer + "o_proj bias", {hidden}, d.o_bias));
    }
    KVVM_RETURN_IF_ERROR(
        upload_one(w.post_norm, layer + "post_attention_layernorm", {hidden}, d.post_norm));
    KVVM_RETURN_IF_ERROR(check_tensor(w.gate, layer + "gate_proj", {inter, hidden}));
    KVVM_RETURN_IF_ERROR(check_tensor(w.up, layer + "up_proj", {inter, hidden}));
    Result<void*> gate_up = device->allocate(2 * inter * hidden * size);
    if (!gate_up.ok()) return gate_up.status();
    d.gate_up = *gate_up;
    KVVM_RETURN_IF_ERROR(copy_tensor(*w.gate, compute, d.gate_up));
    KVVM_RETURN_IF_ERROR(copy_tensor(
        *w.up, compute, static_cast<unsigned char*>(d.gate_up) + inter * hidden * size));
    KVVM_RETURN_IF_ERROR(upload_one(w.down, layer + "down_proj", {hidden, inter}, d.down));
  }
  KVVM_RETURN_IF_ERROR(upload_one(weights.final_norm, "final norm", {hidden}, device->final_norm));
  if (weights.lm_head == weights.embed ||
      (weights.lm_head == nullptr && config.tie_word_embeddings)) {
    device->lm_head = device->embed;
  } else {
    KVVM_RETURN_IF_ERROR(upload_one(weights.lm_head, "lm_head", {vocab, hidden}, device->lm_head));
  }
  return device;
}

}  // namespace kvvm::model::detail
