// Creation and teardown of the CUDA model: checks the config and limits, finds the device and
// cuBLAS, uploads the weights, and sizes every buffer a step uses.
#include "model/cuda/cuda_model.h"

#include <algorithm>
#include <string>

#include "base/format.h"  // str
#include "kvvm/kernels/attention.h"
#include "kvvm/kernels/fp8_kernels.h"
#include "kvvm/kernels/model_kernels.h"
#include "kvvm/kernels/moe_kernels.h"
#include "model/cuda/cublas_api.h"
#include "model/cuda/cuda_status.h"
#include "model/rope.h"

namespace kvvm::model {
namespace detail {
namespace {

constexpr std::size_t kCublasWorkspaceBytes = std::size_t{32} << 20;  // cuBLAS's Hopper advice
constexpr std::uint64_t kBufferAlignment = 256;

Status check_config(const ModelConfig& c, const ModelLimits& limits) {
  if (c.hidden_size == 0 || c.intermediate_size == 0 || c.layers == 0 || c.vocab_size == 0 ||
      c.max_position_embeddings == 0) {
    return Status::InvalidArgument(
        "CUDA model: hidden_size, intermediate_size, num_hidden_layers, vocab_size and "
        "max_position_embeddings must be positive");
  }
  if (c.heads == 0 || c.kv_heads == 0 || c.heads % c.kv_heads != 0) {
    return Status::InvalidArgument("CUDA model: " + str(c.heads) +
                                   " attention heads are not a positive multiple of " +
                                   str(c.kv_heads) + " KV heads");
  }
  if (c.head_dim != 64 && c.head_dim != 128) {
    return Status::InvalidArgument("CUDA model: head dim " + str(c.head_dim) +
                                   " is not supported by the CUDA attention kernels (64, 128); "
                                   "use the CPU backend");
  }
  if (limits.max_step_tokens == 0 || limits.max_chunks == 0) {
    return Status::InvalidArgument("CUDA model: limits of " + str(limits.max_step_tokens) +
                                   " tokens and " + str(limits.max_chunks) +
                                   " chunks per step; both must be positive");
  }
  if (limits.max_logit_adjustments < c.vocab_size) {
    return Status::InvalidArgument("CUDA model: max_logit_adjustments " +
                                   str(limits.max_logit_adjustments) +
                                   " is below the vocabulary of " + str(c.vocab_size) +
                                   " (one draw's transforms must always fit)");
  }
  if (limits.max_chunks > 65535 || limits.max_step_tokens > (1u << 24)) {
    return Status::InvalidArgument("CUDA model: limits of " + str(limits.max_step_tokens) +
                                   " tokens and " + str(limits.max_chunks) +
                                   " chunks per step; at most 16777216 tokens and 65535 chunks");
  }
  return Status::Ok();
}

Result<DType> choose_compute(const ModelConfig& config, const ModelWeights& weights,
                             const WeightOptions& placement, DType asked) {
  if (asked == DType::kBf16 || asked == DType::kFp16) return asked;
  if (asked != DType::kUnset) {
    return Status::InvalidArgument("CUDA model: compute type " + std::string(to_string(asked)) +
                                   " is not supported (bf16 or fp16)");
  }
  // The checkpoint's: fp16 stays fp16; bf16 and F32 run in bf16 (its range is float32's).
  if (placement.format == LoadFormat::kDummy) {
    return config.dtype == DType::kFp16 ? DType::kFp16 : DType::kBf16;
  }
  if (weights.embed != nullptr && weights.embed->dtype == TensorDType::kF16) return DType::kFp16;
  return DType::kBf16;
}

// Floats of the activation scales for `rows` rows of `in`: one per row and group of 128
// (block-scaled), one per row (per channel), rows padded as fp8_padded_rows says.
std::uint64_t fp8_scale_floats(WeightQuant quant, std::uint64_t rows, std::uint64_t in) {
  const std::uint64_t stride = fp8_padded_rows(static_cast<std::uint32_t>(rows));
  return quant == WeightQuant::kFp8Block ? (in + kFp8WeightBlock - 1) / kFp8WeightBlock * stride
                                         : stride;
}

// The FP8 GEMMs' shapes: cuBLASLt's block-scaled FP8 reads whole 128 x 128 blocks, so every
// projection's dimensions must be multiples of 128 (those of every released FP8 model are).
Status check_fp8_shapes(const ModelConfig& c) {
  if (c.weight_quant != WeightQuant::kFp8Block) return Status::Ok();
  const std::pair<const char*, std::uint64_t> dims[] = {
      {"hidden_size", c.hidden_size},
      {"intermediate_size", c.intermediate_size},
      {"num_attention_heads * head_dim", std::uint64_t{c.heads} * c.head_dim},
      {"num_key_value_heads * head_dim", std::uint64_t{c.kv_heads} * c.head_dim}};
  for (const auto& [name, value] : dims) {
    if (value % kFp8WeightBlock != 0) {
      return Status::InvalidArgument(
          "CUDA model: " + std::string(name) + " = " + std::to_string(value) +
          " is not a multiple of 128, which the block-scaled FP8 GEMMs need (the CPU backend "
          "runs this checkpoint)");
    }
  }
  return Status::Ok();
}

Status cuda_device_available() {
  int count = 0;
  const cudaError_t error = cudaGetDeviceCount(&count);
  if (error != cudaSuccess) {
    (void)cudaGetLastError();
    return Status::Unavailable(std::string("CUDA model: no usable CUDA device (") +
                               cudaGetErrorName(error) + ": " + cudaGetErrorString(error) + ")");
  }
  if (count == 0) return Status::Unavailable("CUDA model: no CUDA device");
  return Status::Ok();
}

Status cublas_call(const char* call, cublasStatus_t status) {
  if (status == CUBLAS_STATUS_SUCCESS) return Status::Ok();
  const std::string name = cublas_status_name(status);
  return Status::DriverError(std::string(call) + " failed: " + name,
                             DriverFailure{call, name, static_cast<int>(status)});
}

}  // namespace

Result<std::unique_ptr<Model>> CudaModel::create(const ModelConfig& config,
                                                 const ModelWeights& weights,
                                                 const CudaModelOptions& options) {
  KVVM_RETURN_IF_ERROR(check_config(config, options.limits));
  KVVM_RETURN_IF_ERROR(check_fp8_shapes(config));
  if (!attention_kernels_built() || !model_kernels_built()) {
    return Status::Unavailable("CUDA model: this build has no CUDA kernels");
  }
  KVVM_RETURN_IF_ERROR(cuda_device_available());
  const CublasLibrary& cublas = cublas_library();
  if (!cublas.usable()) return Status::Unavailable("CUDA model: " + cublas.error);
  KVVM_ASSIGN_OR_RETURN(KvScales scales,
                        checkpoint_kv_scales(config, weights, options.weights.format));
  std::unique_ptr<CudaModel> model(new CudaModel(config, options.limits));
  KVVM_RETURN_IF_ERROR(model->set_kv_scales(std::move(scales)));
  KVVM_RETURN_IF_ERROR(model->init(weights, options));
  return std::unique_ptr<Model>(std::move(model));
}

Status CudaModel::init(const ModelWeights& weights, const CudaModelOptions& options) {
  KVVM_ASSIGN_OR_RETURN(DType compute,
                        choose_compute(config(), weights, options.weights, options.compute));
  compute_ = compute;
  fused_ = options.fused;
  data_type_ = compute_ == DType::kBf16 ? CUDA_R_16BF : CUDA_R_16F;
  KVVM_RETURN_IF_ERROR(cuda_call("cudaGetDevice", cudaGetDevice(&device_)));
  if (options.stream != nullptr) {
    stream_ = static_cast<cudaStream_t>(options.stream);
  } else {
    KVVM_RETURN_IF_ERROR(cuda_call("cudaStreamCreateWithFlags",
                                   cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking)));
    own_stream_ = true;
  }
  KVVM_ASSIGN_OR_RETURN(
      std::unique_ptr<DeviceWeights> uploaded,
      DeviceWeights::upload(config(), weights, compute_, options.weights, stream_));
  weights_ = std::move(uploaded);
  Result<std::unique_ptr<WeightRing>> ring = WeightRing::create(*weights_);
  if (!ring.ok()) return ring.status().with_context("CUDA model: the weight ring");
  ring_ = std::move(ring).value();
  KVVM_RETURN_IF_ERROR(allocate_buffers());
  KVVM_RETURN_IF_ERROR(plan_decode_workspace());

  const CublasApi& api = cublas_library().api;
  KVVM_RETURN_IF_ERROR(cublas_call("cublasCreate_v2", api.create(&cublas_)));
  KVVM_RETURN_IF_ERROR(cublas_call("cublasSetStream_v2", api.set_stream(cublas_, stream_)));
  // After SetStream, which resets a handle to cuBLAS's own pool: a workspace of ours means
  // cuBLAS allocates nothing during a step (or a graph capture).
  KVVM_ASSIGN_OR_RETURN(void* workspace, device_alloc(kCublasWorkspaceBytes));
  cublas_workspace_ = workspace;
  KVVM_RETURN_IF_ERROR(
      cublas_call("cublasSetWorkspace_v2",
                  api.set_workspace(cublas_, cublas_workspace_, kCublasWorkspaceBytes)));

  if (config().weight_quant != WeightQuant::kNone) {
    // cuBLASLt's FP8 GEMM shares the cuBLAS workspace: both run on the one stream, in turn.
    Result<std::unique_ptr<Fp8Matmul>> gemm =
        Fp8Matmul::create(cublas_workspace_, kCublasWorkspaceBytes);
    if (!gemm.ok()) return gemm.status().with_context("CUDA model: FP8 weights");
    fp8_matmul_ = std::move(gemm).value();
  }

  // On the model's stream, so every forward is ordered after it (a cudaMemcpy from pageable
  // memory returns before its DMA to the device is done, on the legacy stream, which the
  // non-blocking stream_ does not wait for); the bytes are staged when the call returns.
  const std::vector<float> inv_freq = rope_inv_freq(config());
  KVVM_RETURN_IF_ERROR(
      cuda_call("cudaMemcpyAsync",
                cudaMemcpyAsync(inv_freq_, inv_freq.data(), inv_freq.size() * sizeof(float),
                                cudaMemcpyHostToDevice, stream_)));
  runs_.reserve(limits().max_chunks);
  chunk_rows_.reserve(limits().max_chunks);
  return Status::Ok();
}

Result<void*> CudaModel::device_alloc(std::uint64_t bytes) {
  void* pointer = nullptr;
  const cudaError_t error = cudaMalloc(&pointer, std::max<std::uint64_t>(bytes, 16));
  if (error != cudaSuccess) {
    (void)cudaGetLastError();
    return cuda_call("cudaMalloc", error)
        .with_context("CUDA model: " + str(bytes) + " bytes of step buffers");
  }
  allocations_.push_back(pointer);
  return pointer;
}

Status CudaModel::allocate_buffers() {
  const ModelConfig& c = config();
  // Rows padded to a multiple of 4: an FP8 GEMM writes whole groups of 4 rows (linear_fp8).
  const std::uint64_t tokens = fp8_padded_rows(limits().max_step_tokens);
  const std::uint64_t chunks = limits().max_chunks;
  const std::uint64_t size = element_bytes(compute_);
  const std::uint64_t q_dim = std::uint64_t{c.heads} * c.head_dim;
  const std::uint64_t kv_dim = std::uint64_t{c.kv_heads} * c.head_dim;
  offsets_.ids = 0;
  offsets_.positions = offsets_.ids + limits().max_step_tokens;
  offsets_.row_slots = offsets_.positions + limits().max_step_tokens;
  offsets_.decode_slots = offsets_.row_slots + limits().max_step_tokens;
  offsets_.decode_lengths = offsets_.decode_slots + limits().max_chunks;
  offsets_.last_rows = offsets_.decode_lengths + limits().max_chunks;
  offsets_.sampling = offsets_.last_rows + limits().max_chunks;
  static_assert(sizeof(SamplingRow) % 4 == 0 && sizeof(LogprobRow) % 4 == 0 &&
                sizeof(LogitAdjustRow) % 4 == 0);
  offsets_.logprob_rows = offsets_.sampling + limits().max_chunks * (sizeof(SamplingRow) / 4);
  offsets_.adjust_rows = offsets_.logprob_rows + limits().max_chunks * (sizeof(LogprobRow) / 4);
  offsets_.mask_rows = offsets_.adjust_rows + limits().max_chunks * (sizeof(LogitAdjustRow) / 4);
  offsets_.words = offsets_.mask_rows + limits().max_chunks;
  // The prompt rows' indices and LogprobRows.
  const std::uint64_t prompt_bytes = tokens * (4 + sizeof(LogprobRow));
  const std::uint64_t result_bytes = (chunks + tokens) * sizeof(LogprobResult);
  // The logit-transform entries: 16 bytes each, on the device and again pinned on the host
  // (4 MiB each at the default 2^18; the rows above add 20 bytes a chunk).
  const std::uint64_t adjust_bytes =
      std::uint64_t{limits().max_logit_adjustments} * sizeof(LogitAdjustEntry);

  // One allocation carved into aligned pieces, in this order.
  struct Piece {
    void** into;
    std::uint64_t bytes;
  };
  void* arrays = nullptr;
  void* inv_freq = nullptr;
  void* logits = nullptr;
  void* argmax = nullptr;
  void* argmax_partials = nullptr;
  void* sampled = nullptr;
  void* results = nullptr;
  void* prompt = nullptr;
  void* adjustments = nullptr;
  void* token_masks = nullptr;
  void* kv_scale_table = nullptr;
  void* calibration = nullptr;
  void* xq = nullptr;
  void* xq_scales = nullptr;
  const bool fp8 = c.weight_quant != WeightQuant::kNone;
  // The dense MLP's buffers serve a shared expert too.
  const std::uint64_t inter =
      std::max(std::uint64_t{c.intermediate_size}, std::uint64_t{c.moe.shared_intermediate});
  const std::uint64_t widest = std::max({std::uint64_t{c.hidden_size}, q_dim, inter});
  const MoeConfig& moe = c.moe;
  const std::uint64_t pairs = tokens * moe.top_k;
  const std::uint64_t capacity = moe.enabled()
                                     ? moe_permuted_rows(static_cast<std::uint32_t>(tokens),
                                                         moe.top_k, moe.experts, kMoeRowTile)
                                     : 0;
  void* moe_ids = nullptr;
  void* moe_weights = nullptr;
  void* moe_offsets = nullptr;
  void* moe_rows = nullptr;
  void* moe_slots = nullptr;
  void* moe_active = nullptr;
  const Piece pieces[] = {
      {&arrays, std::uint64_t{offsets_.words} * 4},
      {&inv_freq, std::uint64_t{c.head_dim / 2} * sizeof(float)},
      {&x_, tokens * c.hidden_size * size},
      {&normed_, tokens * c.hidden_size * size},
      {&qkv_, fused_ ? tokens * (q_dim + 2 * kv_dim) * size : 0},  // the fused projection's
      {&q_, tokens * q_dim * size},
      {&k_, tokens * kv_dim * size},
      {&v_, tokens * kv_dim * size},
      {&attn_, tokens * q_dim * size},
      {&delta_, tokens * c.hidden_size * size},
      {&gate_up_, tokens * 2 * inter * size},
      {&act_, tokens * inter * size},
      {&router_logits_, tokens * moe.experts * size},
      {&moe_ids, pairs * sizeof(std::int32_t)},
      {&moe_weights, pairs * sizeof(float)},
      {&moe_offsets, moe.enabled() ? (moe.experts + 1) * sizeof(std::uint32_t) : 0},
      {&moe_rows, capacity * sizeof(std::uint32_t)},
      {&moe_slots, pairs * sizeof(std::uint32_t)},
      {&moe_active, moe.enabled() ? (moe.experts + 1) * sizeof(std::uint32_t) : 0},
      {&moe_act_, capacity * moe.expert_intermediate * size},
      {&moe_pairs_, pairs * c.hidden_size * size},
      {&shared_out_, moe.shared_intermediate > 0 ? tokens * c.hidden_size * size : 0},
      {&shared_logit_, moe.shared_intermediate > 0 ? tokens * size : 0},
      {&final_, chunks * c.hidden_size * size},
      {&logits, chunks * c.vocab_size * sizeof(float)},
      {&argmax, chunks * sizeof(std::int32_t)},
      {&argmax_partials, fused_ ? chunks * kArgmaxSplits * sizeof(ArgmaxPartial) : 0},
      {&sampled, chunks * sizeof(std::int32_t)},
      {&results, result_bytes},
      {&prompt, prompt_bytes},
      {&adjustments, adjust_bytes},
      {&token_masks, chunks * token_mask_words(c.vocab_size) * sizeof(std::uint32_t)},
      {&kv_scale_table, std::uint64_t{2} * c.layers * c.kv_heads * sizeof(float)},
      {&calibration, 2 * sizeof(float)},
      // An FP8 checkpoint's quantized activations and their scales, for the widest input.
      {&xq, fp8 ? tokens * widest : 0},
      {&xq_scales, fp8 ? fp8_scale_floats(c.weight_quant, tokens, widest) * sizeof(float) : 0},
  };
  auto aligned = [](std::uint64_t bytes) {
    return (bytes + kBufferAlignment - 1) / kBufferAlignment * kBufferAlignment;
  };
  std::uint64_t total = 0;
  for (const Piece& piece : pieces) total += aligned(piece.bytes);
  KVVM_ASSIGN_OR_RETURN(void* block, device_alloc(total));
  auto* at = static_cast<unsigned char*>(block);
  for (const Piece& piece : pieces) {
    *piece.into = at;
    at += aligned(piece.bytes);
  }
  arrays_ = static_cast<std::uint32_t*>(arrays);
  if (moe.enabled()) {
    moe_ids_ = static_cast<std::int32_t*>(moe_ids);
    moe_weights_ = static_cast<float*>(moe_weights);
    moe_offsets_ = static_cast<std::uint32_t*>(moe_offsets);
    moe_rows_ = static_cast<std::uint32_t*>(moe_rows);
    moe_slot_of_pair_ = static_cast<std::uint32_t*>(moe_slots);
    moe_active_ = static_cast<std::uint32_t*>(moe_active);
  }
  inv_freq_ = static_cast<float*>(inv_freq);
  logits_ = static_cast<float*>(logits);
  argmax_ = static_cast<std::int32_t*>(argmax);
  if (fused_) argmax_partials_ = static_cast<ArgmaxPartial*>(argmax_partials);
  if (!fused_) qkv_ = nullptr;  // its piece is empty
  sampled_ = static_cast<std::int32_t*>(sampled);
  logprob_results_ = static_cast<LogprobResult*>(results);
  prompt_arrays_ = static_cast<std::uint32_t*>(prompt);
  adjustments_ = static_cast<LogitAdjustEntry*>(adjustments);
  token_masks_ = static_cast<std::uint32_t*>(token_masks);
  kv_scale_table_ = static_cast<float*>(kv_scale_table);
  calibration_max_ = static_cast<float*>(calibration);
  if (fp8) {
    xq_ = xq;
    xq_scales_ = static_cast<float*>(xq_scales);
  }
  KVVM_RETURN_IF_ERROR(kv_scales_changed());

  void* pinned = nullptr;
  KVVM_RETURN_IF_ERROR(
      cuda_call("cudaMallocHost", cudaMallocHost(&pinned, std::uint64_t{offsets_.words} * 4)));
  staging_ = static_cast<std::uint32_t*>(pinned);
  std::fill(staging_, staging_ + offsets_.words, 0u);
  KVVM_RETURN_IF_ERROR(cuda_call("cudaMallocHost", cudaMallocHost(&pinned, prompt_bytes)));
  prompt_staging_ = static_cast<std::uint32_t*>(pinned);
  KVVM_RETURN_IF_ERROR(cuda_call("cudaMallocHost", cudaMallocHost(&pinned, result_bytes)));
  logprob_host_ = static_cast<LogprobResult*>(pinned);
  KVVM_RETURN_IF_ERROR(cuda_call("cudaMallocHost", cudaMallocHost(&pinned, adjust_bytes)));
  adjust_staging_ = static_cast<LogitAdjustEntry*>(pinned);
  return Status::Ok();
}

// The decode workspace for the largest split any batch up to max_chunks can be planned into,
// at max_length = max_position_embeddings (what every step passes). The plan depends on the
// view's element type and head dim only, so stand-in views serve: one of the compute type and
// one of fp8 (whose kernel may keep more blocks resident, and split differently).
Status CudaModel::plan_decode_workspace() {
  std::size_t most = 0;
  for (const DType element : {compute_, DType::kFp8}) {
    KvView view;
    view.base = kBufferAlignment;
    view.slot_stride = view.layer_stride = view.kv_stride = view.head_stride = 16;
    view.token_stride = 16;
    view.element = element;
    view.element_bytes = element_bytes(element);
    view.head_dim = config().head_dim;
    DecodeParams params;
    params.view = view;
    params.activations = compute_;
    params.qo_heads = config().heads;
    params.kv_heads = config().kv_heads;
    params.q = params.out = q_;
    params.slots = params.lengths = arrays_;
    params.max_length = config().max_position_embeddings;
    for (std::uint32_t batch = 1; batch <= limits().max_chunks; ++batch) {
      params.batch = batch;
      Result<DecodePlan> plan = plan_decode_cuda(params);
      if (!plan.ok()) return plan.status().with_context("CUDA model: planning decode");
      most = std::max(most, plan->workspace_bytes);
    }
  }
  decode_workspace_bytes_ = most;
  if (most > 0) {
    KVVM_ASSIGN_OR_RETURN(void* workspace, device_alloc(most));
    decode_workspace_ = workspace;
    // The split's counters must start at zero (every decode leaves them zero); on the model's
    // stream, so the first decode is ordered after it.
    KVVM_RETURN_IF_ERROR(
        cuda_call("cudaMemsetAsync", cudaMemsetAsync(decode_workspace_, 0, most, stream_)));
  }
  return Status::Ok();
}

Status CudaModel::kv_scales_changed() {
  if (kv_scale_table_ == nullptr) return Status::Ok();  // allocate_buffers copies them
  const ModelConfig& c = config();
  const KvScales& scales = kv_scales();
  std::vector<float> table(std::size_t{2} * c.layers * c.kv_heads);
  for (std::uint32_t layer = 0; layer < c.layers; ++layer) {
    for (std::uint32_t head = 0; head < c.kv_heads; ++head) {
      const std::size_t at = std::size_t{layer} * c.kv_heads + head;
      table[at] = scales.k_of(layer, head);
      table[table.size() / 2 + at] = scales.v_of(layer, head);
    }
  }
  // From pageable memory: the call returns once the bytes are staged, so `table` may go.
  KVVM_RETURN_IF_ERROR(cuda_call("cudaSetDevice", cudaSetDevice(device_)));
  return cuda_call("cudaMemcpyAsync",
                   cudaMemcpyAsync(kv_scale_table_, table.data(), table.size() * sizeof(float),
                                   cudaMemcpyHostToDevice, stream_));
}

KvHeadScales CudaModel::head_scales(std::uint32_t layer) const {
  const std::uint64_t per_layer = config().kv_heads;
  const std::uint64_t v_first = std::uint64_t{config().layers} * per_layer;
  return {kv_scale_table_ + layer * per_layer, kv_scale_table_ + v_first + layer * per_layer};
}

WeightStats CudaModel::weight_stats() const {
  return weights_->stats(ring_ != nullptr ? ring_->copies() : 0);
}

CudaModel::~CudaModel() {
  (void)cudaSetDevice(device_);
  if (stream_ != nullptr) (void)cudaStreamSynchronize(stream_);
  release_decode_graphs();
  if (cublas_ != nullptr) (void)cublas_library().api.destroy(cublas_);
  for (void* pointer : allocations_) (void)cudaFree(pointer);
  for (void* pinned : {static_cast<void*>(staging_), static_cast<void*>(prompt_staging_),
                       static_cast<void*>(logprob_host_), static_cast<void*>(adjust_staging_)}) {
    if (pinned != nullptr) (void)cudaFreeHost(pinned);
  }
  if (own_stream_) (void)cudaStreamDestroy(stream_);
}

}  // namespace detail

Result<std::unique_ptr<Model>> make_cuda_model(const ModelConfig& config,
                                               const ModelWeights& weights,
                                               const CudaModelOptions& options) {
  return detail::CudaModel::create(config, weights, options);
}

}  // namespace kvvm::model
